"""What does ``halo-train online-grpo --pipeline`` gain? The same small run sequential and pipelined, side by side.

    .venv/bin/python -m bench online-pipeline
    .venv/bin/python -m bench online-pipeline --iterations 6 --seeds-per-iteration 4 --group-size 4 --train-steps 8

Set-up (CPU, nothing downloaded): a tiny model warmed up on random-policy steps of the task (the action
format), then two online runs from it that differ only in ``--pipeline``: same task seeds, same
sizes, each with its own lake and its own chat server. Sequential iteration k is rollout k, then
update k, then the reload; pipelined, update k (a spawned process) runs while rollout k+1 samples.
For each mode it prints seconds per iteration, the rollout and update seconds inside them, and the
overlap; then the ratio of the loops' wall times. The ideal ratio is what the overlap could save if
the update and the rollout did not share CPU cores: sum(rollout + update) / sum(max(rollout, update)).

``--threads`` caps torch's threads (the update, the chat server) in both modes alike. The machine's
load (``os.getloadavg``) is printed before and after: on a shared machine it decides the figures.
Results go to bench/results/online-pipeline/<time>.json. A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.reports import save

ROOT = Path(__file__).resolve().parent.parent
WARMUP_SEED_START = 50_000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench online-pipeline", description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="click-button")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--seeds-per-iteration", type=int, default=4, help="Train task seeds per iteration (a group each).")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-episode-steps", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=8, help="Optimizer steps per update.")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3,
                    help="1e-12: the adapters stay (all but) the start model, so both modes sample the same actions and do the same work.")
    ap.add_argument("--warmup-seeds", type=int, default=4)
    ap.add_argument("--warmup-steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every process (OMP_NUM_THREADS).")
    ap.add_argument("--modes", default="sequential,pipelined", help="Which runs, in this order.")
    ap.add_argument("--workdir", help="Where lakes, model and adapters go (default: a temporary folder).")
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by the chat server and the update process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    torch.set_num_threads(a.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the update's own progress bars, as the CLI and the update process keep them
    hf_logging.disable_progress_bar()
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} on {os.cpu_count()} cores", flush=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="halo-online-pipeline-"))
    warm = str(work / "warm")
    for seed in range(WARMUP_SEED_START, WARMUP_SEED_START + a.warmup_seeds):
        run_rollouts(RolloutConfig(env="miniwob", tasks=[a.task], rollouts_per_task=a.group_size, policy="random",
                                   observation="elements", max_steps=a.max_episode_steps, task_seed=seed, seed=seed,
                                   lake=warm, run_id=f"warmup-s{seed}", resume=True, progress=False))
    model = work / "tiny"
    if not (model / "halo_tiny_model.json").exists():
        build_tiny_model(model, warmup_lake=warm, steps=a.warmup_steps, where="run_id like 'warmup-%'")
    print(f"warm-up done in {time.perf_counter() - t0:.0f} s", flush=True)

    results = {}
    for mode in [m.strip() for m in a.modes.split(",") if m.strip()]:
        results[mode] = run_mode(a, model, work / mode, pipeline=mode == "pipelined")
    load_after = os.getloadavg()

    print(f"\n{a.task}, {a.iterations} iterations of {a.seeds_per_iteration} seeds x {a.group_size} attempts, "
          f"{a.train_steps} update steps; torch threads {a.threads}")
    print("mode        iteration seconds (each)                     s/iteration  rollout s  update s  overlap s  loop s")
    for mode, r in results.items():
        each = " ".join(f"{s:5.1f}" for s in r["iteration_seconds"])
        print(f"{mode:<11} {each:<44} {r['seconds_per_iteration']:>11.1f}  {sum(r['rollout_seconds']):>9.1f}  "
              f"{sum(r['update_seconds']):>8.1f}  {sum(r['overlap_seconds']):>9.1f}  {r['loop_seconds']:>6.1f}")
    summary: dict = {"task": a.task, "options": vars(a), "load_before": load_before, "load_after": load_after,
                     "cores": os.cpu_count(), "modes": results}
    if {"sequential", "pipelined"} <= results.keys():
        seq, pipe = results["sequential"], results["pipelined"]
        ratio = seq["loop_seconds"] / pipe["loop_seconds"]
        ideal = sum(r + u for r, u in zip(seq["rollout_seconds"], seq["update_seconds"])) / (
            sum(seq["rollout_seconds"][:1]) + sum(max(r, u) for r, u in zip(seq["rollout_seconds"][1:], seq["update_seconds"]))
            + seq["update_seconds"][-1])
        summary.update(ratio=ratio, ideal_ratio=ideal)
        print(f"sequential / pipelined wall time: {ratio:.2f}x (ideal with free cores, from the sequential run's "
              f"rollout and update times: {ideal:.2f}x)")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    out = save("online-pipeline", summary, argv)
    print(f"{time.perf_counter() - t0:.0f} s; results in {out}")


def run_mode(a: argparse.Namespace, model: Path, work: Path, pipeline: bool) -> dict:
    """One online run; its seconds per iteration and the rollout, update and overlap seconds inside them."""
    from halo_data.lake import Lake
    from halo_train.online import OnlineConfig, run_online

    lake = str(work / "lake")
    cfg = OnlineConfig(
        base_model=str(model), tasks=[a.task], iterations=a.iterations, group_size=a.group_size,
        seeds_per_iteration=a.seeds_per_iteration, max_episode_steps=a.max_episode_steps, train_steps=a.train_steps,
        batch_size=a.batch_size, lr=a.lr, serve=True, engine="chat", constrain_actions=True, observation="elements",
        reward_config=str(ROOT / "halo_agent" / "configs" / "rewards-success.yaml"), lake=lake,
        output_dir=str(work / "out"), run_id="online", resume=(work / "out" / "online_run.json").exists(),
        pipeline=pipeline, progress=False,
    )
    mode = "pipelined" if pipeline else "sequential"
    print(f"\n{mode}:", flush=True)
    summary = run_online(cfg, echo=lambda line: print(f"  {line}", flush=True))
    metrics = [it["metrics"] for it in summary.iterations]
    rows = Lake.open(lake).query_arrow(
        "select run_id, epoch(ended_at) - epoch(started_at) s from runs where run_id like 'online-k%'").to_pylist()
    rollout = {r["run_id"]: float(r["s"] or 0.0) for r in rows}
    return {
        "loop_seconds": summary.seconds,
        "iteration_seconds": [m["iteration_seconds"] for m in metrics],
        "seconds_per_iteration": summary.seconds / len(metrics),
        "rollout_seconds": [rollout.get(f"online-k{k}", 0.0) for k in range(len(metrics))],
        "update_seconds": [m.get("update_seconds", 0.0) for m in metrics],
        "overlap_seconds": [m.get("pipeline_overlap_seconds", 0.0) for m in metrics],
        "updates": sum(it["update"] == "trained" for it in summary.iterations),
    }


if __name__ == "__main__":
    main()
