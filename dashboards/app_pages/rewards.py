"""Rewards: shaped return and task reward per episode over time and per run; reward components stacked."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import data
from dashboards.filters import episode_filter
from halo_data.config import RewardWeights
from halo_data.schema import REWARD_COMPONENTS, reward_column

# Above this many episodes the time chart shows means per time bucket instead of one point per episode.
MAX_EPISODE_POINTS = 2000
TIME_BUCKETS = 200

COUNT_SQL = "SELECT count(*) AS n FROM episodes WHERE {where}"

POINTS_SQL = """
SELECT run_id, episode_id, task_id, coalesce(ended_at, started_at) AS time, shaped_return, task_reward
FROM episodes
WHERE {where}
ORDER BY time
"""

BUCKETS_SQL = """
WITH chosen AS (
    SELECT run_id, epoch(coalesce(ended_at, started_at)) AS t, shaped_return, task_reward
    FROM episodes
    WHERE {where} AND coalesce(ended_at, started_at) IS NOT NULL
),
span AS (SELECT min(t) AS lo, greatest(max(t) - min(t), 1) / $buckets AS width FROM chosen)
SELECT
    run_id,
    to_timestamp(lo + floor((t - lo) / width) * width) AS time,
    avg(shaped_return) AS shaped_return,
    avg(task_reward) AS task_reward,
    count(*) AS episodes
FROM chosen, span
GROUP BY ALL
ORDER BY time
"""

PER_RUN_SQL = """
SELECT
    run_id,
    count(*) AS episodes,
    avg(shaped_return) AS mean_shaped_return,
    avg(task_reward) AS mean_task_reward,
    avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
    {components}
FROM episodes
WHERE {where}
GROUP BY run_id
ORDER BY run_id
"""

st.title("Rewards")
snap = data.current_snapshot()
if data.require_steps(snap):
    chosen = episode_filter(snap, "rewards")
    where, params = chosen.where()
    n_episodes = int(snap.scalar(COUNT_SQL.format(where=where), params) or 0)
    if n_episodes == 0:
        st.info("No episode matches these filters.")
    else:
        st.subheader("Per episode over time")
        if n_episodes <= MAX_EPISODE_POINTS:
            over_time = snap.df(POINTS_SQL.format(where=where), params)
            mark = alt.Chart(over_time).mark_circle(size=40, opacity=0.7)
            tooltip = ["run_id", "task_id", "episode_id", "time", "shaped_return", "task_reward"]
        else:
            over_time = snap.df(BUCKETS_SQL.format(where=where), {**params, "buckets": float(TIME_BUCKETS)})
            mark = alt.Chart(over_time).mark_line(point=True)
            tooltip = ["run_id", "time", "episodes", "shaped_return", "task_reward"]
            st.caption(f"{n_episodes:,} episodes: means per time bucket ({TIME_BUCKETS} buckets over the span).")
        left, right = st.columns(2)
        for column, title, where_col in (("shaped_return", "Shaped return", left), ("task_reward", "Task reward", right)):
            where_col.altair_chart(
                mark.encode(
                    x=alt.X("time:T", title="time"),
                    y=alt.Y(f"{column}:Q", title=title.lower()),
                    color=alt.Color("run_id:N", title="run"),
                    tooltip=tooltip,
                ).properties(title=title),
                width="stretch",
            )

        weights = RewardWeights().as_dict()
        components_sql = ",\n    ".join(f"avg({reward_column(c)}) * {weights[c]!r} AS {c}" for c in REWARD_COMPONENTS)
        per_run = snap.df(PER_RUN_SQL.format(where=where, components=components_sql), params)
        st.subheader("Per run")
        st.dataframe(per_run, hide_index=True, width="stretch")
        means = per_run.melt(id_vars=["run_id"], value_vars=["mean_shaped_return", "mean_task_reward"], var_name="reward", value_name="mean")
        left, right = st.columns(2)
        left.altair_chart(
            alt.Chart(means).mark_bar().encode(
                x=alt.X("run_id:N", title="run"), xOffset="reward:N", y=alt.Y("mean:Q", title="mean per episode"),
                color=alt.Color("reward:N"), tooltip=["run_id", "reward", "mean"],
            ).properties(title="Mean shaped return and task reward"),
            width="stretch",
        )
        stacked = per_run.melt(id_vars=["run_id"], value_vars=list(REWARD_COMPONENTS), var_name="component", value_name="weighted_mean")
        right.altair_chart(
            alt.Chart(stacked).mark_bar().encode(
                x=alt.X("run_id:N", title="run"),
                y=alt.Y("weighted_mean:Q", title="weighted component, mean per episode", stack="zero"),
                color=alt.Color("component:N", sort=list(REWARD_COMPONENTS)),
                tooltip=["run_id", "component", alt.Tooltip("weighted_mean:Q", format=".3f")],
            ).properties(title="Reward components (stacked; they sum to the shaped return)"),
            width="stretch",
        )
        st.caption("Weights: " + ", ".join(f"{k} {v:g}" for k, v in weights.items()) + " (halo_data.config.RewardWeights).")
