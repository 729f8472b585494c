"""Does the persistent learner move the policy? A job per update against the persistent learner (omega 1 and 0).

    .venv/bin/python -m bench online-learner                       # SmolLM2-135M-Instruct, 8 iterations per arm
    nohup nice -n 10 .venv/bin/python -m bench online-learner --workdir runs/online-learner >> runs/online-learner.log 2>&1 &
    .venv/bin/python -m bench online-learner --arms jobs,persistent --iterations 2 --tasks click-option   # smaller

Arms, each its own online run (``halo-train online-grpo --serve --engine chat``) from the same base model on the
same train task seeds, each with its own lake, run interleaved (every arm's iteration k, then k + 1), so that
each iteration's updates meet the same machine:

- ``jobs``: ``--learner jobs``, an update is a ``halo-train grpo`` job (learning-v1's online arm: a fresh AdamW,
  ``--train-steps 4`` steps of ``--batch-size 8`` rows, the learning rate decaying to 0 inside the job);
- ``persistent``: ``--learner persistent --omega 1``: one learner across iterations, every row of an iteration
  trained once (``--epochs-per-update 1``) in minibatches of ``--mini-batch-size``; GiGPO's step credit on;
- ``persistent-omega0``: the same with ``--omega 0`` (episode-level advantages only).

Per iteration, from each run's ``train_metrics``: the adapter's displacement from the version before (mean over
LoRA modules of ||(alpha/r)(B'A' - BA)||_F) and from the base, rows produced and rows trained, the update's
seconds and seconds per trained row (wall, and this process's CPU seconds, which the machine's other work
changes far less), the anchor groups with spread and the step term's share of the advantage;
success on the dev seeds (``--eval-every``, after iterations 4 and 8). Then the ratios the learner is held to:
persistent / jobs displacement per iteration (target >= 3x) and update seconds per trained row (target <= 0.7x),
wall and CPU.

Resumable: ``--workdir`` keeps every arm's lake and adapters; the same command continues each arm's run where it
stopped (``--resume``) and records the commit each arm started at. Results go to bench/results/online-learner/.
A measurement on a shared machine: the load average before and after is recorded with it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.reports import head_commit, save
from halo_train.config import LearnerOptions

LEARNER = LearnerOptions()  # online-grpo's persistent learner as it ships

ROOT = Path(__file__).resolve().parent.parent
ARMS = {
    "jobs": {"learner": "jobs", "omega": 1.0},
    "persistent": {"learner": "persistent", "omega": 1.0},
    "persistent-omega0": {"learner": "persistent", "omega": 0.0},
}
PER_ITERATION = ("displacement_from_previous", "displacement_from_base", "rows_produced", "rows_trained",
                 "optimizer_steps", "update_seconds", "update_cpu_seconds", "update_measure_seconds", "update_load_seconds", "update_train_seconds", "update_save_seconds",
                 "reload_seconds", "anchor_groups_with_spread", "step_advantage_share", "groups_success_spread",
                 "groups_shaping_spread_only", "approx_kl", "entropy", "clip_ratio", "success_rate/train",
                 "success_rate/heldout", "trainable_groups", "early_stopped", "stop_kl")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench online-learner", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tasks", default="click-option,click-button-sequence,click-checkboxes")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"Which arms, in this order ({', '.join(ARMS)}).")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-episode-steps", type=int, default=4)
    ap.add_argument("--train-seed-start", type=int, default=300_000, help="Train task seeds (none of learning-v1's ranges).")
    ap.add_argument("--eval-seed-start", type=int, default=350_000, help="Dev seeds of the same tasks, for --eval-every.")
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-seeds", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-5, help="learning-v1's online rate, in every arm.")
    ap.add_argument("--train-steps", type=int, default=4, help="jobs arm: optimizer steps per update job (learning-v1's).")
    ap.add_argument("--batch-size", type=int, default=8, help="jobs arm: rows per step; persistent: rows per forward pass.")
    ap.add_argument("--mini-batch-size", type=int, default=LEARNER.mini_batch_size,
                    help="persistent arms: rows per optimizer step (online-grpo's default).")
    ap.add_argument("--target-kl", type=float, default=LEARNER.target_kl or 0.0,
                    help="persistent arms: --target-kl (online-grpo's default; 0: no early stop).")
    ap.add_argument("--warmup-steps", type=int, default=LEARNER.warmup_steps,
                    help="persistent arms: --warmup-steps (online-grpo's default).")
    ap.add_argument("--workdir", default="runs/online-learner", help="Lakes, adapters and logs of the arms (resumed).")
    a = ap.parse_args(argv)
    t0, load_before = start()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        raise SystemExit(f"Error: unknown arm(s) {', '.join(unknown)}: choose among {', '.join(ARMS)}")
    # Interleaved, iteration by iteration (jobs k, persistent k, persistent-omega0 k, then k + 1): every arm's
    # update k meets the same machine. Each arm's learner stays in this process between its iterations.
    configs = {arm: arm_config(a, arm, work / arm) for arm in arms}
    for k in range(a.iterations):
        for arm in arms:
            run_iterations(arm, configs[arm], k + 1)
    results = {arm: arm_results(a, arm, configs[arm], work / arm) for arm in arms}
    load_after = os.getloadavg()
    summary: dict = {"options": vars(a), "load_before": load_before, "load_after": load_after, "cores": os.cpu_count(),
                     "arms": results}
    started = {r["commit"] for r in results.values()}
    if len(started) == 1:  # the commit every arm started at, not the checkout's at the end
        summary["commit"] = started.pop()
    summary.update(ratios(results))
    print_table(results, summary)
    print(f"load average after: {load_after[0]:.2f}")
    out = save("online-learner", summary, argv)
    print(f"{time.perf_counter() - t0:.0f} s; results in {out}")


def start() -> tuple[float, tuple[float, float, float]]:
    """Quiets transformers' logging and prints the load before the runs; the start time and that load."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} on {os.cpu_count()} cores", flush=True)
    return time.perf_counter(), load_before


