"""Overview: every run with its episode statistics, the eval matrix (mode × site), and each mode's cost."""

from __future__ import annotations

import os

import altair as alt
import streamlit as st

from dashboards import data

RUNS_SQL = """
WITH per_run AS (
    SELECT
        run_id,
        any_value(env) AS env,
        count(DISTINCT task_id) AS tasks,
        count(*) AS episodes,
        avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
        avg(shaped_return) AS mean_shaped_return,
        min(started_at) AS first_episode_at
    FROM episodes
    GROUP BY run_id
)
SELECT
    coalesce(r.run_id, p.run_id) AS run_id,
    r.kind,
    r.mode,
    r.model,
    r.adapter,
    coalesce(r.env, p.env) AS env,
    p.tasks,
    coalesce(p.episodes, 0) AS episodes,
    p.success_rate,
    p.mean_shaped_return,
    coalesce(r.started_at, p.first_episode_at) AS started,
    r.status
FROM runs AS r
FULL OUTER JOIN per_run AS p ON r.run_id = p.run_id
ORDER BY started DESC NULLS LAST, run_id
"""

EVAL_MATRIX_SQL = "SELECT * FROM eval_matrix ORDER BY mode, site, split"

COST_SQL = """
SELECT
    mode,
    count(*) AS episodes,
    avg(n_model_calls) AS model_calls_per_episode,
    avg(prompt_tokens) AS tokens_in_per_episode,
    avg(completion_tokens) AS tokens_out_per_episode,
    avg(cost_usd) AS cost_usd_per_episode,
    sum(n_manager_calls)::DOUBLE / greatest(sum(n_actions), 1) AS manager_call_rate,
    sum(n_cache_hits)::DOUBLE / greatest(sum(n_actions), 1) AS cache_hit_rate
FROM episodes
GROUP BY mode
ORDER BY mode
"""

MODEL_COST_SQL = """
SELECT mode, model, role, sum(calls) AS calls, sum(prompt_tokens) AS tokens_in, sum(completion_tokens) AS tokens_out,
       sum(cost_usd) AS cost_usd, count(DISTINCT episode_id) AS episodes
FROM episode_costs
GROUP BY mode, model, role
ORDER BY mode, role, model
"""

TOTALS_SQL = """
SELECT
    count(*) AS steps,
    count(DISTINCT episode_id) AS episodes,
    count(DISTINCT run_id) AS runs
FROM steps
"""

# Beyond this many runs the page summarises the newest of them, read from their files alone: its first render
# costs the same in a lake of a thousand runs as in one of fifty (the totals of steps and runs come from the log).
NEWEST_RUNS = int(os.environ.get("HALO_DASHBOARD_OVERVIEW_RUNS", "50"))


def summarised_runs(snap: data.Snapshot) -> tuple[list[str] | None, int]:
    """(the runs the page summarises, None for all; how many runs the lake has)."""
    with_steps = snap.steps_by_run()
    newest = snap.run_starts()["run_id"].tolist()
    # runs with steps but no runs row (an import, a run killed before its row) sort after the listed ones
    newest += sorted(set(with_steps["run_id"]) - set(newest))
    if len(newest) <= NEWEST_RUNS:
        return None, len(newest)
    return newest[:NEWEST_RUNS], len(newest)


st.title("Overview")
snap = data.current_snapshot()
if snap is not None:
    scope, n_runs = summarised_runs(snap)
    runs = snap.df(RUNS_SQL, runs=scope)
    if data.require_steps(snap):
        c1, c2, c3 = st.columns(3)
        if scope is None:
            totals = snap.df(TOTALS_SQL).iloc[0]
            c1.metric("Runs with episodes", f"{int(totals['runs']):,}")
            c2.metric("Episodes", f"{int(totals['episodes']):,}")
            c3.metric("Steps", f"{int(totals['steps']):,}")
        else:
            with_steps = snap.steps_by_run()
            shown = snap.df(TOTALS_SQL, runs=scope).iloc[0]
            c1.metric("Runs with episodes", f"{int((with_steps['steps'] > 0).sum()):,}")
            c2.metric(f"Episodes (newest {len(scope)} runs)", f"{int(shown['episodes']):,}")
            c3.metric("Steps", f"{int(with_steps['steps'].sum()):,}")
            st.caption(f"The tables below summarise the newest {len(scope)} of the lake's {n_runs:,} runs "
                       "(HALO_DASHBOARD_OVERVIEW_RUNS sets how many); the SQL page reads them all.")
    if not runs.empty:
        st.subheader("Runs")
        st.dataframe(
            runs,
            hide_index=True,
            width="stretch",
            column_config={
                "success_rate": st.column_config.ProgressColumn("success rate", format="percent", min_value=0, max_value=1),
                "mean_shaped_return": st.column_config.NumberColumn("mean shaped return", format="%.3f"),
                "started": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm"),
            },
        )
    matrix = snap.df(EVAL_MATRIX_SQL, runs=scope) if not runs.empty else None
    if matrix is not None and not matrix.empty:
        st.subheader("Eval matrix (mode × site)")
        st.dataframe(matrix, hide_index=True, width="stretch")
        base = alt.Chart(matrix).encode(
            x=alt.X("site:N", title="site"),
            xOffset="mode:N",
            color=alt.Color("mode:N", title="mode"),
            tooltip=["mode", "site", "split", "n_episodes", "success_rate", "median_steps"],
        )
        left, right = st.columns(2)
        left.altair_chart(
            base.mark_bar().encode(y=alt.Y("success_rate:Q", title="success rate", scale=alt.Scale(domain=[0, 1]))).properties(title="Success rate"),
            width="stretch",
        )
        right.altair_chart(
            base.mark_bar().encode(y=alt.Y("median_steps:Q", title="median steps")).properties(title="Median steps"),
            width="stretch",
        )
    cost = snap.df(COST_SQL, runs=scope) if not runs.empty else None
    if cost is not None and not cost.empty:
        st.subheader("Cost per mode")
        st.caption("Tokens as the endpoints reported them (usage); cost from the price table at collection time "
                   "(halo_agent/configs/prices.yaml). Rates are per action.")
        st.dataframe(
            cost,
            hide_index=True,
            width="stretch",
            column_config={
                "cost_usd_per_episode": st.column_config.NumberColumn("cost per episode (USD)", format="%.5f"),
                "manager_call_rate": st.column_config.ProgressColumn("manager call rate", format="percent", min_value=0, max_value=1),
                "cache_hit_rate": st.column_config.ProgressColumn("cache hit rate", format="percent", min_value=0, max_value=1),
            },
        )
        per_model = snap.df(MODEL_COST_SQL, runs=scope)
        if not per_model.empty:
            st.markdown("Tokens in and out per model")
            st.dataframe(per_model, hide_index=True, width="stretch")
