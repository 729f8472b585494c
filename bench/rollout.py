"""MiniWoB++ rollout throughput with the random policy, 1 and 2 workers, through ``halo-agent rollout``.

Throughput counts resets: steps in the lake divided by the time from the first
episode's start to the last episode's end (browser start-up excluded), and also
by the whole command's wall time.
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

ROOT = Path(__file__).resolve().parent.parent
HALO_AGENT = Path(sys.executable).parent / "halo-agent"
TASKS = "miniwob.click-checkboxes,miniwob.enter-text,miniwob.click-tab-2,miniwob.choose-list"


def available() -> str | None:
    """None when ``halo-agent rollout`` can run, else why not."""
    if not (ROOT / "halo_agent" / "cli.py").exists():
        return "halo_agent/cli.py not present"
    proc = subprocess.run([str(HALO_AGENT), "rollout", "--help"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return f"`halo-agent rollout --help` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    return None


def run_rollout(lake: Path, run_id: str, workers: int, rollouts_per_task: int, max_steps: int, tasks: str = TASKS) -> dict[str, Any]:
    cmd = [str(HALO_AGENT), "rollout", "--env", "miniwob", "--tasks", tasks, "--rollouts-per-task", str(rollouts_per_task),
           "--policy", "random", "--seed", "0", "--max-steps", str(max_steps), "--workers", str(workers),
           "--lake", str(lake), "--run-id", run_id, "--no-progress", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(proc.stderr or proc.stdout)[-1500:]}")
    from halo_data.lake import Lake

    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = Lake.open(str(lake)).query_arrow(
        """select count(*) as steps, count(distinct episode_id) as episodes,
                  epoch(max(ended_at)) - epoch(min(started_at)) as span
           from steps where run_id = $r""",
        {"r": run_id},
    ).to_pylist()[0]
    return {"wall_seconds": wall, "steps": rows["steps"], "episodes": rows["episodes"], "span_seconds": rows["span"],
            "steps_per_second": rows["steps"] / rows["span"] if rows["span"] else float("nan"),
            "steps_per_second_wall": rows["steps"] / wall,
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
    out: dict[str, Any] = {"tasks": TASKS, "workers": {}}
    k = 2 if quick else 4
    for workers in (1, 2):
        runs = [run_rollout(lake, f"bench-w{workers}-{r}", workers, k, 10) for r in range(1 if quick else repeats)]
        sps = [r["steps_per_second"] for r in runs]
        out["workers"][str(workers)] = {
            "steps": sum(r["steps"] for r in runs),
            "runs": runs,
            "steps_per_second": {"min": min(sps), "median": statistics.median(sps), "max": max(sps), "n": len(sps)},
        }
    shares = [r["lake_share"] for w in out["workers"].values() for r in w["runs"] if r.get("lake_share") is not None]
    if shares:
        out["lake_share"] = {"min": min(shares), "median": statistics.median(shares), "max": max(shares), "n": len(shares)}
    one = out["workers"]["1"]["steps_per_second"]["median"]
    out["step_seconds"] = 1.0 / one if one else None
    out["speedup_2_workers"] = out["workers"]["2"]["steps_per_second"]["median"] / one if one else None
    shutil.rmtree(workdir, ignore_errors=True)
    return out
