"""What a VLM training job costs: image tokens per step, text tokens per step, tokens/s and peak memory.

    .venv/bin/python -m bench vlm                                   # the tiny VLM on CPU, BC, 6 steps
    .venv/bin/python -m bench vlm --job dpo --steps 4 --batch-size 2
    .venv/bin/python -m bench vlm --base-model Qwen/Qwen3-VL-8B-Instruct --backends peft,unsloth   # a GPU host

Set-up: a random-policy MiniWoB rollout with screenshots on (``--tasks``,
``--rollouts-per-task``) into a fresh lake, then the training job on it, once per
backend, each in its own process so its peak memory is its own (``ru_maxrss``;
on a GPU also ``torch.cuda.max_memory_allocated``). Image tokens are the pad
tokens the processor inserted (one per merged patch), counted by the job's
collator and divided by the optimizer steps (x gradient accumulation, 1 here).
Printed side by side, and written to bench/results/vlm/<time>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench.reports import save



def _train(job: str, lake: str, base_model: str, out: str, backend: str, steps: int, batch_size: int, queue) -> None:
    import torch

    from halo_train import BCConfig, DPOConfig, GRPOConfig, train_bc, train_dpo, train_grpo

    configs = {"bc": (BCConfig, train_bc), "dpo": (DPOConfig, train_dpo), "grpo": (GRPOConfig, train_grpo)}
    config_cls, train = configs[job]
    cfg = config_cls(lake=lake, base_model=base_model, output_dir=out, backend=backend, max_steps=steps,
                     batch_size=batch_size, lora_r=8, lora_alpha=16, logging_steps=1, max_length=None)
    started = time.perf_counter()
    result = train(cfg)
    seconds = time.perf_counter() - started
    stats = json.loads((result.final_adapter / "training_stats.json").read_text())
    vlm = stats["vlm"]
    text_tokens = float(result.metrics.get("num_input_tokens_seen") or 0)
    queue.put({
        "job": job,
        "backend": stats["backend"],
        "steps": result.global_step,
        "rows": result.rows,
        # sequences per forward pass: a DPO pair is two (chosen, rejected), sharing one image
        "sequences_per_step": min(batch_size, result.rows) * (2 if job == "dpo" else 1),
        # the collator also builds the batch the data loader prefetches past the last step
        "image_tokens_per_step": vlm["image_tokens"] / max(vlm["batches"], 1),
        "tokens_per_step": text_tokens / max(result.global_step, 1),
        "images_decoded_per_step": vlm["images_decoded"] / max(vlm["batches"], 1),
        "tokens_per_second": float(result.metrics.get("tokens_per_second") or 0),
        "train_seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
        "trainable_parameters": vlm["trainable_parameters"],
        "vision_tower": vlm["vision_tower"],
    })


def measure(job: str, lake: str, base_model: str, workdir: Path, backend: str, steps: int, batch_size: int) -> dict:
    context = multiprocessing.get_context("spawn")  # a fresh process: its peak memory is this job's alone
    queue = context.Queue()
    process = context.Process(target=_train, args=(job, lake, base_model, str(workdir / f"{job}-{backend}"), backend,
                                                   steps, batch_size, queue))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"the {job} job with backend {backend} failed (exit {process.exitcode})")
    return queue.get()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench vlm", description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="bc", choices=("bc", "dpo", "grpo"))
    ap.add_argument("--base-model", default=None, help="A Qwen-VL model folder or hub id (default: the tiny VLM, built here).")
    ap.add_argument("--backends", default="peft", help="Comma-separated: peft, unsloth (a CUDA GPU).")
    ap.add_argument("--tasks", default="click-button,click-link,click-tab")
    ap.add_argument("--rollouts-per-task", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)

    from halo_agent.rollout import RolloutConfig, run_rollouts

    with tempfile.TemporaryDirectory(prefix="halo-bench-vlm-", dir=args.workdir) as tmp:
        work = Path(tmp)
        lake = str(work / "lake")
        run_rollouts(RolloutConfig(env="miniwob", tasks=args.tasks.split(","), rollouts_per_task=args.rollouts_per_task,
                                   policy="random", max_steps=3, task_seed=0, lake=lake, run_id="bench-vlm", progress=False))
        base_model = args.base_model
        if base_model is None:
            from halo_train.tiny_vlm import build_tiny_vlm

            base_model = str(build_tiny_vlm(work / "tiny-vlm"))
        rows = [measure(args.job, lake, base_model, work, b.strip(), args.steps, args.batch_size)
                for b in args.backends.split(",") if b.strip()]
    report = {"base_model": args.base_model or "tiny VLM (halo-train make-tiny-model --vision)", "job": args.job,
              "tasks": args.tasks, "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(), "runs": rows}
    path = save("vlm", report, argv)
    print(table(rows))
    if len(rows) == 2 and rows[0]["tokens_per_second"]:
        print(f"speed-up {rows[1]['backend']} / {rows[0]['backend']}: {rows[1]['tokens_per_second'] / rows[0]['tokens_per_second']:.2f}x")
    print(f"written to {path}")


def table(rows: list[dict]) -> str:
    keys = ["job", "backend", "rows", "steps", "sequences_per_step", "image_tokens_per_step", "tokens_per_step", "images_decoded_per_step",
            "tokens_per_second", "train_seconds", "peak_rss_mib", "peak_gpu_mib"]
    lines = [" | ".join(keys)]
    for r in rows:
        lines.append(" | ".join(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
