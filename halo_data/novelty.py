"""How new an evaluation's states are to the runs a policy trained on.

A state is the prompt the policy saw, hashed (``steps.prompt_hash``). An evaluation on held-out task seeds tests
generalisation only where its states are new: a task whose observation renders the same page for every seed gives
its "new" seeds the training run's states again. ``seen_states`` counts, per evaluation run and task, the episodes,
the different first pages they start on, the episodes that start on a page some training run also had, and the
steps whose state some training run had.
"""

from __future__ import annotations

from typing import Sequence

from halo_data.lake import Lake

SEEN_COUNTS = ("episodes", "distinct_first_pages", "first_state_seen", "steps", "steps_seen")

_SEEN_SQL = (
    "with seen as (select distinct prompt_hash from steps where list_contains($train, run_id)) "
    "select run_id, task_id, count(*) filter (where step_idx = 0) AS episodes, "
    "count(distinct prompt_hash) filter (where step_idx = 0) AS distinct_first_pages, "
    "count(*) filter (where step_idx = 0 and prompt_hash in (select prompt_hash from seen)) AS first_state_seen, "
    "count(*) AS steps, count(*) filter (where prompt_hash in (select prompt_hash from seen)) AS steps_seen "
    "from steps where list_contains($eval, run_id) group by run_id, task_id order by run_id, task_id"
)


def seen_states(lake: Lake, train_runs: Sequence[str], eval_runs: Sequence[str]) -> dict[str, dict[str, dict[str, int]]]:
    """{eval run: {task: {count: n}}} with the counts of ``SEEN_COUNTS``; runs with no steps are absent."""
    rows = lake.query_arrow(_SEEN_SQL, {"train": sorted(train_runs), "eval": sorted(eval_runs)},
                            views=False, tables=("steps",)).to_pylist()
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rows:
        out.setdefault(r["run_id"], {})[r["task_id"]] = {k: int(r[k] or 0) for k in SEEN_COUNTS}
    return out
