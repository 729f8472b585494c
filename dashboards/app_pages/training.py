"""Training: metric curves from train_metrics per training run, each run's lineage, and online runs per policy_version,
with what each of their updates did per iteration (rows trained, displacement, KL, entropy, spread, seconds).

Online runs (``halo-train online-grpo``) log one row per metric and iteration, with the iteration's
``policy_version`` among them; their curves are drawn against it, and a run whose
``frac_reward_zero_std`` stays above ``STALL_ZERO_STD`` for its last ``STALL_ITERATIONS`` iterations is
flagged: most of its groups have no reward spread, so GRPO gets almost no signal and learning stalls.
"""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import streamlit as st

from dashboards import data
from halo_data.lake import LakeError

# Metrics shown first when a run logged them (TRL's names).
PREFERRED_METRICS = ("loss", "frac_reward_zero_std", "learning_rate", "reward", "rewards/mean", "rewards/chosen",
                     "rewards/rejected", "rewards/margins", "rewards/accuracies", "grad_norm")
MAX_POINTS_PER_CURVE = 1000

TRAIN_RUNS_SQL = """
SELECT run_id, any_value(started_at) AS started_at FROM (
    SELECT run_id, started_at FROM runs WHERE kind = 'train'
    UNION ALL
    SELECT DISTINCT run_id, NULL AS started_at FROM train_metrics
)
GROUP BY run_id
ORDER BY started_at DESC NULLS LAST, run_id
"""

METRICS_SQL = "SELECT DISTINCT metric FROM train_metrics WHERE list_contains($runs, run_id) ORDER BY metric"

# Long runs log many steps: average consecutive steps so every curve has at most MAX_POINTS_PER_CURVE points.
CURVES_SQL = """
WITH chosen AS (
    SELECT run_id, metric, step, value
    FROM train_metrics
    WHERE list_contains($runs, run_id) AND list_contains($metrics, metric)
),
width AS (
    SELECT run_id, metric, greatest(1, ceil((max(step) - min(step) + 1) / $max_points)) AS every
    FROM chosen GROUP BY run_id, metric
)
SELECT c.run_id, c.metric, min(c.step) AS step, avg(c.value) AS value
FROM chosen AS c JOIN width AS w USING (run_id, metric)
GROUP BY c.run_id, c.metric, c.step // w.every
ORDER BY c.run_id, c.metric, step
"""

RUN_SQL = "SELECT * FROM runs WHERE run_id = $run"

# Each chosen metric of an online run against the policy_version logged at the same step (iteration).
ONLINE_SQL = """
WITH versions AS (
    SELECT run_id, step, value AS policy_version
    FROM train_metrics
    WHERE metric = 'policy_version' AND list_contains($runs, run_id)
)
SELECT m.run_id, m.step AS iteration, v.policy_version, m.metric, m.value
FROM train_metrics AS m
JOIN versions AS v USING (run_id, step)
WHERE m.metric != 'policy_version'
ORDER BY m.run_id, m.metric, v.policy_version
"""

STALL_ZERO_STD = 0.5
STALL_ITERATIONS = 3
ONLINE_METRICS = ("success_rate/heldout", "success_rate/train", "rewards/mean", "frac_reward_zero_std")
# What each online update did (halo_train.learner), one chart per panel, one line per run and metric, per iteration.
UPDATE_PANELS = {
    "rows: produced by the iteration, trained by its update": ("rows_produced", "rows_trained"),
    "adapter displacement: this update, and from the base": ("displacement_from_previous", "displacement_from_base"),
    "approx KL(new || old) and clip fraction": ("approx_kl", "clip_ratio"),
    "entropy of the sampled distribution": ("entropy",),
    "groups with spread: in success, in shaping only, anchor states": (
        "groups_success_spread", "groups_shaping_spread_only", "anchor_groups_with_spread"),
    "share of the advantage from the step term": ("step_advantage_share",),
    "update seconds: load, train, measure, save, reload": (
        "update_load_seconds", "update_train_seconds", "update_measure_seconds", "update_save_seconds", "reload_seconds"),
}


