"""os PPO against SFT on the same train seeds (`python -m bench os-ppo`): the PPO arm's curve, and each arm on unseen seeds and tasks."""

from __future__ import annotations

import math
import pathlib

from bench.reports import load_runs, table


def _accuracy(cell: dict) -> str:
    return f"{cell['correct']}/{cell['episodes']} = {cell['accuracy']:.0%} ± {cell['se']:.0%}"


def setup(result: dict) -> str:
    """One run's setup in a sentence."""
    args = result["args"]
    return (f"{result['date']}: policy `{args['model']}`, train tasks {', '.join(result['tasks'])} on train seeds "
            f"{result['train_seeds'][0]}–{result['train_seeds'][1]}; PPO {args['epochs']} epochs × {args['samples_per_epoch']} "
            f"samples, {args['ppo_epochs']} passes, batch {args['batch_size']}, lr {args['lr']:g}, {args['turns']} command(s) per "
            f"episode; SFT control: {args['sft_steps']} steps at lr {args['sft_lr']:g} on the reference episodes of the same seeds "
            f"({result.get('demos_correct', '?')} of {result.get('demos', '?')} judged correct, {result.get('sft_rows', '?')} rows); "
            f"held-out tasks {', '.join(result['heldout_tasks']) or 'none'}; evaluation on task seeds from {result['eval_seed']} at "
            f"temperature 1; 1-minute load {' / '.join(f'{x:.1f}' for x in result['load_average'])} on 2 shared CPUs, "
            f"{result.get('seconds', result.get('train_seconds', 0)) / 60:.0f} min; `bench/results/os-ppo/{result.get('file', '?')}`")


def curve(result: dict) -> str:
    """The PPO arm: each epoch's sampled episodes (train seeds), with the weights after the epoch before."""
    command = f"`{result['command'].strip()}`"
    rows = [[r["epoch"], f"{r['accuracy']:.0%} ± {r['se']:.0%} ({int(r['episodes'])})", f"{r['reward']:+.3f}", f"{r['policy_loss']:.4f}",
             f"{r['value_loss']:.4f}", f"{r['entropy']:.3f}", f"{r['clip_fraction']:.3f}", f"{r['approx_kl']:.4f}", command]
            for r in result["curve"]]
    return table(["PPO epoch", "accuracy (its samples)", "mean reward", "policy loss", "value loss", "entropy", "clip fraction",
                  "approx KL", "command"], rows)


def evaluation(result: dict) -> str:
    """Each model on unseen seeds of the train tasks and of the held-out tasks; the trained ones against the start."""
    cells = result.get("evaluation") or {}
    if not cells:
        return ""
    sets = list(next(iter(cells.values())))
    start = cells.get("start")
    rows = []
    for label, by_set in cells.items():
        against = []
        for s in sets:
            if start and label != "start":
                d, se = by_set[s]["accuracy"] - start[s]["accuracy"], math.hypot(by_set[s]["se"], start[s]["se"])
                against.append(f"{s} {100 * d:+.0f} ± {100 * se:.0f}")
        rows.append([label, *(_accuracy(by_set[s]) for s in sets), "; ".join(against) or "", f"`{result['command'].strip()}`"])
    return table(["model", *(f"{s}, unseen seeds" for s in sets), "points against the start", "command"], rows)


def render(result: dict) -> str:
    return "\n".join(part for part in (f"- {setup(result)}\n", curve(result), evaluation(result)) if part)


def report(results_dir: pathlib.Path) -> str:
    """Every run under ``results_dir``, oldest first."""
    return "\n".join(render(r) for r in load_runs(results_dir) if r.get("curve"))
