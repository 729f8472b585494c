"""A batched choice-walk step's cost (`python -m bench engine-batch`): the chat server's decode forward of the
served model at several batch sizes under each linear kernel, per walk against one walk alone."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        # runs before the kernels were compared measured torch's kernel, a bare decode forward
        kernels = run.get("kernels") or {"torch": {"batches": run["batches"]}}
        for kernel, k in kernels.items():
            for batch, r in k["batches"].items():
                rows.append([run["date"], run["model"], str(run["prompt_tokens"]), str(run["torch_threads"]), kernel,
                             str(run.get("fed_tokens", 1)), batch, f"{r['median_ms']:.1f}", f"{r['per_walk_ms']:.1f}",
                             f"{r['per_walk_vs_batch_1']:.2f}×",
                             f"{k['prefill_ms']:.0f}" if "prefill_ms" in k else "–", str(r["repeats"]), f"`{run['command']}`"])
    lines = "\n".join(f"- {provenance(r)}; load {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after"
                      for r in runs)
    return table(["date", "model", "cache tokens", "threads", "kernel", "fed tokens", "batch", "ms per forward (median)",
                  "ms per walk", "per walk vs batch 1", "prefill ms", "repeats", "command"], rows) + "\n" + lines + "\n"
