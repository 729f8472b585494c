"""Experiments: a pre-registered learning experiment's evaluation cells (bench/protocols/, `python -m bench learning`)
read from its lake — success per arm and split with the registered intervals, per task and training seed, and the
held-out curve."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards import data
from halo_data.stats import mean_interval, wilson

# Evaluation runs are named PREFIX-eval-ARM-sSEED-SPLIT; online_grpo's curve runs PREFIX-online_grpo-sSEED-eval-vV-sTASKSEED.
CELLS_SQL = r"""
SELECT
    regexp_extract(run_id, '^(.+)-eval-(.+)-s(\d+)-(test_seeds|heldout_tasks|dev)$', 1) AS experiment,
    regexp_extract(run_id, '^(.+)-eval-(.+)-s(\d+)-(test_seeds|heldout_tasks|dev)$', 2) AS arm,
    CAST(regexp_extract(run_id, '^(.+)-eval-(.+)-s(\d+)-(test_seeds|heldout_tasks|dev)$', 3) AS INTEGER) AS training_seed,
    regexp_extract(run_id, '^(.+)-eval-(.+)-s(\d+)-(test_seeds|heldout_tasks|dev)$', 4) AS split,
    task_id,
    count(*) AS attempts,
    sum(CASE WHEN success THEN 1 ELSE 0 END) AS successes,
    avg(n_steps) AS mean_steps
FROM episodes
WHERE regexp_matches(run_id, '^.+-eval-.+-s\d+-(test_seeds|heldout_tasks|dev)$')
GROUP BY ALL
ORDER BY ALL
"""

CURVE_SQL = r"""
WITH evals AS (
    SELECT
        regexp_extract(run_id, '^(.+)-online_grpo-s(\d+)-eval-v(\d+)-s\d+$', 1) AS experiment,
        regexp_extract(run_id, '^(.+)-online_grpo-s(\d+)-eval-v(\d+)-s\d+$', 1) || '-online_grpo-s'
            || regexp_extract(run_id, '^(.+)-online_grpo-s(\d+)-eval-v(\d+)-s\d+$', 2) AS online_run,
        CAST(regexp_extract(run_id, '^(.+)-online_grpo-s(\d+)-eval-v(\d+)-s\d+$', 3) AS INTEGER) AS version,
        success
    FROM episodes
    WHERE regexp_matches(run_id, '^.+-online_grpo-s\d+-eval-v\d+-s\d+$')
),
rollouts AS (
    SELECT regexp_extract(run_id, '^(.+)-k(\d+)$', 1) AS online_run,
           CAST(regexp_extract(run_id, '^(.+)-k(\d+)$', 2) AS INTEGER) AS iteration,
           sum(n_steps) AS steps
    FROM episodes WHERE regexp_matches(run_id, '^.+-online_grpo-s\d+-k\d+$')
    GROUP BY ALL
)
SELECT e.experiment, e.online_run, e.version,
       -- version v was trained on iterations 0 .. v-1 (every update made; the export reads the exact record)
       (SELECT coalesce(sum(r.steps), 0) FROM rollouts r WHERE r.online_run = e.online_run AND r.iteration < e.version) AS env_steps,
       count(*) AS attempts, sum(CASE WHEN e.success THEN 1 ELSE 0 END) AS successes
FROM evals e
GROUP BY ALL
ORDER BY ALL
"""


def arm_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per experiment, split and arm: seeds, attempts, the mean over seeds with its t interval, the pooled rate with
    its Wilson interval (the protocol's statistics)."""
    rows = []
    for (experiment, split, arm), by_task in cells.groupby(["experiment", "split", "arm"], sort=True):
        g = by_task.groupby("training_seed")[["successes", "attempts"]].sum()
        s, n = int(g.successes.sum()), int(g.attempts.sum())
        m, lo, hi = mean_interval(list(g.successes / g.attempts))
        wl, wh = wilson(s, n)
        rows.append({"experiment": experiment, "split": split, "arm": arm, "training seeds": len(g), "attempts": n,
                     "mean over seeds %": 100 * m, "t low": None if lo is None else 100 * lo,
                     "t high": None if hi is None else 100 * hi, "pooled %": 100 * s / n, "Wilson low": 100 * wl,
                     "Wilson high": 100 * wh})
    return pd.DataFrame(rows)


def task_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Success % per experiment, split and task (rows) and per arm's training seed (columns): where arms or seeds
    differ, which tasks make the difference."""
    table = cells.assign(column=cells.arm + " s" + cells.training_seed.astype(str),
                         success=100 * cells.successes / cells.attempts)
    return table.pivot_table(index=["experiment", "split", "task_id"], columns="column", values="success").reset_index()


st.title("Experiments")
snap = data.current_snapshot()
if data.require_steps(snap):
    cells = snap.df(CELLS_SQL)
    if cells.empty:
        st.info("No evaluation runs of a learning experiment in this lake (run ids PREFIX-eval-ARM-sSEED-SPLIT, "
                "as `python -m bench learning run` names them). Point the dashboard at runs/learning-v1/lake.")
    else:
        st.caption("Success per arm (%), 95% intervals: t over training seeds, Wilson over the pooled attempts.")
        st.dataframe(arm_table(cells), hide_index=True, width="stretch")
        st.caption("Success per task and training seed (%).")
        st.dataframe(task_table(cells), hide_index=True, width="stretch")
        with st.expander("Every cell, by task"):
            st.dataframe(cells, hide_index=True, width="stretch")
    curve = snap.df(CURVE_SQL)
    if not curve.empty:
        curve["success %"] = 100 * curve.successes / curve.attempts
        st.subheader("online_grpo on the held-out tasks' dev seeds")
        st.altair_chart(alt.Chart(curve).mark_line(point=True).encode(
            x=alt.X("env_steps:Q", title="environment steps"), y=alt.Y("success %:Q", scale=alt.Scale(domain=[0, 100])),
            color="online_run:N", tooltip=["online_run", "version", "env_steps", "attempts", "success %"]), width="stretch")
