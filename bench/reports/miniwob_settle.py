"""Whether a MiniWoB++ episode repeats however fast the policy answers (`python -m bench miniwob-settle`)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows, per_task = [], []
    for run in runs:
        measured = f"{len(run['tasks'])} tasks × {run['seeds']} seeds, ≤ {run['steps']} actions, answering at once and after {run['pause_s']} s"
        for name, arm in run["arms"].items():
            rows.append([run["date"], name, arm["settle_ms"], f"{arm['repeat']}/{arm['episodes']}", arm["success_differs"],
                         f"{arm['env_seconds_per_step']:.3f}", measured, f"`{run['command']}`"])
        rows.append([run["date"], "settle / observe at once", "", "", "", f"{run['ratios']['env_seconds_per_step']}×", "",
                     f"`{run['command']}`"])
    latest = runs[-1] if runs else None
    for task in (latest["tasks"] if latest else []):
        cells = [latest["arms"][a]["tasks"][task] for a in latest["arms"]]
        per_task.append([task] + [f"{c['repeat']}/{c['episodes']}" for c in cells]
                        + [f"{c['env_seconds_per_step']:.3f}" if "env_seconds_per_step" in c else "–" for c in cells])
    text = table(["date", "arm", "settle_ms", "episodes that repeat", "success differs", "env s per step", "measured", "command"], rows)
    if per_task:
        arms = list(latest["arms"])
        text += (f"\n\nPer task, {latest['date']}:\n\n"
                 + table(["task"] + [f"repeat, {a}" for a in arms] + [f"env s per step, {a}" for a in arms], per_task))
    return text + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
