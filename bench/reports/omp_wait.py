"""OpenMP's wait (`python -m bench omp-wait`): a LoRA training step under libgomp's default, PASSIVE and a short spin."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def _label(name: str, spincount: int) -> str:
    policy, _, beside = name.partition("-")
    what = {"default": "libgomp's default (spin 300,000)", "passive": "OMP_WAIT_POLICY=PASSIVE",
            "spin": f"GOMP_SPINCOUNT={spincount}"}[policy]
    return f"{what}, {'beside a neighbour' if beside else 'alone'}"


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows, lines = [], []
    for run in runs:
        if run.get("work", "train") == "train":
            measured = f"LoRA training: {run['rounds']} × {run['steps'] - 1} steps of {run['rows']} × {run['tokens']} tokens"
        else:
            measured = (f"decode: {run['rounds']} × {run['steps'] - 1} tokens of {run['rows']} row(s) "
                        f"on a {run['tokens']}-token cache")
        for name, arm in run["arms"].items():
            rows.append([run["date"], _label(name, run["spincount"]), _seconds(arm["wall_per_step"]), _seconds(arm["cpu_per_step"]),
                         arm["threads"], measured, f"`{run['command']}`"])
        names = {"passive/default": "PASSIVE / default", "spin/default": f"spin {run['spincount']} / default"}
        ratios = "; ".join(f"{names[key]}: alone {r['alone']}×, beside a neighbour {r['beside']}×"
                           for key, r in run["ratios"].items())
        work = "LoRA training" if run.get("work", "train") == "train" else "decode"
        lines.append(f"- {work}, seconds per step, {ratios}; {run['model']}; load {run['load_before'][0]:.1f} before, "
                     f"{run['load_after'][0]:.1f} after; " + provenance(run))
    return table(["date", "OpenMP wait", "s per step", "CPU-s per step", "torch threads", "measured", "command"], rows) \
        + "\n" + "\n".join(lines) + "\n"
