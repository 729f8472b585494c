"""How far AdamW moves the weights in one update: a fresh optimizer per update against one kept across updates.

    .venv/bin/python -m bench adam-steps                                  # a few seconds
    .venv/bin/python -m bench adam-steps --snr 0,0.2 --steps 8,14,28      # other ratios and step counts

``python -m bench online-learner`` measured the persistent learner's adapter moving about 2x as far per iteration
as a job per update, with 3.5x the optimizer steps. AdamW's step is the learning rate times m̂ / (√v̂ + eps): a
fresh optimizer's first step moves every parameter by the whole rate, whatever the gradient's scale, while a warmed
one's v remembers the gradients' noise, so on noisy gradients each of its steps moves a fraction of that. This
measures it with torch's AdamW (as HALO's learner and TRL's jobs use it, weight decay 0) on gradients of a known
signal-to-noise ratio: every parameter's gradient is ``snr`` times a fixed direction plus fresh unit noise.

Side by side in one run, for each ratio, over ``--updates`` updates from the same start and gradients drawn from
the same seeds:
- ``job``: each update a fresh AdamW, ``--job-steps`` steps with the rate decaying linearly to 0 (a ``halo-train
  grpo`` job under TRL's default schedule: learning-v1's online updates, 4 steps);
- ``persistent``, for each of ``--steps``: one AdamW across the updates, that many steps per update at a constant
  rate; its first update starts fresh, like a job's, and the later ones are its steady state.

The result: the mean displacement per update (L2 norm of the change, in units of the learning rate), the
persistent learner's first update apart, and the ratio persistent (steady) / job.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def displacements(snr: float, steps: int, *, fresh_each_update: bool, updates: int, params: int, seed: int) -> list[float]:
    """Each update's displacement (||Δw|| / lr) under AdamW on gradients ``snr * direction + noise``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    direction = torch.randn(params, generator=gen)
    weight = torch.nn.Parameter(torch.zeros(params))
    lr = 1.0  # displacements in units of the rate: AdamW's step is linear in it (eps aside)

    def optimizer():
        opt = torch.optim.AdamW([weight], lr=lr, weight_decay=0.0)
        decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1 - k / steps)) if fresh_each_update else None
        return opt, decay

    opt, decay = optimizer()
    out = []
    for _ in range(updates):
        if fresh_each_update:
            opt, decay = optimizer()
        before = weight.detach().clone()
        for _ in range(steps):
            weight.grad = snr * direction + torch.randn(params, generator=gen)
            opt.step()
            if decay is not None:
                decay.step()
        out.append(float((weight.detach() - before).norm()) / lr)
    return out


def measure(snrs: list[float], steps: list[int], job_steps: int, updates: int, params: int, seeds: int) -> list[dict[str, Any]]:
    rows = []
    for snr in snrs:
        job = [d for s in range(seeds) for d in displacements(snr, job_steps, fresh_each_update=True, updates=updates,
                                                              params=params, seed=s)]
        row: dict[str, Any] = {"snr": snr, "job_steps": job_steps, "job": statistics.mean(job), "persistent": {}}
        for n in steps:
            runs = [displacements(snr, n, fresh_each_update=False, updates=updates, params=params, seed=s) for s in range(seeds)]
            first = statistics.mean(r[0] for r in runs)
            steady = statistics.mean(d for r in runs for d in r[1:])
            row["persistent"][str(n)] = {"first": first, "steady": steady, "ratio": steady / row["job"]}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    from bench.reports import save

    ap = argparse.ArgumentParser(prog="python -m bench adam-steps", description=__doc__.splitlines()[0])
    ap.add_argument("--snr", default="0,0.1,0.2,0.3,1", help="Signal-to-noise ratios of the gradients.")
    ap.add_argument("--steps", default="14,28", help="The persistent learner's optimizer steps per update.")
    ap.add_argument("--job-steps", type=int, default=4, help="A job's optimizer steps (the rate decaying to 0).")
    ap.add_argument("--updates", type=int, default=10, help="Updates per run.")
    ap.add_argument("--params", type=int, default=20000, help="Parameters (the displacement grows with their square root).")
    ap.add_argument("--seeds", type=int, default=3, help="Runs per arm, each its own gradients.")
    a = ap.parse_args(argv)
    try:
        snrs = [float(x) for x in a.snr.split(",") if x.strip()]
        steps = [int(x) for x in a.steps.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"Error: --snr takes numbers and --steps integers, comma-separated; got {a.snr!r} and {a.steps!r}") from None
    if not snrs or not steps or min(steps) < 1 or a.job_steps < 1 or a.updates < 2 or a.params < 1 or a.seeds < 1:
        raise SystemExit("Error: --snr and --steps need values, steps at least 1, --updates at least 2")
    import torch

    torch.set_num_threads(1)
    t = time.perf_counter()
    rows = measure(snrs, steps, a.job_steps, a.updates, a.params, a.seeds)
    for row in rows:
        print(f"snr {row['snr']:g}: job ({row['job_steps']} fresh steps) {row['job']:.1f}; " + "; ".join(
            f"persistent {n} steps {p['steady']:.1f} ({p['ratio']:.2f}x; first update {p['first']:.1f})"
            for n, p in row["persistent"].items()), flush=True)
    path = save("adam-steps", {"rows": rows, "updates": a.updates, "params": a.params, "seeds": a.seeds,
                               "seconds": time.perf_counter() - t}, argv)
    print(f"results: {path}")
