"""Online GRPO by state against by episode (`python -m bench state-groups`): groups, rows and seconds per iteration."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table

COLUMNS = ("episodes", "env_steps", "candidates", "unreproducible_states", "groups", "trainable_groups", "rows_trained")


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = [[run["task"], group_by, it["iteration"], *(it[k] for k in COLUMNS), round(it["rollout_seconds"], 1),
             round(it["update_seconds"], 1), f"`{run['command']}`"]
            for run in runs for group_by, its in run["runs"].items() for it in its]
    head = ["task", "grouping", "iteration", "episodes", "env steps", "candidates", "unreproducible states", "groups",
            "trainable groups", "rows trained", "rollout s", "update s", "command"]
    return table(head, rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
