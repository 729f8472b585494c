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
        changed = {task for arm in run["arms"].values() for task, t in arm["tasks"].items() if t["repeat"] < t["episodes"]}
        for task in sorted(changed):
            per_task.append([run["date"], task] + [f"{arm['tasks'][task]['repeat']}/{arm['tasks'][task]['episodes']}"
                                                   for arm in run["arms"].values()])
    arms = list(runs[-1]["arms"]) if runs else []
    text = table(["date", "arm", "settle_ms", "episodes that repeat", "success differs", "env s per step", "measured", "command"], rows)
    if per_task:
        text += "\n\nTasks where some episode did not repeat:\n\n" + table(["date", "task"] + [f"repeat, {a}" for a in arms], per_task)
    return text + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
