"""Compare: two runs or two modes side by side on the tasks both attempted, with per-task differences."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import data

DIMENSIONS = {"run": "run_id", "mode": "mode"}

PER_TASK_SQL = """
WITH per_task AS (
    SELECT
        {column} AS side,
        task_id,
        count(*) AS episodes,
        avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
        avg(coalesce(n_steps, n_step_rows)) AS mean_steps,
        avg(shaped_return) AS mean_shaped_return
    FROM episodes
    WHERE {column} IN ($a, $b)
    GROUP BY ALL
),
a AS (SELECT * FROM per_task WHERE side = $a),
b AS (SELECT * FROM per_task WHERE side = $b)
SELECT
    task_id,
    a.episodes AS episodes_a,
    b.episodes AS episodes_b,
    a.success_rate AS success_a,
    b.success_rate AS success_b,
    b.success_rate - a.success_rate AS success_diff,
    a.mean_steps AS steps_a,
    b.mean_steps AS steps_b,
    b.mean_steps - a.mean_steps AS steps_diff,
    a.mean_shaped_return AS reward_a,
    b.mean_shaped_return AS reward_b,
    b.mean_shaped_return - a.mean_shaped_return AS reward_diff
FROM a JOIN b USING (task_id)
ORDER BY abs(success_diff) DESC, abs(reward_diff) DESC, task_id
"""

OPTIONS_SQL = "SELECT DISTINCT {column} AS value FROM steps WHERE {column} IS NOT NULL ORDER BY 1"

st.title("Compare")
snap = data.current_snapshot()
if data.require_steps(snap):
    dimension = st.radio("Compare", list(DIMENSIONS), horizontal=True, key="compare_dimension")
    column = DIMENSIONS[dimension]
    options = list(snap.df(OPTIONS_SQL.format(column=column)).value)
    if len(options) < 2:
        st.info(f"The lake has {len(options)} {dimension}(s) with episodes: comparing needs two.")
    else:
        left, right = st.columns(2)
        side_a = left.selectbox(f"A ({dimension})", options, index=0, key=f"compare_a_{dimension}")
        side_b = right.selectbox(f"B ({dimension})", options, index=1, key=f"compare_b_{dimension}")
        if side_a == side_b:
            st.info("Pick two different sides.")
        else:
            per_task = snap.df(PER_TASK_SQL.format(column=column), {"a": side_a, "b": side_b})
            if per_task.empty:
                st.info(f"{side_a} and {side_b} share no task.")
            else:
                weights = per_task.episodes_a + per_task.episodes_b
                c1, c2, c3, c4 = st.columns(4)
                c1.metric("Common tasks", f"{len(per_task)}")
                c2.metric("Success rate (B)", f"{per_task.success_b.mean():.1%}", delta=f"{per_task.success_diff.mean():+.1%} vs A")
                c3.metric("Mean steps (B)", f"{per_task.steps_b.mean():.1f}", delta=f"{per_task.steps_diff.mean():+.1f} vs A", delta_color="inverse")
                c4.metric("Shaped return (B)", f"{per_task.reward_b.mean():.3f}", delta=f"{per_task.reward_diff.mean():+.3f} vs A")
                st.caption(f"Means over the {len(per_task)} tasks both sides attempted ({int(weights.sum()):,} episodes), each task weighted equally.")
                st.subheader("Per task (B − A)")
                st.dataframe(per_task, hide_index=True, width="stretch")
                top = per_task.head(40)
                st.altair_chart(
                    alt.Chart(top).mark_bar().encode(
                        x=alt.X("success_diff:Q", title=f"success rate: {side_b} − {side_a}"),
                        y=alt.Y("task_id:N", sort="-x", title="task"),
                        color=alt.condition("datum.success_diff >= 0", alt.value("#2a9d8f"), alt.value("#e63946")),
                        tooltip=["task_id", "success_a", "success_b", "steps_a", "steps_b", "reward_a", "reward_b"],
                    ),
                    width="stretch",
                )
