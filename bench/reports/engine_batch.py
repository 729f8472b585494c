"""A batched choice-walk step's cost (`python -m bench engine-batch`): one decode forward of the served model at
several batch sizes, per walk against batch 1."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for batch, r in run["batches"].items():
            rows.append([run["date"], run["model"], str(run["prompt_tokens"]), str(run["torch_threads"]), batch,
                         f"{r['median_ms']:.1f}", f"{r['per_walk_ms']:.1f}", f"{r['per_walk_vs_batch_1']:.2f}×",
                         str(r["repeats"]), f"`{run['command']}`"])
    lines = "\n".join(f"- {provenance(r)}; load {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after"
                      for r in runs)
    return table(["date", "model", "cache tokens", "threads", "batch", "ms per forward (median)", "ms per walk",
                  "per walk vs batch 1", "repeats", "command"], rows) + "\n" + lines + "\n"