def arm_config(a: argparse.Namespace, arm: str, work: Path):
    """The arm's online run; the commit it started at is recorded beside it (a resumed arm continues at its own)."""
    from halo_train.online import OnlineConfig

    work.mkdir(parents=True, exist_ok=True)
    started = work / "started.json"
    commit = head_commit()
    if not started.exists():
        started.write_text(json.dumps({"commit": commit, "at": time.strftime("%Y-%m-%d %H:%M:%S")}))
    first = json.loads(started.read_text())
    if first["commit"] != commit:
        print(f"  note: {arm} started at {first['commit'][:10]}, continues at {commit[:10]}", flush=True)
    persistent = ARMS[arm]["learner"] == "persistent"
    return OnlineConfig(
        base_model=a.model, tasks=[t.strip() for t in a.tasks.split(",") if t.strip()], iterations=a.iterations,
        group_size=a.group_size, max_episode_steps=a.max_episode_steps, train_seed_start=a.train_seed_start,
        eval_seed_start=a.eval_seed_start, eval_every=a.eval_every, eval_seeds=a.eval_seeds, eval_attempts=1,
        lr=a.lr, batch_size=a.batch_size, mini_batch_size=a.mini_batch_size,
        train_steps=a.train_steps if ARMS[arm]["learner"] == "jobs" else None,
        serve=True, engine="chat", constrain_actions=True, observation="elements",
        reward_config=str(ROOT / "halo_agent" / "configs" / "rewards-success.yaml"), lake=str(work / "lake"),
        output_dir=str(work / "out"), run_id=f"online-{arm}", progress=False, seed=getattr(a, "seed", 0),
        # The persistent learner's options (--target-kl 0: none, as the config records it); a job per update has none.
        target_kl=getattr(a, "target_kl", None) if persistent else None,
        warmup_steps=getattr(a, "warmup_steps", 0) if persistent else 0, **ARMS[arm],
    )