def update_panels(online: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Title -> the rows of its metrics that the runs logged (panels with none are left out)."""
    out = {}
    for title, metrics in UPDATE_PANELS.items():
        rows = online[online.metric.isin(metrics)]
        if not rows.empty:
            out[title] = rows
    return out


def stalled_runs(online: pd.DataFrame, threshold: float = STALL_ZERO_STD, window: int = STALL_ITERATIONS) -> dict[str, list[float]]:
    """Runs whose last ``window`` iterations all have frac_reward_zero_std above ``threshold``: run -> those values."""
    zero_std = online[online.metric == "frac_reward_zero_std"].sort_values(["run_id", "policy_version"])
    stalled = {}
    for run_id, rows in zero_std.groupby("run_id", sort=True):
        last = [float(v) for v in rows.value.tail(window)]
        if len(last) == window and all(v > threshold for v in last):
            stalled[run_id] = last
    return stalled


def _online(snap: data.Snapshot, run_ids: list[str]) -> None:
    online = snap.df(ONLINE_SQL, {"runs": run_ids})
    if online.empty:
        return
    st.subheader("Online runs, per policy_version")
    for run_id, values in stalled_runs(online).items():
        st.warning(
            f"{run_id}: frac_reward_zero_std stayed above {STALL_ZERO_STD} for its last {STALL_ITERATIONS} iterations "
            f"({', '.join(f'{v:.2f}' for v in values)}): most groups have no reward spread, so learning stalls. "
            "Sample more attempts per task, at a higher temperature, or on harder task seeds."
        )
    shown = [m for m in ONLINE_METRICS if m in set(online.metric)]
    columns = st.columns(2)
    for i, metric in enumerate(shown):
        columns[i % 2].altair_chart(
            alt.Chart(online[online.metric == metric]).mark_line(point=True).encode(
                x=alt.X("policy_version:Q", title="policy_version"), y=alt.Y("value:Q", title=metric),
                color=alt.Color("run_id:N", title="run"), tooltip=["run_id", "policy_version", "value"],
            ).properties(title=metric),
            width="stretch",
        )
    _updates(online)


def _updates(online: pd.DataFrame) -> None:
    panels = update_panels(online)
    if not panels:
        return
    st.subheader("What each update did, per iteration")
    columns = st.columns(2)
    for i, (title, rows) in enumerate(panels.items()):
        columns[i % 2].altair_chart(
            alt.Chart(rows).mark_line(point=True).encode(
                x=alt.X("iteration:Q", title="iteration"), y=alt.Y("value:Q", title=None),
                color=alt.Color("run_id:N", title="run"), strokeDash=alt.StrokeDash("metric:N", title="metric"),
                tooltip=["run_id", "iteration", "metric", "value"],
            ).properties(title=title),
            width="stretch",
        )


def _default_metrics(metrics: list[str]) -> list[str]:
    chosen = [m for m in PREFERRED_METRICS if m in metrics]
    chosen += [m for m in metrics if m.startswith("rewards/") and m not in chosen]
    return chosen[:6] or metrics[:4]


def _lineage(snap: data.Snapshot, run_id: str) -> None:
    info = snap.df(RUN_SQL, {"run": run_id})
    if info.empty:
        st.caption(f"{run_id}: no row in `runs` (metrics only).")
        return
    row = info.iloc[0]
    fields = {k: row.get(k) for k in ("job_type", "mode", "base_model", "source_view", "output_dir", "status", "started_at", "ended_at")}
    st.dataframe(pd.DataFrame([{k: (None if pd.isna(v) else str(v)) for k, v in fields.items()}]), hide_index=True, width="stretch")
    lineage_text = row.get("lineage")
    if not isinstance(lineage_text, str) or not lineage_text:
        st.caption("No lineage recorded (table versions read).")
        return
    try:
        lineage = json.loads(lineage_text)
    except ValueError:
        st.caption(f"Lineage is not JSON: {lineage_text[:200]}")
        return
    st.markdown("Table versions it read: " + ", ".join(f"`{t}` v{v}" for t, v in sorted(lineage.items())))
    steps_version = lineage.get("steps")
    if steps_version is not None:
        try:
            runs = data.runs_in_steps_at(snap.root, int(steps_version))
        except LakeError as e:
            st.caption(f"steps v{steps_version} cannot be read any more ({e}).")
            return
        st.markdown(f"Runs in `steps` v{steps_version} (what it could train on):")
        st.dataframe(runs, hide_index=True, width="stretch")


st.title("Training")
snap = data.current_snapshot()
if snap is not None:
    runs = snap.df(TRAIN_RUNS_SQL)
    if runs.empty:
        st.info(
            f"No training runs in the lake at {snap.root} yet. `halo-train bc|dpo|grpo --lake {snap.root} ...` "
            "writes its metrics to train_metrics and its lineage to runs; they show here."
        )
    else:
        run_ids = list(runs.run_id)
        chosen_runs = st.multiselect("Training runs", run_ids, default=run_ids[:3], key="training_runs")
        if chosen_runs:
            metrics = list(snap.df(METRICS_SQL, {"runs": chosen_runs}).metric)
            chosen_metrics = st.multiselect("Metrics", metrics, default=_default_metrics(metrics), key="training_metrics")
            if chosen_metrics:
                curves = snap.df(CURVES_SQL, {"runs": chosen_runs, "metrics": chosen_metrics, "max_points": float(MAX_POINTS_PER_CURVE)})
                columns = st.columns(2)
                for i, metric in enumerate(chosen_metrics):
                    columns[i % 2].altair_chart(
                        alt.Chart(curves[curves.metric == metric]).mark_line().encode(
                            x=alt.X("step:Q"), y=alt.Y("value:Q", title=metric),
                            color=alt.Color("run_id:N", title="run"), tooltip=["run_id", "step", "value"],
                        ).properties(title=metric),
                        width="stretch",
                    )
            _online(snap, chosen_runs)
            st.subheader("Lineage")
            for run_id in chosen_runs:
                st.markdown(f"**{run_id}**")
                _lineage(snap, run_id)
