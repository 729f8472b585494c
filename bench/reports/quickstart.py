"""`halo-train quickstart --model` (`python -m bench quickstart`): held-out success of the BC adapter, zero-shot and
random, with intervals, and the command's wall and CPU time."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table

_LABEL = {"bc": "BC adapter"}


def _rate(p: dict | None) -> str:
    if not p:
        return "–"
    return f"{p['successes']}/{p['episodes']}: {100 * p['rate']:.0f}% [{100 * p['low']:.0f}, {100 * p['high']:.0f}]"


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows, notes = [], []
    for run in runs:
        s = run["summary"]
        pooled = s["pooled"]
        diff = {(d["policy"], d["against"]): d for d in s["differences"]}
        bc = diff.get(("bc", "zero-shot"))
        bc_cell = (f"{100 * bc['difference']:+.0f} [{100 * bc['low']:+.0f}, {100 * bc['high']:+.0f}]: {bc['verdict']}"
                   if bc else "no adapter: " + s["bc"].get("skipped", ""))
        cfg = s["config"]
        rows.append([
            s["model"], ", ".join(t.removeprefix("miniwob.") for t in cfg["tasks"]), cfg["seed"],
            f"{s['train_successes'][0]}/{s['train_successes'][1]}", f"{s['bc'].get('steps', 0)} on {s['bc'].get('rows', 0)} rows",
            _rate(pooled.get("bc")), _rate(pooled.get("zero-shot")), _rate(pooled.get("random")), bc_cell,
            round(run["wall_seconds"]), round(run["cpu_seconds"]), f"`{run['command']}`",
        ])
        per_task = "; ".join(
            f"{task.removeprefix('miniwob.')}: " + ", ".join(
                f"{_LABEL.get(policy, policy)} {'/'.join(map(str, s['success'][policy][task]))}"
                for policy in ("bc", "zero-shot", "random") if task in s["success"].get(policy, {}))
            for task in cfg["tasks"])
        notes.append(f"- {provenance(run)}; load {run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after; "
                     f"`{run['quickstart_command']}`; per task (held-out seeds): {per_task}")
    head = ["model", "tasks", "seed", "zero-shot train successes", "BC steps", "BC adapter", "zero-shot", "random",
            "BC adapter − zero-shot, points [95%]", "wall s", "CPU s", "command"]
    return table(head, rows) + "\n" + "\n".join(notes) + "\n"
