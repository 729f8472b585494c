"""Ray against the local worker pool: the same MiniWoB++ tasks, the same 2 workers, side by side.

    python -m bench ray [--repeats 2] [--rollouts-per-task 2]

Both run ``halo-agent rollout`` with the random policy over ``bench.rollout``'s task sample,
taking turns so they see the same machine: ``--workers 2`` (spawned processes; the parent
writes) and ``--workers 2 --ray-address local`` (a Ray instance started for the run with 2
CPUs; each Ray worker writes its own episodes). Throughput is every step in the lake over
the time from the first episode's start to the last one's end, so Ray's start-up (a few
seconds) is left out of both, and given separately as the runs' wall time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.reports import save
from bench.rollout import available, bench_tasks, run_rollout
from bench.run import mmm

CONFIGS = {"pool": (), "ray": ("--ray-address", "local")}


def measure(workdir: Path, repeats: int, rollouts_per_task: int, max_steps: int = 10) -> dict:
    from halo_data.lake import Lake

    shutil.rmtree(workdir, ignore_errors=True)
    lake = workdir / "lake"
    Lake.init(str(lake))
    tasks = bench_tasks()
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for r in range(repeats):
        for name, extra in CONFIGS.items():
            runs[name].append(run_rollout(lake, f"bench-{name}-{r}", 2, rollouts_per_task, max_steps, tasks, extra=extra))
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "tasks": tasks, "rollouts_per_task": rollouts_per_task, "max_steps": max_steps, "workers": 2,
        "steps_per_second": {name: mmm([x["steps_per_second"] for x in done]) for name, done in runs.items()},
        "wall_seconds": {name: mmm([x["wall_seconds"] for x in done]) for name, done in runs.items()},
        "ray_over_pool": [b["steps_per_second"] / a["steps_per_second"] for a, b in zip(runs["pool"], runs["ray"])],
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench ray", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rollouts-per-task", type=int, default=2)
    a = ap.parse_args(argv)
    why = available()
    if why:
        raise SystemExit(f"cannot run rollouts: {why}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="halo-bench-ray-") as tmp:
        result = measure(Path(tmp) / "work", a.repeats, a.rollouts_per_task)
    steps = result["runs"]["pool"][0]["steps"]
    print(f"{len(result['tasks'].split(','))} tasks x {a.rollouts_per_task} attempts, 2 workers, {a.repeats} runs each "
          f"(~{steps} steps a run); min / median / max")
    print("                   steps/s (episodes' span)   wall s (with start-up)")
    for name in CONFIGS:
        sps, wall = result["steps_per_second"][name], result["wall_seconds"][name]
        print(f"{name:<18} {sps['min']:6.1f} / {sps['median']:5.1f} / {sps['max']:5.1f}      "
              f"{wall['min']:5.1f} / {wall['median']:5.1f} / {wall['max']:5.1f}")
    ratios = result["ray_over_pool"]
    print(f"ray / pool, side by side: {', '.join(f'{x:.2f}x' for x in ratios)}")
    result["seconds"] = time.perf_counter() - t0
    out = save("ray", result, argv)
    print(f"{time.perf_counter() - t0:.0f} s; results in {out}")
