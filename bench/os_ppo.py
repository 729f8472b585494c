"""Learning evidence for ``halo-train ppo``: reward per PPO epoch on os tasks that one short command solves (CPU, tiny model).

    python -m bench os-ppo [--epochs 6] [--warmup-steps 40] [--tasks a,b,...]

1. Demonstrations: each task's reference solution played through the real os environment (a fresh
   sandbox, the task's own evaluation) as ``Act: bash`` + ``Act: finish``, into a lake.
2. The tiny model (``halo-train make-tiny-model``) is fine-tuned on those demonstrations' ``bc_rows``
   (``--warmup-steps``), which pair each task's prompt with its solution and with a distractor (another
   task's solution): the warm-up model answers in the format, right about half the time.
3. ``halo-train ppo --serve`` on the same tasks: each epoch samples ``--samples-per-epoch`` episodes
   with the current adapter through HALO's chat server, then updates. The reward and accuracy of the
   episodes each epoch sampled (with the weights after the previous epoch) are the curve.

Prints the curve and appends it to bench/README.md. A run is one seed: the figures move between
runs, and the curve is reported as it came out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

TASKS = ("os.users-add", "os.users-group-add", "os.files-make-dirs", "os.perms-executable")


class ReferencePolicy:
    """Answers a task's reference solution, then finishes."""

    name = "reference"
    model = adapter = None
    policy_version = "reference"
    uses_screenshot = False

    def __init__(self, solutions: dict[str, str]):
        self.solutions = solutions

    def reset(self, seed):
        pass

    def act(self, obs):
        from halo_agent.envs.os_env import FINISH, agent_turn
        from halo_agent.types import PolicyOutput

        action = self.solutions[obs.task_id] if obs.step_idx == 0 else FINISH
        return PolicyOutput(model_output=agent_turn(action), action=action, action_source="model")

    def close(self):
        pass


def demonstrations(lake_dir: Path, tasks: list[str]) -> int:
    """Per task, two episodes into a lake: its reference solution, and a distractor (the next task's
    solution, judged incorrect by this task's evaluation). The distractor is filed under the task id
    ``<task>-distractor`` with the task's own prompt, so ``bc_rows`` (the best episodes per task)
    keeps both and the warm-up model learns to answer either: a policy that is right about half the
    time, for PPO to improve on. Returns how many reference episodes the evaluation judged correct."""
    from halo_agent.envs.os_env import OSEnv
    from halo_agent.rewards import RewardConfig
    from halo_agent.rollout import EpisodeRunner, RolloutConfig, plan_episodes
    from halo_data.lake import Lake
    from halo_data.writer import EpisodeWriter

    specs = [t for t in OSEnv.list_tasks() if t.task_id in tasks]
    solutions = {t.task_id: t.extra["solution"]["script"] for t in specs}
    distractors = {t.task_id: solutions[specs[(i + 1) % len(specs)].task_id] for i, t in enumerate(specs)}
    config = RolloutConfig(env="os", tasks=list(tasks), lake=str(lake_dir), run_id="demos")
    env = OSEnv()
    writer = EpisodeWriter(Lake.init(lake_dir))
    correct = 0
    try:
        for answers, suffix in ((solutions, ""), (distractors, "-distractor")):
            runner = EpisodeRunner(config, "demos", env, ReferencePolicy(answers), RewardConfig.load())
            for spec in plan_episodes(config, "demos", specs):
                result = runner.run(spec)
                correct += bool(result.episode.success) and not suffix
                episode = result.episode.replace(task_id=result.episode.task_id + suffix)
                writer.write_episode(episode, result.steps)
    finally:
        writer.close()
        env.close()
    return correct


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench os-ppo")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=120)
    parser.add_argument("--samples-per-epoch", type=int, default=12)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]

    from halo_train.ppo import PPOConfig, train_ppo
    from halo_train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demos = demonstrations(root / "demos", tasks)
        tiny = build_tiny_model(root / "tiny", warmup_lake=root / "demos", steps=args.warmup_steps, seed=args.seed)
        result = train_ppo(PPOConfig(
            base_model=str(tiny), serve=True, tasks=tasks, epochs=args.epochs, samples_per_epoch=args.samples_per_epoch,
            ppo_epochs=2, batch_size=8, lr=args.lr, max_episode_steps=2, max_tokens=32, lake=str(root / "lake"),
            output_dir=str(root / "out"), run_id="bench-os-ppo", seed=args.seed,
        ))
    curve = [(h["epoch"], h["metrics"]["reward"], h["metrics"]["accuracy"], h["metrics"]["policy_loss"], h["metrics"]["value_loss"])
             for h in result.extra["history"]]
    report = {"tasks": tasks, "demos_correct": demos, "curve": curve, "seconds": time.perf_counter() - t0, "args": vars(args),
              "load_average": os.getloadavg()[0]}
    from bench.os_env import publish

    return publish(report, render(report))


def render(report: dict) -> str:
    args = report["args"]
    lines = [
        f"## os PPO: reward per epoch, tiny model on CPU ({time.strftime('%Y-%m-%d')}, `python -m bench os-ppo`)",
        "",
        f"Tasks ({len(report['tasks'])}, one short command each): {', '.join(report['tasks'])}. "
        f"Warm-up: {args['warmup_steps']} SFT steps on each task's reference episode ({report['demos_correct']} judged correct by the "
        f"task's evaluation in the sandbox) and a distractor episode (another task's command, same prompt). PPO: {args['epochs']} epochs × {args['samples_per_epoch']} samples, 2 PPO passes, "
        f"batch 8, lr {args['lr']}, 2 turns per episode, temperature 1, seed {args['seed']}; "
        f"{report['seconds'] / 60:.1f} min at load average {report['load_average']:.1f} on 2 CPUs. "
        "Each epoch's figures are those of the episodes it sampled, with the weights after the epoch before (epoch 1: the warm-up model).",
        "",
        "| epoch | mean episode reward | accuracy | policy loss | value loss |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for epoch, reward, accuracy, policy_loss, value_loss in report["curve"]:
        lines.append(f"| {epoch} | {reward:+.3f} | {accuracy:.0%} | {policy_loss:.4f} | {value_loss:.4f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
