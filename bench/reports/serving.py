"""HALO's chat server on constrained rollouts (`python -m bench serving`): the cached scoring against the full
one, side by side, in steps per second, and where a step's time goes."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table

HEADERS = ["server", "steps", "wall (s)", "steps/s", "cached / full", "engine s/step", "other s/step",
           "prompt tokens prefilled", "solved", "load", "command"]


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        loads = [x for r in run["rows"] for x in r["load_average"]]
        for arm in ("full", "cached"):
            a = run["arms"][arm]
            prefilled = a["prefill_tokens"] / a["prompt_tokens"] if arm == "cached" else 1.0
            rows.append([f"`--score-mode {arm}`", a["steps"], round(a["wall_seconds"]), round(a["steps_per_second"], 3),
                         f"{run['ratio']:.2f}x", round(a["engine_seconds_per_step"], 2), round(a["other_seconds_per_step"], 2),
                         f"{prefilled:.0%}", f"{a['successes']}/{a['episodes']}", f"{min(loads):.0f}–{max(loads):.0f}",
                         f"`{run['command']}`"])
    return table(HEADERS, rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
