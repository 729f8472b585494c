"""Whether an online learner uses the descriptions of unnamed elements: online GRPO under ``elements-v2`` (the
observation learning-v2 runs) against ``elements``, from the same base model on the same train task seeds, each
final policy then on the test seeds of ``python -m bench element-descriptions``.

    .venv/bin/python -m bench element-descriptions-online                    # 3 tasks, 12 iterations per arm
    .venv/bin/python -m bench element-descriptions-online --iterations 2 --seeds 4 --workdir runs/edo-small

Each arm is learning-v2's online_grpo arm (``halo-train online-grpo``: the persistent learner, episode-level
advantages only, lr 5e-5, minibatches of 8, Dr. GRPO, the success reward, decoding constrained to the page's
actions, temperature 1, at most 6 actions), on HALO's chat server; each update reads its own run's groups. The arms run interleaved,
iteration by iteration, so each arm's iteration k meets the same machine. Iteration k samples a group of
``--group-size`` episodes on train task seed k of every task. After the last iteration each arm's final version
plays ``--seeds`` test task seeds from 400000 on, one episode each. These are the seeds on which
``element-descriptions`` measured the base model zero-shot and ``element-descriptions-bc`` measured BC, so the
three compare task by task. Where the descriptions say what the goal refers to (whose trash icon, which folder),
an online learner can learn to read them; without them it can learn only positions.

Per arm: test successes per task; per iteration: sampled success on the train seeds, rows trained, the adapter's
displacement from the version before, approximate KL. ``--workdir`` keeps the lake and both arms' adapters; the same
command resumes each arm where it stopped. Results go to ``bench/results/element-descriptions-online/<time>.json``;
``python -m bench report element-descriptions-online`` makes the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.element_descriptions import ARMS, FIRST_SEED

TASKS = ("email-inbox-delete", "email-inbox-important", "navigate-tree")
ROOT = Path(__file__).resolve().parent.parent
PER_ITERATION = ("success_rate/train", "rows_produced", "rows_trained", "displacement_from_previous", "approx_kl",
                 "trainable_groups", "update_seconds")


def arm_config(a: argparse.Namespace, tasks: list[str], arm: str, work: Path, lake: str):
    """The arm's online run: learning-v2's online_grpo settings under observation ``arm``, evaluated once, after
    its last iteration, on the test seeds."""
    from halo_train.online import OnlineConfig

    return OnlineConfig(
        base_model=a.model, tasks=tasks, iterations=a.iterations, seeds_per_iteration=1, group_size=a.group_size,
        max_episode_steps=a.steps, observation=arm, constrain_actions=True, temperature=1.0, lr=a.lr, omega=0.0,
        learner="persistent", epochs_per_update=1, mini_batch_size=8, target_kl=None, warmup_steps=0,  # learning-v2's
        loss_type="dr_grpo", beta=0.0, epsilon=0.2, lora_r=16, lora_alpha=32, train_seed_start=0, seed=a.seed,
        eval_every=a.iterations, eval_seeds=a.seeds, eval_seed_start=FIRST_SEED, eval_attempts=1,
        reward_config=str(ROOT / "halo_agent" / "configs" / "rewards-success.yaml"),
        serve=True, engine="chat", lake=lake, output_dir=str(work / arm), run_id=f"online-{arm}",
        progress=False,
    )


def arm_results(cfg, iterations: int) -> dict:
    """The arm's per-iteration figures (train_metrics) and its final version's test episodes per task."""
    from halo_data.lake import Lake

    from bench.online_learner import per_iteration

    lake = Lake.open(cfg.lake)
    per = per_iteration(lake, cfg.run_id, PER_ITERATION, iterations)
    # the one evaluation, after the last iteration: runs <run_id>-eval-v<version>-s<seed> (an iteration without an
    # update serves the version before, so the version is read, not assumed)
    tests = lake.query_arrow(
        "select task_id, count(*) episodes, count(*) filter (where success) successes, sum(n_steps) steps, "
        "list_distinct(list(policy_version)) versions from episodes where starts_with(run_id, $prefix) "
        "group by task_id order by task_id", {"prefix": f"{cfg.run_id}-eval-"}).to_pylist()
    return {"per_iteration": per, "versions": sorted({v for r in tests for v in r["versions"]}),
            "results": {r["task_id"].removeprefix("miniwob."): {k: int(r[k]) for k in ("successes", "episodes", "steps")}
                        for r in tests}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench element-descriptions-online", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB task names")
    ap.add_argument("--iterations", type=int, default=12, help="online iterations per arm (one train task seed of each task each)")
    ap.add_argument("--group-size", type=int, default=8, help="episodes per task and train task seed: one GRPO group")
    ap.add_argument("--seeds", type=int, default=20, help=f"test task seeds per task, from {FIRST_SEED} on")
    ap.add_argument("--steps", type=int, default=6, help="actions per episode at most (learning-v2's 6)")
    ap.add_argument("--lr", type=float, default=5e-5, help="learning rate (learning-v2's online arms)")
    ap.add_argument("--seed", type=int, default=0, help="the seed of sampling and training, the same for both observations")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known model name (halo-train models) or a folder")
    ap.add_argument("--workdir", default="runs/element-descriptions-online", help="the lake and both arms' adapters; a re-run resumes")
    a = ap.parse_args(argv)
    if min(a.iterations, a.seeds, a.steps) < 1 or a.group_size < 2 or a.lr <= 0:
        raise SystemExit("Error: --iterations, --seeds and --steps must be at least 1, --group-size at least 2 and --lr above 0")
    import dataclasses

    from bench.element_descriptions import prepare
    from bench.online_learner import run_iterations
    from bench.reports import head_commit, save
    from halo_train.online import OnlineError

    tasks, _, work, lake = prepare(a)  # the tasks and the model checked; both arms' runs in one lake
    commit, load_before, t0 = head_commit(), os.getloadavg(), time.perf_counter()
    configs = {arm: arm_config(a, tasks, arm, work, lake) for arm in ARMS}
    for k in range(1, a.iterations + 1):
        for arm in (ARMS if k % 2 else ARMS[::-1]):  # alternating, so neither observation always runs first
            try:
                run_iterations(arm, configs[arm], k)
            except OnlineError as e:
                raise SystemExit(f"Error: {arm}: {e}") from None
    arms = {arm: arm_results(cfg, a.iterations) for arm, cfg in configs.items()}
    totals = {arm: {k: sum(c[k] for c in r["results"].values()) for k in ("successes", "episodes", "steps")}
              for arm, r in arms.items()}
    for arm in ARMS:
        print(f"online GRPO, {arm:12s} {totals[arm]['successes']}/{totals[arm]['episodes']} test episodes succeeded "
              "(" + ", ".join(f"{t} {c['successes']}/{c['episodes']}" for t, c in arms[arm]["results"].items()) + ")")
    out = save("element-descriptions-online", {
        "commit": commit, "model": a.model, "tasks": tasks, "iterations": a.iterations, "group_size": a.group_size,
        "seeds": a.seeds, "first_seed": FIRST_SEED, "steps": a.steps, "lr": a.lr, "seed": a.seed,
        "config": {k: v for k, v in dataclasses.asdict(configs["elements"]).items()
                   if k not in ("lake", "output_dir", "run_id", "observation", "base_model", "reward_config")},
        "arms": arms, "totals": totals, "seconds": round(time.perf_counter() - t0, 1), "load_before": load_before,
        "load_after": os.getloadavg()}, argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
