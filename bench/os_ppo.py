"""``halo-train ppo`` on os tasks against supervised fine-tuning on the same seeds, judged on unseen seeds and unseen tasks.

    nice -n 15 python -m bench os-ppo                                   # smollm2-135m-instruct, the defaults below
    python -m bench os-ppo --model out/tiny --epochs 2 --samples-per-epoch 8 --eval-episodes 8   # a quick pass

Every os task is a template drawn from its task seed (names, paths, contents, answers), so a seed
the training never saw is a new instance of the task, and a task it never saw is new altogether.

1. The policy is ``--model`` itself (a known model name such as ``smollm2-135m-instruct``, or a
   folder); there is no warm-up, so nothing is planted for either arm to learn or unlearn.
2. PPO arm: ``halo-train ppo --serve`` on ``--tasks``: epoch ``e`` samples ``--samples-per-epoch``
   episodes of task seed ``seed + e`` through HALO's chat server with the current adapter, then updates.
   The accuracy and reward of the episodes each epoch sampled are the training curve (binomial
   standard error sqrt(p (1 - p) / n)). The train seeds are therefore ``seed + 1 .. seed + epochs``.
3. SFT arm (the control): the reference solution of every train task on the same train seeds,
   played through the real os environment (``Act: bash`` + ``Act: finish``, judged by the task's own
   evaluation), then ``halo-train bc`` on those episodes for ``--sft-steps`` steps at ``--sft-lr``.
4. Evaluation: the model before training, the PPO adapter and the SFT adapter each answer
   ``--eval-episodes`` episodes of the train tasks on unseen seeds (from ``EVAL_SEED``), and as many of
   ``--heldout-tasks`` (tasks neither arm trained on) on the same unseen seeds, at temperature 1.

The figures go to ``bench/results/os-ppo/<time>.json``; ``python -m bench report os-ppo`` tables them
(``bench/reports/os_ppo.py``). A run is one seed: the curve is reported as it came out.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

TASKS = ("os.users-add", "os.users-group-add", "os.files-create-empty", "os.users-delete")
HELDOUT_TASKS = ("os.perms-executable", "os.files-make-dirs", "os.users-add-with-home", "os.text-append-line")
EVAL_SEED = 10_000  # far above every train seed (seed + epoch)
RESULTS = Path(__file__).resolve().parent / "results" / "os-ppo"


class ReferencePolicy:
    """Answers the reference solution of the instance whose goal it is shown, then finishes."""

    name = "reference"
    model = adapter = None
    policy_version = "reference"
    uses_screenshot = False

    def __init__(self, solutions: dict[str, str]):
        self.solutions = solutions  # instance goal -> its reference solution

    def reset(self, seed):
        pass

    def act(self, obs):
        from halo_agent.envs.os_env import FINISH, agent_turn
        from halo_agent.types import PolicyOutput

        action = self.solutions[obs.goal] if obs.step_idx == 0 else FINISH
        return PolicyOutput(model_output=agent_turn(action), action=action, action_source="model")

    def close(self):
        pass


def demonstrations(lake_dir: Path, tasks: list[str], seeds: range) -> tuple[int, int]:
    """The reference episode of each task on each seed, into a lake; returns (judged correct, episodes)."""
    from halo_agent.envs.os_env import OSEnv
    from halo_agent.envs.os_tasks import OSTask
    from halo_agent.rewards import RewardConfig
    from halo_agent.rollout import EpisodeRunner, RolloutConfig, plan_episodes
    from halo_data.lake import Lake
    from halo_data.writer import EpisodeWriter

    specs = [t for t in OSEnv.list_tasks() if t.task_id in tasks]
    solutions = {instance.instruction: instance.solution.script
                 for spec in specs for instance in (OSTask.from_spec(spec).instance(s) for s in seeds)}
    config = RolloutConfig(env="os", tasks=list(tasks), task_seed=seeds.start, task_seeds=len(seeds), lake=str(lake_dir),
                           run_id="demos", max_steps=2)
    env = OSEnv()
    writer = EpisodeWriter(Lake.init(lake_dir))
    correct = total = 0
    try:
        runner = EpisodeRunner(config, "demos", env, ReferencePolicy(solutions), RewardConfig.load())
        for spec in plan_episodes(config, "demos", specs):
            result = runner.run(spec)
            correct += bool(result.episode.success)
            total += 1
            writer.write_episode(result.episode, result.steps)
    finally:
        writer.close()
        env.close()
    return correct, total


def standard_error(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def evaluate(base_model: str, adapters: dict[str, str | None], task_sets: dict[str, list[str]], episodes: int, turns: int,
             max_tokens: int, root: Path) -> dict[str, dict[str, dict]]:
    """Accuracy of each adapter (None: the model itself) on each task set, on unseen seeds from ``EVAL_SEED``, at temperature 1."""
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.online import open_engine
    from halo_train.ppo import PPOConfig

    results: dict[str, dict[str, dict]] = {}
    with open_engine(PPOConfig(base_model=base_model, serve=True, tasks=task_sets["train tasks"]), root) as (engine, base_name):
        for label, path in adapters.items():
            served = None
            if path is not None:
                served = f"eval-{label}"
                swap = engine.swap_adapter(served, str(Path(path).resolve()), retire=None)
                if not swap.loaded:
                    raise RuntimeError(f"the chat server refused {path}: {swap.message}")
            for set_name, tasks in task_sets.items():
                summary = run_rollouts(RolloutConfig(
                    env="os", tasks=list(tasks), rollouts_per_task=1, task_seed=EVAL_SEED,
                    task_seeds=max(1, math.ceil(episodes / len(tasks))), policy="openai", model=base_name, adapter=served,
                    policy_version=label, policy_options={"base_url": engine.base_url, "max_tokens": max_tokens},
                    temperature=1.0, seed=EVAL_SEED, max_steps=turns, lake=str(root / "eval"),
                    run_id=f"eval-{label}-{set_name.replace(' ', '-')}", env_options={"max_rounds": turns}, command="bench os-ppo",
                ))
                n = summary.episodes_written
                accuracy = summary.successes / n if n else float("nan")
                results.setdefault(label, {})[set_name] = {"episodes": n, "correct": summary.successes, "accuracy": accuracy,
                                                           "se": standard_error(accuracy, n)}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench os-ppo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the policy: a known model name or a model folder")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples-per-epoch", type=int, default=16)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--sft-steps", type=int, default=60, help="halo-train bc steps of the control arm")
    parser.add_argument("--sft-lr", type=float, default=2e-4)
    parser.add_argument("--turns", type=int, default=1, help="commands per episode (the os environment's round limit)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--eval-episodes", type=int, default=24, help="episodes per task set and model at evaluation (0: none)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--heldout-tasks", default=",".join(HELDOUT_TASKS), help="tasks neither arm trains on (empty: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    heldout_tasks = [t.strip() for t in args.heldout_tasks.split(",") if t.strip()]
    if set(tasks) & set(heldout_tasks):
        parser.error(f"--heldout-tasks must not hold train tasks: {', '.join(sorted(set(tasks) & set(heldout_tasks)))}")

    import torch

    from halo_train.bc import train_bc
    from halo_train.config import BCConfig
    from halo_train.ppo import PPOConfig, train_ppo

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    t0 = time.perf_counter()
    RESULTS.mkdir(parents=True, exist_ok=True)
    report_path = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    train_seeds = range(args.seed + 1, args.seed + args.epochs + 1)  # what PPO's epochs sample (seed + epoch)
    report = {"command": "python -m bench os-ppo " + " ".join(argv or []), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "tasks": tasks, "heldout_tasks": heldout_tasks, "train_seeds": [train_seeds.start, train_seeds.stop - 1],
              "eval_seed": EVAL_SEED, "args": vars(args), "load_average": [os.getloadavg()[0]], "evaluation": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        result = train_ppo(PPOConfig(
            base_model=args.model, serve=True, tasks=tasks, epochs=args.epochs, samples_per_epoch=args.samples_per_epoch,
            ppo_epochs=args.ppo_epochs, batch_size=args.batch_size, lr=args.lr, max_episode_steps=args.turns,
            max_tokens=args.max_tokens, temperature=1.0, lake=str(root / "lake"), output_dir=str(root / "ppo"),
            run_id="bench-os-ppo", seed=args.seed,
        ))
        keys = ("reward", "accuracy", "episodes", "policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl")
        report["curve"] = [{"epoch": h["epoch"], **{k: h["metrics"].get(k) for k in keys}} for h in result.extra["history"]]
        for row in report["curve"]:
            row["se"] = standard_error(row["accuracy"], int(row["episodes"]))
        report["ppo_seconds"] = time.perf_counter() - t0
        report["load_average"].append(os.getloadavg()[0])
        report_path.write_text(json.dumps(report, indent=1) + "\n")  # the curve is kept whatever the rest does
        report["demos_correct"], report["demos"] = demonstrations(root / "demos", tasks, train_seeds)
        sft = train_bc(BCConfig(base_model=args.model, lake=str(root / "demos"), output_dir=str(root / "sft"),
                                max_steps=args.sft_steps, lr=args.sft_lr, seed=args.seed, run_id="bench-os-sft",
                                top_percent=100.0))  # every reference episode, not the top half
        report["sft_rows"] = sft.rows
        report["train_seconds"] = time.perf_counter() - t0
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        if args.eval_episodes:
            task_sets = {"train tasks": tasks, **({"heldout tasks": heldout_tasks} if heldout_tasks else {})}
            adapters = {"start": None, f"ppo-epoch-{args.epochs}": str(result.final_adapter), "sft": str(sft.final_adapter)}
            report["evaluation"] = evaluate(args.model, adapters, task_sets, args.eval_episodes, args.turns, args.max_tokens, root)
        report["load_average"].append(os.getloadavg()[0])
        report["seconds"] = time.perf_counter() - t0
        report_path.write_text(json.dumps(report, indent=1) + "\n")
    from bench.reports.os_ppo import render

    print(render({**report, "file": report_path.name}))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
