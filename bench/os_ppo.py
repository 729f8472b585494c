"""Learning evidence for ``halo-train ppo``: reward per PPO epoch on os tasks that one short command solves (CPU, tiny model).

    OMP_NUM_THREADS=1 python -m bench os-ppo [--epochs 12] [--samples-per-epoch 64] [--lr 5e-4] [--heldout 128]

1. Demonstrations: each task's reference solution played through the real os environment (a fresh
   sandbox, the task's own evaluation) as ``Act: bash`` + ``Act: finish``, into a lake.
2. The tiny model (``halo-train make-tiny-model``) is fine-tuned on those demonstrations' ``bc_rows``
   (``--warmup-steps``), which pair each task's prompt with its solution and with a distractor
   (``--distractor generic``: a command that solves no task; ``other-task``: another task's solution):
   the warm-up model answers in the format, right part of the time and wrong the rest (a reward
   spread for PPO to work on; never a start that already solves).
3. ``halo-train ppo --serve`` on the same tasks: each epoch samples ``--samples-per-epoch`` one-command
   episodes (``--turns 1``: the command is evaluated at the round limit) with the current adapter through
   HALO's chat server, then updates. The reward and accuracy of the episodes each epoch sampled (with
   the weights after the previous epoch) are the curve; each accuracy comes with its binomial standard
   error sqrt(p (1 - p) / n).
4. Held out (``--heldout N``): the warm-up model (epoch 0) and the final adapter each answer N fresh
   episodes (seeds no epoch sampled with) through the same chat server; their accuracies and the
   difference's standard error.

The tasks are those whose answer is short in the tiny model's tokens (its 512-entry vocabulary spells
most paths byte by byte; ``useradd alice`` in the answer format is 26 tokens, ``mkdir -p
/srv/data/2024/logs`` 47): a long command sampled at temperature 1 is garbled more often, which
flattens the reward spread. Prints the curve, writes ``bench/results/os-ppo-<time>.json`` and adds
the run at the end of bench/README.md's os-PPO section (``--no-readme``: print only). A run is one seed: the figures move
between runs, and the curve is reported as it came out.
"""

from __future__ import annotations

import argparse
import logging
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

TASKS = ("os.users-add", "os.users-group-add", "os.files-create-empty", "os.users-delete")
DISTRACTORS = ("other-task", "generic")
GENERIC_COMMANDS = ("ls -la", "pwd", "whoami", "id")  # commands that solve none of the tasks
DISTRACTOR_TEXT = {"other-task": "another task's command", "generic": "a command that solves no task: " + ", ".join(GENERIC_COMMANDS)}
HELDOUT_SEED = 10_000  # far above the seeds the epochs sample with (seed + epoch)


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


def demonstrations(lake_dir: Path, tasks: list[str], distractor: str = "other-task") -> int:
    """Per task, two episodes into a lake: its reference solution, and a distractor judged incorrect by
    this task's evaluation: ``other-task``, the next task's solution (each command is right for one
    task and wrong for another, so only a policy that reads the instruction gains); ``generic``, a
    command that solves no task (``ls -la``, ``pwd``, ``whoami``, ``id``, one per task in turn). The
    distractor is filed under the task id ``<task>-distractor`` with the task's own prompt, so
    ``bc_rows`` (the best episodes per task) keeps both and the warm-up model learns to answer
    either: a policy that is right part of the time, for PPO to improve on. Returns how many
    reference episodes the evaluation judged correct."""
    from halo_agent.envs.os_env import OSEnv
    from halo_agent.rewards import RewardConfig
    from halo_agent.rollout import EpisodeRunner, RolloutConfig, plan_episodes
    from halo_data.lake import Lake
    from halo_data.writer import EpisodeWriter

    specs = [t for t in OSEnv.list_tasks() if t.task_id in tasks]
    solutions = {t.task_id: t.extra["solution"]["script"] for t in specs}
    if distractor not in DISTRACTORS:
        raise ValueError(f"distractor {distractor!r}: choose one of {', '.join(DISTRACTORS)}")
    if distractor == "other-task":
        distractors = {t.task_id: solutions[specs[(i + 1) % len(specs)].task_id] for i, t in enumerate(specs)}
    else:
        distractors = {t.task_id: GENERIC_COMMANDS[i % len(GENERIC_COMMANDS)] for i, t in enumerate(specs)}
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


