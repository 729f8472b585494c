"""GRPO health: frac_reward_zero_std per run and per policy_version, group reward std, trainable groups.

A group is the attempts of one task with the same task_seed and policy_version (the
episode groups of `grpo_groups`). A group whose rewards are all equal gives GRPO no
advantage to learn from; when most groups are like that, learning stalls. Runs that
sample candidates at each visited state (`online-grpo --group-by state`) are read
through their per-state groups (`state_groups`), the groups such an update trains on.
"""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import data

STALL_FRACTION = 0.5
HISTOGRAM_BINS = 30

REWARD_STATS_SQL = "SELECT * FROM reward_stats WHERE scope = $scope ORDER BY run_id, policy_version"

# The same groups and zero-std rule as grpo_groups' episode level, aggregated here
# without materialising the step rows that view also produces.
GROUPS_SQL = """
WITH groups AS (
    SELECT
        coalesce(stddev_samp(shaped_return), 0) AS group_std,
        count(*) AS group_size,
        (max(shaped_return) - min(shaped_return)) <= 1e-9 AS zero_std
    FROM episodes
    WHERE error IS NULL
    GROUP BY task_id, task_seed, policy_version
)
SELECT
    count(*) AS n_groups,
    count(*) FILTER (WHERE NOT zero_std) AS n_trainable_groups,
    count(*) FILTER (WHERE group_size = 1) AS n_singleton_groups,
    avg(CASE WHEN zero_std THEN 1.0 ELSE 0.0 END) AS frac_reward_zero_std,
    max(group_std) AS max_std
FROM groups
"""

HISTOGRAM_SQL = """
WITH groups AS (
    SELECT coalesce(stddev_samp(shaped_return), 0) AS group_std
    FROM episodes
    WHERE error IS NULL
    GROUP BY task_id, task_seed, policy_version
)
SELECT
    least(floor(group_std / $width), $bins - 1) * $width AS std_from,
    least(floor(group_std / $width), $bins - 1) * $width + $width AS std_to,
    count(*) AS groups
FROM groups
GROUP BY ALL
ORDER BY std_from
"""

# One row per policy_version of each run that sampled candidates: its per-state groups (states that
# reproduced) and the states that did not (left out of state_groups, never trained on).
STATE_GROUPS_SQL = """
WITH groups AS (
    SELECT group_key, any_value(run_id) AS run_id, any_value(policy_version) AS policy_version,
           any_value(zero_std) AS zero_std, any_value(group_size) AS group_size
    FROM state_groups
    GROUP BY group_key
),
unreproducible AS (
    SELECT run_id, policy_version, count(DISTINCT (episode_id, step_idx)) AS n_unreproducible_states
    FROM candidates
    WHERE score_source = 'unreproducible'
    GROUP BY ALL
),
per_version AS (
    SELECT
        run_id,
        policy_version,
        count(*) AS n_state_groups,
        count(*) FILTER (WHERE NOT zero_std) AS n_trainable_state_groups,
        avg(CASE WHEN zero_std THEN 1.0 ELSE 0.0 END) AS frac_reward_zero_std,
        avg(group_size) AS mean_group_size
    FROM groups
    GROUP BY ALL
)
SELECT
    coalesce(p.run_id, u.run_id) AS run_id,
    coalesce(p.policy_version, u.policy_version) AS policy_version,
    coalesce(p.n_state_groups, 0) AS n_state_groups,
    coalesce(p.n_trainable_state_groups, 0) AS n_trainable_state_groups,
    p.frac_reward_zero_std,
    p.mean_group_size,
    coalesce(u.n_unreproducible_states, 0) AS n_unreproducible_states
FROM per_version AS p
FULL JOIN unreproducible AS u ON p.run_id = u.run_id AND p.policy_version IS NOT DISTINCT FROM u.policy_version
ORDER BY try_cast(coalesce(p.policy_version, u.policy_version) AS BIGINT) NULLS LAST, 2, 1
"""

STEP_GROUPS_SQL = """
SELECT
    count(DISTINCT group_key) AS n_anchor_groups,
    count(DISTINCT group_key) FILTER (WHERE NOT zero_std) AS n_trainable_anchor_groups
FROM grpo_groups
WHERE level = 'step' AND group_size > 1
"""


def _metric_row(*metrics: tuple[str, ...]) -> None:
    """One row of st.metric: (label, value[, help]) each."""
    for column, (label, value, *help_) in zip(st.columns(len(metrics)), metrics):
        column.metric(label, value, help=help_[0] if help_ else None)


