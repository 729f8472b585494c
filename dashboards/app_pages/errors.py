"""Errors: episodes that ended in an error or took an invalid action, grouped by message; links into Replay."""

from __future__ import annotations

import streamlit as st

from dashboards import data

MAX_GROUPS = 100
EXAMPLES_PER_GROUP = 10

# Messages are grouped by their first line (at most 200 characters): tracebacks and
# long browser errors differ below it in ways that do not change the cause.
ERRORS_SQL = """
WITH problems AS (
    SELECT 'episode error' AS kind, any_value(error) AS message, run_id, episode_id,
           any_value(task_id) AS task_id, max(step_idx) AS step_idx
    FROM steps
    WHERE error IS NOT NULL AND {where}
    GROUP BY run_id, episode_id
    UNION ALL
    SELECT
        CASE WHEN parse_error IS NOT NULL THEN 'parse error' ELSE 'invalid action' END AS kind,
        coalesce(parse_error, action_error, 'action not valid') AS message,
        run_id, episode_id, task_id, step_idx
    FROM steps
    WHERE (parse_error IS NOT NULL OR action_error IS NOT NULL OR action_valid = false) AND {where}
),
keyed AS (
    SELECT *, left(split_part(message, chr(10), 1), 200) AS message_key FROM problems
)
SELECT
    kind,
    message_key AS message,
    count(DISTINCT episode_id) AS episodes,
    count(*) AS occurrences,
    count(DISTINCT run_id) AS runs,
    count(DISTINCT task_id) AS tasks,
    list({{'run_id': run_id, 'episode_id': episode_id, 'task_id': task_id, 'step_idx': step_idx}}
         ORDER BY run_id, episode_id, step_idx)[1:$examples] AS examples
FROM keyed
GROUP BY kind, message_key
ORDER BY episodes DESC, occurrences DESC, kind, message
LIMIT $max_groups
"""

RUNS_SQL = "SELECT DISTINCT run_id FROM steps ORDER BY run_id"

st.title("Errors")
snap = data.current_snapshot()
if data.require_steps(snap):
    runs = st.multiselect("Runs", list(snap.df(RUNS_SQL).run_id), key="errors_runs", placeholder="all runs")
    where, params = ("list_contains($runs, run_id)", {"runs": runs}) if runs else ("true", {})
    groups = snap.df(ERRORS_SQL.format(where=where), {**params, "examples": EXAMPLES_PER_GROUP, "max_groups": MAX_GROUPS})
    if groups.empty:
        st.success("No episode ended in an error and no action was invalid.")
    else:
        st.dataframe(groups.drop(columns=["examples"]), hide_index=True, width="stretch")
        st.caption(f"Grouped by the message's first line; the {MAX_GROUPS} largest groups, {EXAMPLES_PER_GROUP} episodes each.")
        for group in groups.itertuples():
            with st.expander(f"{group.kind} · {group.episodes} episodes · {group.message}"):
                for example in group.examples:
                    step = int(example["step_idx"]) if example["step_idx"] is not None else 0
                    st.page_link(
                        "app_pages/replay.py",
                        label=f"{example['run_id']} · {example['task_id']} · episode {example['episode_id']} · step {step}",
                        query_params={"run": example["run_id"], "episode": example["episode_id"], "step": str(step)},
                    )