def standard_error(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def heldout(base_model: str, adapters: dict[str, str | None], tasks: list[str], samples: int, turns: int, max_tokens: int,
            root: Path) -> dict[str, dict]:
    """Accuracy of each adapter (None: the base model) on ``samples`` fresh episodes, sampled at temperature 1."""
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.online import open_engine
    from halo_train.ppo import PPOConfig

    cfg = PPOConfig(base_model=base_model, serve=True, tasks=tasks)
    results = {}
    with open_engine(cfg, root) as (engine, base_name):
        for label, path in adapters.items():
            served = None
            if path is not None:
                served = f"heldout-{label}"
                swap = engine.swap_adapter(served, str(Path(path).resolve()), retire=None)
                if not swap.loaded:
                    raise RuntimeError(f"the chat server refused {path}: {swap.message}")
            summary = run_rollouts(RolloutConfig(
                env="os", tasks=list(tasks), rollouts_per_task=max(1, math.ceil(samples / len(tasks))), policy="openai",
                model=base_name, adapter=served, policy_version=label, policy_options={"base_url": engine.base_url, "max_tokens": max_tokens},
                temperature=1.0, seed=HELDOUT_SEED, max_steps=turns, lake=str(root / "heldout"), run_id=f"heldout-{label}",
                env_options={"max_rounds": turns}, command="bench os-ppo",
            ))
            n = summary.episodes_written
            accuracy = summary.successes / n if n else float("nan")
            results[label] = {"episodes": n, "correct": summary.successes, "accuracy": accuracy, "se": standard_error(accuracy, n)}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench os-ppo")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--warmup-steps", type=int, default=120)
    parser.add_argument("--samples-per-epoch", type=int, default=64)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--value-lr", type=float, default=None, help="the value head's learning rate (default: --lr)")
    parser.add_argument("--turns", type=int, default=1, help="commands per episode (the os environment's round limit)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--heldout", type=int, default=128, help="fresh episodes for the warm-up model and the final adapter each (0: none)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--distractor", choices=DISTRACTORS, default="generic",
                        help="the warm-up's wrong answer per task: another task's solution, or a command that solves none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-readme", action="store_true", help="print the section, do not append it to bench/README.md")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]

    import torch

    from halo_train.ppo import PPOConfig, train_ppo
    from halo_train.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    report_path = results / f"os-ppo-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"tasks": tasks, "args": vars(args), "load_average": [os.getloadavg()[0]], "heldout": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        report["demos_correct"] = demonstrations(root / "demos", tasks, args.distractor)
        tiny = build_tiny_model(root / "tiny", warmup_lake=root / "demos", steps=args.warmup_steps, seed=args.seed)
        result = train_ppo(PPOConfig(
            base_model=str(tiny), serve=True, tasks=tasks, epochs=args.epochs, samples_per_epoch=args.samples_per_epoch,
            ppo_epochs=args.ppo_epochs, batch_size=args.batch_size, lr=args.lr, value_lr=args.value_lr, max_episode_steps=args.turns,
            max_tokens=args.max_tokens, temperature=1.0, lake=str(root / "lake"), output_dir=str(root / "out"),
            run_id="bench-os-ppo", seed=args.seed,
        ))
        keys = ("reward", "accuracy", "episodes", "policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl", "explained_variance")
        report["curve"] = [{"epoch": h["epoch"], **{k: h["metrics"].get(k) for k in keys}} for h in result.extra["history"]]
        for row in report["curve"]:
            row["se"] = standard_error(row["accuracy"], int(row["episodes"]))
        report["train_seconds"] = report["seconds"] = time.perf_counter() - t0
        report["load_average"].append(os.getloadavg()[0])
        report_path.write_text(json.dumps(report, indent=2))  # the curve is kept whatever the held-out part does
        if args.heldout:
            report["heldout"] = heldout(str(tiny), {"epoch_0": None, f"epoch_{args.epochs}": str(result.final_adapter)}, tasks,
                                        args.heldout, args.turns, args.max_tokens, root)
            report["load_average"].append(os.getloadavg()[0])
            report["seconds"] = time.perf_counter() - t0
            report_path.write_text(json.dumps(report, indent=2))
    text = render(report)
    if args.no_readme:
        print(text)
        return report
    print(text)
    publish_in_section(text)
    return report


