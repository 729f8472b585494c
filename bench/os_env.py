"""The os environment's speed: sandbox start, per-command overhead, and samples per second with 1 and 2 workers.

    python -m bench os                   # prints the figures and writes bench/results/os/<time>.json

- sandbox start: ``Sandbox.start`` (namespaces, overlay, masks, pivot_root, cgroup) to the holder's
  ready line, median over ``N_STARTS`` fresh sandboxes, with ``close`` timed too;
- per-command overhead: wall time of ``true`` through ``Sandbox.run`` (nsenter, setpriv, bash),
  against ``bash -c true`` run directly on the host, medians side by side;
- samples per second: ``halo-agent rollout --env os`` with the random policy (5 commands or a finish
  per sample, a fresh sandbox each) over every task, 1 worker and 2 workers, measured in one invocation.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.reports import save
from bench.rollout import run_json_command

N_STARTS = 50
N_COMMANDS = 100


def sandbox_start() -> dict[str, float]:
    from halo_agent.envs.os_sandbox import Sandbox

    starts, closes = [], []
    for _ in range(N_STARTS):
        box = Sandbox()
        box.start()
        starts.append(box.start_ms)
        t0 = time.perf_counter()
        box.close()
        closes.append((time.perf_counter() - t0) * 1000.0)
    return {"start_median_ms": statistics.median(starts), "start_p90_ms": sorted(starts)[int(0.9 * len(starts))],
            "close_median_ms": statistics.median(closes)}


def command_overhead() -> dict[str, float]:
    from halo_agent.envs.os_sandbox import Sandbox

    with Sandbox() as box:
        inside = [box.run("true").duration_ms for _ in range(N_COMMANDS)]
    host = []
    for _ in range(N_COMMANDS):
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        host.append((time.perf_counter() - t0) * 1000.0)
    return {"command_median_ms": statistics.median(inside), "host_bash_median_ms": statistics.median(host)}


def samples_per_second(workers: int, lake: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "halo_agent.cli", "rollout", "--env", "os", "--policy", "random", "--seed", "0",
           "--rollouts-per-task", "2", "--workers", str(workers), "--lake", str(lake), "--run-id", f"bench-os-{workers}w",
           "--no-progress", "--json"]
    summary, wall = run_json_command(cmd)
    return {"workers": workers, "samples": summary["episodes_written"], "steps": summary["steps"],
            "run_seconds": summary["wall_seconds"], "samples_per_second": summary["episodes_written"] / summary["wall_seconds"],
            "process_wall_seconds": wall}


def main(argv: list[str] | None = None) -> dict:
    import argparse

    from halo_agent.envs.os_sandbox import check_host

    argparse.ArgumentParser(prog="python -m bench os", description=__doc__.splitlines()[0]).parse_args(argv)
    check_host()
    start = sandbox_start()
    overhead = command_overhead()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [samples_per_second(w, Path(tmp) / "lake") for w in (1, 2)]
    report = {"sandbox": start, "command_overhead": overhead, "rollout": runs, "load_average": os.getloadavg()[0], "cpus": os.cpu_count()}
    print(render(report))
    print(f"results in {save('os', report, argv)}")
    return report


def render(report: dict) -> str:
    s, c, (one, two) = report["sandbox"], report["command_overhead"], report["rollout"]
    return "\n".join([
        f"## os environment: sandbox start, command overhead, samples/s ({time.strftime('%Y-%m-%d')}, `python -m bench os`)",
        "",
        f"Machine: {report['cpus']} CPUs, 1-minute load average {report['load_average']:.1f} at the end (other jobs share them).",
        "",
        f"- fresh sandbox per sample (unshare + overlay on tmpfs + pivot_root + cgroup), {N_STARTS} starts: "
        f"**median {s['start_median_ms']:.1f} ms** (p90 {s['start_p90_ms']:.1f} ms; target ≤ 50 ms; a docker container "
        f"per sample takes most of a second); close {s['close_median_ms']:.1f} ms",
        f"- per command, `true` through the sandbox (nsenter + setpriv + bash -c) against `bash -c true` on the host, "
        f"{N_COMMANDS} each: **{c['command_median_ms']:.2f} ms** vs {c['host_bash_median_ms']:.2f} ms, "
        f"overhead {c['command_median_ms'] - c['host_bash_median_ms']:.2f} ms",
        f"- `halo-agent rollout --env os --policy random`, every task × 2 attempts: "
        f"1 worker **{one['samples_per_second']:.2f} samples/s** ({one['samples']} samples, {one['steps']} steps, {one['run_seconds']:.1f} s), "
        f"2 workers **{two['samples_per_second']:.2f} samples/s** ({two['samples']} samples, {two['run_seconds']:.1f} s): "
        f"×{two['samples_per_second'] / one['samples_per_second']:.2f}",
        "",
    ])


if __name__ == "__main__":
    main(sys.argv[1:])
