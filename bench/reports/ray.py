"""Ray workers against the local worker pool (`python -m bench ray`): the same tasks, 2 workers each, taking turns."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def _mmm(m: dict) -> str:
    return f"{m['min']:.1f} / {m['median']:.1f} / {m['max']:.1f}"


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for name in ("pool", "ray"):
            rows.append([run["date"], name, f"{len(run['tasks'].split(','))} × {run['rollouts_per_task']}",
                         _mmm(run["steps_per_second"][name]), _mmm(run["wall_seconds"][name]),
                         ", ".join(f"{x:.2f}×" for x in run["ray_over_pool"]) if name == "ray" else "",
                         f"`{run['command']}`"])
    head = ["date", "workers", "tasks × attempts", "steps/s (episodes' span), min / median / max",
            "wall s (with start-up)", "ray / pool, side by side", "command"]
    return table(head, rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