SECTION = "## os PPO: reward per epoch, tiny model on CPU"


def publish_in_section(text: str, readme: Path = Path(__file__).resolve().parent / "README.md") -> None:
    """Add a run's text at the end of bench/README.md's os-PPO section (before the next ``## `` heading)."""
    lines = readme.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(SECTION)), None)
    if start is None:
        lines += ["\n", SECTION + "\n", "\n"]
        start = len(lines) - 2
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    lines[end:end] = [text.rstrip("\n") + "\n", "\n"]
    readme.write_text("".join(lines))


def _in_standard_errors(difference: float, se: float) -> str:
    return f"{difference / se:+.1f} standard errors" if se > 0 else "no spread to measure it against"


def render(report: dict) -> str:
    args, curve = report["args"], report["curve"]
    first, last = curve[0], curve[-1]
    rise, rise_se = last["accuracy"] - first["accuracy"], math.hypot(first["se"], last["se"])
    lines = [
        f"### os PPO run ({time.strftime('%Y-%m-%d %H:%M')}, `python -m bench os-ppo`)",
        "",
        f"Tasks ({len(report['tasks'])}): {', '.join(report['tasks'])}. Warm-up: {args['warmup_steps']} SFT steps on each task's "
        f"reference episode ({report['demos_correct']} of {len(report['tasks'])} judged correct in the sandbox) and a distractor "
        f"episode ({DISTRACTOR_TEXT[args['distractor']]}, same prompt). PPO: {args['epochs']} epochs × {args['samples_per_epoch']} samples, "
        f"{args['turns']} command(s) per episode, max {args['max_tokens']} tokens, {args['ppo_epochs']} PPO passes, batch "
        f"{args['batch_size']}, lr {args['lr']:g}, temperature 1, seed {args['seed']}; training {report['train_seconds'] / 60:.1f} min, "
        f"all {report['seconds'] / 60:.1f} min, 1-minute load average {' / '.join(f'{x:.1f}' for x in report['load_average'])} "
        "(start / after training / end) on 2 shared CPUs. Each epoch's figures are those of the episodes it sampled, with the "
        "weights after the epoch before (epoch 1: the warm-up model); ± is the binomial standard error.",
        "",
        "| epoch | accuracy | mean episode reward | policy loss | value loss | entropy | clip fraction | approx KL | explained var. |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in curve:
        lines.append(f"| {r['epoch']} | {r['accuracy']:.0%} ± {r['se']:.0%} | {r['reward']:+.3f} | {r['policy_loss']:.4f} | "
                     f"{r['value_loss']:.4f} | {r['entropy']:.3f} | {r['clip_fraction']:.3f} | {r['approx_kl']:.4f} | "
                     f"{r['explained_variance']:.2f} |")
    lines += ["", f"Epoch {last['epoch']} against epoch 1: {100 * rise:+.0f} ± {100 * rise_se:.0f} points ({_in_standard_errors(rise, rise_se)})."]
    tail = curve[-min(4, len(curve) - 1):] if len(curve) > 1 else []
    if tail:
        n = sum(int(r["episodes"]) for r in tail)
        pooled = sum(r["accuracy"] * int(r["episodes"]) for r in tail) / n
        gain, gain_se = pooled - first["accuracy"], math.hypot(first["se"], standard_error(pooled, n))
        lines[-1] += (f" The last {len(tail)} epochs pooled ({n} episodes): {pooled:.0%} ± {standard_error(pooled, n):.0%}, "
                      f"{100 * gain:+.0f} ± {100 * gain_se:.0f} points against epoch 1 ({_in_standard_errors(gain, gain_se)}).")
    if report["heldout"]:
        (a_label, a), (b_label, b) = report["heldout"].items()
        diff, diff_se = b["accuracy"] - a["accuracy"], math.hypot(a["se"], b["se"])
        lines.append(f"Held out ({a['episodes']} fresh episodes each): {a_label} {a['correct']}/{a['episodes']} = {a['accuracy']:.0%} ± "
                     f"{a['se']:.0%}, {b_label} {b['correct']}/{b['episodes']} = {b['accuracy']:.0%} ± {b['se']:.0%}: "
                     f"{100 * diff:+.0f} ± {100 * diff_se:.0f} points ({_in_standard_errors(diff, diff_se)}).")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
