"""os PPO against SFT on the same train seeds: the PPO training curve, and each arm on unseen seeds and unseen tasks."""

from __future__ import annotations

import json
import math
import pathlib


def _accuracy(cell: dict) -> str:
    return f"{cell['correct']}/{cell['episodes']} = {cell['accuracy']:.0%} ± {cell['se']:.0%}"


def render(result: dict) -> str:
    """One run: its setup, the per-epoch curve of the PPO arm, and the evaluation table."""
    args = result["args"]
    lines = [
        f"**{result['date']}**, `{result['command'].strip()}`: policy `{args['model']}`, train tasks {', '.join(result['tasks'])} on "
        f"train seeds {result['train_seeds'][0]}–{result['train_seeds'][1]}; PPO {args['epochs']} epochs × {args['samples_per_epoch']} "
        f"samples, {args['ppo_epochs']} passes, batch {args['batch_size']}, lr {args['lr']:g}, {args['turns']} command(s) per episode; "
        f"SFT control: {args['sft_steps']} steps at lr {args['sft_lr']:g} on the reference episodes of the same seeds "
        f"({result.get('demos_correct', '?')} of {result.get('demos', '?')} judged correct, {result.get('sft_rows', '?')} rows); "
        f"1-minute load {' / '.join(f'{x:.1f}' for x in result['load_average'])} on 2 shared CPUs, "
        f"{result.get('seconds', result.get('train_seconds', 0)) / 60:.0f} min in all.",
        "",
        "| PPO epoch | accuracy (its own samples) | mean reward | policy loss | value loss | entropy | clip fraction | approx KL |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["curve"]:
        lines.append(f"| {r['epoch']} | {r['accuracy']:.0%} ± {r['se']:.0%} ({int(r['episodes'])}) | {r['reward']:+.3f} | "
                     f"{r['policy_loss']:.4f} | {r['value_loss']:.4f} | {r['entropy']:.3f} | {r['clip_fraction']:.3f} | {r['approx_kl']:.4f} |")
    evaluation = result.get("evaluation") or {}
    if evaluation:
        sets = list(next(iter(evaluation.values())))
        lines += ["", f"Evaluation on unseen task seeds (from {result['eval_seed']}), temperature 1"
                  + (f"; held-out tasks: {', '.join(result['heldout_tasks'])}" if result.get("heldout_tasks") else "") + ":", "",
                  "| model | " + " | ".join(sets) + " |", "| --- |" + " ---: |" * len(sets)]
        for label, cells in evaluation.items():
            lines.append(f"| {label} | " + " | ".join(_accuracy(cells[s]) for s in sets) + " |")
        start = evaluation.get("start")
        if start:
            for label, cells in evaluation.items():
                if label == "start":
                    continue
                diffs = []
                for s in sets:
                    d, se = cells[s]["accuracy"] - start[s]["accuracy"], math.hypot(cells[s]["se"], start[s]["se"])
                    diffs.append(f"{s} {100 * d:+.0f} ± {100 * se:.0f} points")
                lines.append(f"\n{label} against the start: " + "; ".join(diffs) + ".")
    return "\n".join(lines) + "\n"


def report(results_dir: pathlib.Path) -> str:
    """Every run under ``results_dir``, oldest first."""
    runs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(results_dir).glob("*.json"))]
    return "\n".join(render(r) for r in runs if r.get("curve"))