def _state_group_section(groups) -> None:
    """Per-state groups (candidates sampled and scored at one visited state), per run and policy_version."""
    n = int(groups["n_state_groups"].sum())
    trainable = int(groups["n_trainable_state_groups"].sum())
    frac = 1.0 - trainable / n if n else 1.0
    st.subheader("Per-state groups (candidates)")
    _metric_row(("frac_reward_zero_std (state groups)", f"{frac:.1%}"), ("State groups", f"{n:,}"),
                ("Trainable state groups", f"{trainable:,}"),
                ("Unreproducible states", f"{int(groups['n_unreproducible_states'].sum()):,}",
                 "States whose replayed action prefix did not reach the stored state_hash: left out, never trained on."))
    if frac > STALL_FRACTION:
        st.warning(
            f"{frac:.0%} of the state groups have zero reward std: their candidates all scored the same, so GRPO "
            "learns nothing from them. Sample more candidates per state (--candidates-per-state), offer each of the "
            "page's choices (--cover-choices), or use denser rewards."
        )
    left, right = st.columns([3, 2])
    left.dataframe(groups, hide_index=True, width="stretch")
    right.altair_chart(
        alt.Chart(groups.dropna(subset=["frac_reward_zero_std"])).mark_line(point=True).encode(
            x=alt.X("policy_version:O", sort=None, title="policy_version"),
            y=alt.Y("frac_reward_zero_std:Q", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("run_id:N", title="run"),
            tooltip=["run_id", "policy_version", "n_state_groups", "n_trainable_state_groups", "frac_reward_zero_std"],
        ),
        width="stretch",
    )


st.title("GRPO health")
snap = data.current_snapshot()
if data.require_steps(snap):
    totals = snap.df(GROUPS_SQL).iloc[0]
    n_groups = int(totals["n_groups"] or 0)
    if n_groups == 0:
        st.info("No error-free episodes yet, so no GRPO groups.")
    else:
        frac = float(totals["frac_reward_zero_std"])
        _metric_row(("frac_reward_zero_std (all groups)", f"{frac:.1%}"), ("Groups", f"{n_groups:,}"),
                    ("Trainable groups (reward std > 0)", f"{int(totals['n_trainable_groups']):,}"),
                    ("Groups of one attempt", f"{int(totals['n_singleton_groups']):,}",
                     "A group needs several attempts of a task (same task_seed, policy_version) to have a std."))
        state_groups = snap.df(STATE_GROUPS_SQL)
        # Attempts of one each (--group-by state --group-size 1) are zero-std by construction: where the lake has
        # state groups, those are what the updates read, and the warning below judges them instead.
        by_state_only = not state_groups.empty and int(totals["n_singleton_groups"]) == n_groups
        if frac > STALL_FRACTION and not by_state_only:
            st.warning(
                f"{frac:.0%} of the groups have zero reward std: GRPO learns nothing from them and learning stalls. "
                "Sample more attempts per task, raise the temperature, or use denser rewards (progress, novelty)."
            )
        elif by_state_only:
            st.info("Every episode group holds one attempt, so its reward std is 0 by construction. These runs sample "
                    "candidates at each visited state: their per-state groups, below, are what an update trains on.")

        by_run = snap.df(REWARD_STATS_SQL, {"scope": "run"})
        by_version = snap.df(REWARD_STATS_SQL, {"scope": "policy_version"})
        st.subheader("frac_reward_zero_std per run")
        left, right = st.columns([3, 2])
        left.dataframe(by_run.drop(columns=["scope"]), hide_index=True, width="stretch")
        right.altair_chart(
            alt.Chart(by_run).mark_bar().encode(
                x=alt.X("frac_reward_zero_std:Q", scale=alt.Scale(domain=[0, 1])),
                y=alt.Y("run_id:N", title="run", sort="-x"),
                tooltip=["run_id", "policy_version", "n_groups", "n_trainable_groups", "frac_reward_zero_std"],
            ),
            width="stretch",
        )
        st.subheader("frac_reward_zero_std per policy_version")
        left, right = st.columns([3, 2])
        left.dataframe(by_version.drop(columns=["scope", "run_id"]), hide_index=True, width="stretch")
        right.altair_chart(
            alt.Chart(by_version.fillna({"policy_version": "(none)"})).mark_bar().encode(
                x=alt.X("frac_reward_zero_std:Q", scale=alt.Scale(domain=[0, 1])),
                y=alt.Y("policy_version:N", title="policy_version"),
                tooltip=["policy_version", "n_groups", "n_trainable_groups", "frac_reward_zero_std"],
            ),
            width="stretch",
        )

        if not state_groups.empty:
            _state_group_section(state_groups)

        st.subheader("Distribution of group reward std")
        width = max(float(totals["max_std"] or 0.0), 1e-6) / HISTOGRAM_BINS
        histogram = snap.df(HISTOGRAM_SQL, {"width": width, "bins": float(HISTOGRAM_BINS)})
        st.altair_chart(
            alt.Chart(histogram).mark_bar().encode(
                x=alt.X("std_from:Q", bin="binned", title="group reward std"),
                x2="std_to:Q",
                y=alt.Y("groups:Q", title="groups"),
                tooltip=["std_from", "std_to", "groups"],
            ),
            width="stretch",
        )
        st.caption("The bar at 0 holds the zero-std groups.")

        if st.checkbox("Count anchor-state (step-level) groups", key="grpo_step_groups",
                       help="Reads grpo_groups' step level: slower on a large lake."):
            step_groups = snap.df(STEP_GROUPS_SQL).iloc[0]
            c1, c2 = st.columns(2)
            c1.metric("Anchor-state groups (2+ members)", f"{int(step_groups['n_anchor_groups']):,}")
            c2.metric("Trainable anchor-state groups", f"{int(step_groups['n_trainable_anchor_groups']):,}")
