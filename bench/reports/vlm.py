"""A VLM training job (`python -m bench vlm`): image tokens per step, tokens/s and peak memory, per backend."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table

KEYS = ["job", "backend", "rows", "steps", "image_tokens_per_step", "tokens_per_step", "images_decoded_per_step",
        "tokens_per_second", "train_seconds", "peak_rss_mib", "peak_gpu_mib"]


def _cell(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = [[run["base_model"], *(_cell(r[k]) for k in KEYS), f"`{run['command']}`"] for run in runs for r in run["runs"]]
    return table(["base model", *KEYS, "command"], rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