def run_iterations(arm: str, cfg, iterations: int) -> None:
    """The arm's run up to ``iterations`` iterations (resumed: what is recorded is not done again)."""
    import dataclasses

    from halo_train.online import run_online

    resume = (Path(cfg.output_dir) / "online_run.json").exists()
    run_online(dataclasses.replace(cfg, iterations=iterations, resume=resume),
               echo=lambda line: print(f"  {arm}: {line}", flush=True))


def arm_results(a: argparse.Namespace, arm: str, cfg, work: Path) -> dict:
    """The arm's per-iteration figures from its lake's train_metrics."""
    from halo_data.lake import Lake

    first = json.loads((work / "started.json").read_text())
    per = per_iteration(Lake.open(cfg.lake), cfg.run_id, PER_ITERATION, a.iterations)
    for name, seconds in (("seconds_per_trained_row", "update_seconds"), ("cpu_seconds_per_trained_row", "update_cpu_seconds")):
        per[name] = [u / n if u is not None and n else None for u, n in zip(per[seconds], per["rows_trained"])]
    return {"commit": first["commit"], "started_at": first["at"], "per_iteration": per}


def per_iteration(lake, run_id: str, metrics: tuple[str, ...], iterations: int) -> dict[str, list]:
    """An online run's ``metrics`` from ``train_metrics``, one value per iteration (None where it logged none)."""
    rows = lake.query_arrow("select step, metric, value from train_metrics where run_id = $r order by step",
                            {"r": run_id}).to_pylist()
    per: dict[str, list] = {m: [None] * iterations for m in metrics}
    for r in rows:
        if r["metric"] in per and r["step"] < iterations:
            per[r["metric"]][r["step"]] = r["value"]
    return per


def _mean(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def ratios(results: dict) -> dict:
    """persistent / jobs: mean displacement per iteration (target >= 3) and mean update seconds per trained row
    (target <= 0.7); and the arms' means."""
    means = {arm: {k: _mean(r["per_iteration"][k]) for k in (
        "displacement_from_previous", "seconds_per_trained_row", "cpu_seconds_per_trained_row", "rows_trained",
        "update_seconds", "update_cpu_seconds", "step_advantage_share")} for arm, r in results.items()}
    out: dict = {"means": means}
    if {"jobs", "persistent"} <= results.keys():
        jobs, persistent = means["jobs"], means["persistent"]
        if jobs["displacement_from_previous"] and persistent["displacement_from_previous"] is not None:
            out["displacement_ratio"] = persistent["displacement_from_previous"] / jobs["displacement_from_previous"]
        for key, name in (("seconds_per_trained_row", "seconds_per_row_ratio"),
                          ("cpu_seconds_per_trained_row", "cpu_seconds_per_row_ratio")):
            if jobs[key] and persistent[key] is not None:
                out[name] = persistent[key] / jobs[key]
    return out


def print_table(results: dict, summary: dict) -> None:
    print("\narm                 iteration  moved     rows trained/produced  update s  s/row  CPU s/row  step share  dev success")
    for arm, r in results.items():
        p = r["per_iteration"]
        for k in range(len(p["update_seconds"])):
            def f(key, fmt):
                v = p[key][k]
                return format(v, fmt) if v is not None else "-"
            print(f"{arm:<19} {k:>9}  {f('displacement_from_previous', '.4f'):>8}  "
                  f"{f('rows_trained', '.0f'):>6}/{f('rows_produced', '.0f'):<15} {f('update_seconds', '.1f'):>8}  "
                  f"{f('seconds_per_trained_row', '.2f'):>5}  {f('cpu_seconds_per_trained_row', '.2f'):>9}  "
                  f"{f('step_advantage_share', '.2f'):>10}  {f('success_rate/heldout', '.0%'):>11}")
    for key, target in (("displacement_ratio", ">= 3"), ("seconds_per_row_ratio", "<= 0.7"), ("cpu_seconds_per_row_ratio", "<= 0.7")):
        if key in summary:
            print(f"persistent / jobs {key.replace('_', ' ')}: {summary[key]:.2f} (target {target})")


if __name__ == "__main__":
    main()
