"""`halo-train quickstart --model` as a user runs it: wall and CPU time, and what its summary says.

    .venv/bin/python -m bench quickstart                         # smollm2-135m-instruct, the quickstart's defaults
    .venv/bin/python -m bench quickstart --seed 1 --workdir runs/quickstart-s1

The command runs as printed in README.md (a subprocess, in a fresh work folder: its own lake and output), with the
load average before and after and the CPU seconds of the command and everything it started (the chat server, the
rollout workers, the BC job). Its ``summary.json`` (held-out success per policy and task, pooled rates with 95%
Wilson intervals, BC adapter - zero-shot and zero-shot - random with Newcombe's intervals) goes into the results
file, ``bench/results/quickstart/``, whose table is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.reports import save


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench quickstart", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--seed", type=int, default=0, help="The quickstart's --seed (sampling and training).")
    ap.add_argument("--workdir", default=None, help="Work folder (default: a new temporary one); must not hold a lake.")
    a = ap.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="halo-bench-quickstart-"))
    if (work / "lake").exists():
        sys.exit(f"Error: {work / 'lake'} exists: the benchmark measures a first run, give a new --workdir")
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "halo-train"), "quickstart", "--model", a.model, "--seed", str(a.seed),
               "--lake", str(work / "lake"), "--output-dir", str(work / "out")]
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} on {os.cpu_count()} cores\n$ {' '.join(command)}", flush=True)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, check=False)
    wall = time.perf_counter() - t0
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    if done.returncode != 0:
        sys.exit(f"Error: the quickstart exited with {done.returncode}; nothing saved")
    summary = json.loads((work / "out" / "summary.json").read_text())
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    result = {"quickstart_command": f".venv/bin/halo-train quickstart --model {a.model}" + (f" --seed {a.seed}" if a.seed else ""),
              "wall_seconds": wall, "cpu_seconds": cpu, "load_before": list(load_before), "load_after": list(load_after),
              "summary": summary}
    print(f"load average after: {load_after[0]:.2f}; {wall:.0f} s wall, {cpu:.0f} CPU-s")
    print(f"results in {save('quickstart', result, argv)}")


if __name__ == "__main__":
    main()
