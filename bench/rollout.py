"""MiniWoB++ rollout throughput with the random policy, 1 and 2 workers, through ``halo-agent rollout``.

The tasks are every 10th deterministic MiniWoB++ task (13 of 123, a fixed sample not chosen
for speed), each attempted ``rollouts_per_task`` times with one task seed, as a GRPO
sampling run does, with at most 10 steps per episode. Throughput counts resets:

- per worker, over episodes of at least 5 steps: their steps divided by the sum of their
  durations, each from the start of its reset to its last step's end (issue 3's figure);
- per run: every step in the lake divided by the time from the first episode's start to
  the last episode's end (browser start-up excluded). The 2-worker speed-up is the ratio
  of these run figures, measured side by side in one invocation.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.run import mmm

ROOT = Path(__file__).resolve().parent.parent
HALO_AGENT = Path(sys.executable).parent / "halo-agent"
MIN_EPISODE_STEPS = 5


def bench_tasks() -> str:
    from halo_agent.envs.miniwob import NONDETERMINISTIC_TASKS, TASK_PREFIX, task_names

    names = [n for n in task_names() if n not in NONDETERMINISTIC_TASKS]
    return ",".join(TASK_PREFIX + n for n in names[::10])


def available() -> str | None:
    """None when ``halo-agent rollout`` can run, else why not."""
    if not (ROOT / "halo_agent" / "cli.py").exists():
        return "halo_agent/cli.py not present"
    proc = subprocess.run([str(HALO_AGENT), "rollout", "--help"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return f"`halo-agent rollout --help` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    return None


def run_json_command(cmd: list[str]) -> tuple[dict[str, Any], float]:
    """Run a HALO command that prints a JSON summary last; the summary and the command's wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(proc.stderr or proc.stdout)[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def run_rollout(lake: Path, run_id: str, workers: int, rollouts_per_task: int, max_steps: int, tasks: str, pin: bool = True,
                extra: tuple[str, ...] = ()) -> dict[str, Any]:
    cmd = [str(HALO_AGENT), "rollout", "--env", "miniwob", "--tasks", tasks, "--rollouts-per-task", str(rollouts_per_task),
           "--policy", "random", "--seed", "0", "--max-steps", str(max_steps), "--workers", str(workers),
           "--lake", str(lake), "--run-id", run_id, "--no-progress", "--json", *extra]
    if not pin:
        cmd.append("--no-pin-workers")
    summary, wall = run_json_command(cmd)
    from halo_data.lake import Lake

    rows = Lake.open(str(lake)).query_arrow(
        """with e as (
               select episode_id, any_value(n_steps) as n,
                      epoch(any_value(ended_at)) - epoch(any_value(started_at)) as seconds,
                      any_value(started_at) as started_at, any_value(ended_at) as ended_at
               from steps where run_id = $r group by episode_id)
           select sum(n)::bigint as steps, count(*) as episodes,
                  epoch(max(ended_at)) - epoch(min(started_at)) as span,
                  (sum(n) filter (where n >= $m))::bigint as long_steps,
                  count(*) filter (where n >= $m) as long_episodes,
                  sum(seconds) filter (where n >= $m) as long_seconds
           from e""",
        {"r": run_id, "m": MIN_EPISODE_STEPS},
    ).to_pylist()[0]
    per_worker = rows["long_steps"] / rows["long_seconds"] if rows["long_seconds"] else float("nan")
    return {"wall_seconds": wall, "steps": rows["steps"], "episodes": rows["episodes"], "span_seconds": rows["span"],
            "steps_per_second": rows["steps"] / rows["span"] if rows["span"] else float("nan"),
            "steps_per_second_wall": rows["steps"] / wall,
            "long_episodes": rows["long_episodes"], "long_steps": rows["long_steps"],
            "steps_per_second_per_worker_long": per_worker,
            # the sampler's own account: time inside EpisodeWriter (buffering and commits) / the run's wall time
            "lake_share": summary.get("lake_share"), "summary": summary}


def measure(workdir: Path, quick: bool = False, repeats: int = 2) -> dict[str, Any]:
    why = available()
    if why:
        return {"skipped": why}
    from halo_data.lake import Lake

    shutil.rmtree(workdir, ignore_errors=True)
    lake = workdir / "lake"
    Lake.init(str(lake))
    tasks = bench_tasks()
    k = 2 if quick else 4
    out: dict[str, Any] = {"tasks": tasks, "rollouts_per_task": k, "max_steps": 10, "workers": {}}
    # 1 worker, 2 workers (each pinned to a CPU, the default) and 2 unpinned workers take
    # turns, so all three see the same machine.
    configs = {"1": (1, True), "2": (2, True), "2-unpinned": (2, False)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r in range(1 if quick else repeats):
        for name, (workers, pin) in configs.items():
            runs[name].append(run_rollout(lake, f"bench-w{name}-{r}", workers, k, 10, tasks, pin=pin))
    for workers, done in runs.items():
        out["workers"][workers] = {
            "steps": sum(r["steps"] for r in done),
            "long_episodes": sum(r["long_episodes"] for r in done),
            "runs": done,
            "steps_per_second": mmm([r["steps_per_second"] for r in done]),
            "steps_per_second_per_worker_long": mmm([r["steps_per_second_per_worker_long"] for r in done]),
        }
    out["speedups_2_workers"] = [b["steps_per_second"] / a["steps_per_second"] for a, b in zip(runs["1"], runs["2"])]
    out["speedups_2_workers_unpinned"] = [b["steps_per_second"] / a["steps_per_second"] for a, b in zip(runs["1"], runs["2-unpinned"])]
    shares = [r["lake_share"] for w in out["workers"].values() for r in w["runs"] if r.get("lake_share") is not None]
    if shares:
        out["lake_share"] = mmm(shares)
    one = out["workers"]["1"]["steps_per_second"]["median"]
    out["step_seconds"] = 1.0 / one if one else None
    out["speedup_2_workers"] = statistics.median(out["speedups_2_workers"])
    shutil.rmtree(workdir, ignore_errors=True)
    return out
