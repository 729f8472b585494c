"""Online GRPO sequential against `--pipeline` (`python -m bench online-pipeline`): seconds per iteration, side by side."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for mode, r in run["modes"].items():
            rows.append([run["task"], mode, f"{run['options']['iterations']} × {run['options']['seeds_per_iteration']} seeds",
                         round(r["seconds_per_iteration"], 1), round(sum(r["rollout_seconds"]), 1),
                         round(sum(r["update_seconds"]), 1), round(sum(r["overlap_seconds"]), 1), round(r["loop_seconds"], 1),
                         f"{run['ratio']:.2f}× (ideal {run['ideal_ratio']:.2f}×)" if mode == "pipelined" and "ratio" in run else "",
                         f"`{run['command']}`"])
    head = ["task", "mode", "iterations", "s/iteration", "rollout s", "update s", "overlap s", "loop s",
            "sequential / pipelined", "command"]
    return table(head, rows) + "\n" + "\n".join(
        f"- {provenance(r)}; load {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after" for r in runs) + "\n"
