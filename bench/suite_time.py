"""The whole test suite's wall time: the README's test command, timed, with the machine's load beside it.

    .venv/bin/python -m bench suite-time                      # the README's command as it is (its -n from pyproject.toml)
    .venv/bin/python -m bench suite-time --workers 2,3,4      # the same suite on 2, 3 and 4 pytest-xdist workers, in turn
    .venv/bin/python -m bench suite-time --clone              # on a fresh clone of HEAD (this checkout's .venv)
    .venv/bin/python -m bench suite-time --cpu-by-test        # also each test's and each module's CPU (needs root)

Each run records its wall seconds, the tests passed and failed, the load average before and after, the cores,
the workers, the CPU seconds the suite's processes used, the tests that did not pass and the 15
slowest tests (pytest's --durations), and with ``--cpu-by-test`` the CPU seconds of every module and of the 30 costliest
tests, counted with their servers, browsers and jobs (``bench/cpu_by_test.py``), into ``bench/results/suite-time/<time>.json``;
``python -m bench report suite-time`` makes the table. The target is 8 minutes on 2 cores. Other work on the
machine lengthens every figure: read them with the load beside them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_COMMAND = [".venv/bin/python", "-m", "pytest", "-q"]  # .ci/run runs exactly this
TARGET_SECONDS = 8 * 60
SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
DURATION = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S.*)$")


def parse_output(text: str) -> dict:
    """Counts from pytest's last summary line, and the rows of its slowest-durations list."""
    counts: dict[str, int] = {}
    for line in reversed(text.splitlines()):
        if " in " in line and SUMMARY.search(line):
            for n, what in SUMMARY.findall(line):
                counts["errors" if what.startswith("error") else what] = int(n)
            break
    slowest = []
    if "slowest" in text:
        for line in text.split("slowest", 1)[1].splitlines()[1:]:
            match = DURATION.match(line)
            if match:
                slowest.append({"seconds": float(match.group(1)), "phase": match.group(2), "test": match.group(3)})
            elif slowest:
                break
    # -ra (pyproject.toml's addopts) lists each test that did not pass: "FAILED tests/x.py::name - why"
    not_passed = [line[:400] for line in re.findall(r"^(?:FAILED|ERROR) \S+.*$", text, re.M)]
    return {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0), "errors": counts.get("errors", 0),
            "skipped": counts.get("skipped", 0), "not_passed": not_passed, "slowest": slowest}


def time_suite(checkout: Path, workers: int | None, timeout: float, cpu_by_test: Path | None = None) -> dict:
    """One run of the README's test command in ``checkout`` (with ``-n workers`` when given; with each test's CPU
    counted into ``cpu_by_test`` when given)."""
    command = README_COMMAND + ([] if workers is None else ["-n", str(workers)])
    # A wide terminal: pytest cuts each "FAILED test - reason" summary line to the width, which drops the reason.
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "400"}
    if cpu_by_test is not None:
        command += ["-p", "bench.cpu_by_test"]
        env["HALO_CPU_BY_TEST"] = str(cpu_by_test)
    load_before = [round(x, 2) for x in os.getloadavg()]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers and every process they waited for
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    load_after = [round(x, 2) for x in os.getloadavg()]
    result = parse_output(done.stdout)
    if not result["passed"]:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SystemExit(f"Error: the suite reported no passed tests (exit {done.returncode}):\n{tail}")
    run = {"workers": workers if workers is not None else _default_workers(checkout), "test_command": " ".join(command),
           "exit_code": done.returncode, "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
           "load_before": load_before, "load_after": load_after, **result}
    if cpu_by_test is not None:
        from bench.cpu_by_test import by_module, by_worker, collect, remove_groups

        rows = collect(cpu_by_test)
        remove_groups()
        if rows:
            run["counted_cpu_seconds"] = round(sum(row["cpu_seconds"] for row in rows), 1)
            run["cpu_by_module"] = by_module(rows)
            run["workers_timeline"] = by_worker(rows)
            run["cpu_by_test"] = rows[:30]
    return run


def _default_workers(checkout: Path) -> str:
    """The -n of pyproject.toml's addopts (what the README's command runs with)."""
    match = re.search(r"^addopts\s*=.*?-n\s+(\w+)", (checkout / "pyproject.toml").read_text(), re.M)
    return match.group(1) if match else "1"


def fresh_clone(into: Path) -> Path:
    """A clone of this checkout's HEAD, with this checkout's virtual environment linked in."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(into)], check=True)
    (into / ".venv").symlink_to((REPO / ".venv").resolve())
    return into


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench suite-time", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default=None,
                    help="comma-separated pytest-xdist worker counts, each a whole run (default: pyproject.toml's -n)")
    ap.add_argument("--clone", action="store_true", help="time a fresh clone of HEAD, not this working tree")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds before a run is stopped")
    ap.add_argument("--cpu-by-test", action="store_true",
                    help="count each test's CPU with every process it started, in a cgroup per worker (needs root)")
    a = ap.parse_args(argv)
    try:
        counts = [None] if a.workers is None else [int(w) for w in a.workers.split(",")]
    except ValueError:
        raise SystemExit(f"Error: --workers takes numbers separated by commas, got {a.workers!r}")
    from bench.reports import save

    with tempfile.TemporaryDirectory(prefix="halo-suite-") as scratch:
        checkout = fresh_clone(Path(scratch) / "halo") if a.clone else REPO
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
        runs = []
        for i, workers in enumerate(counts):
            counted = Path(scratch) / f"cpu-{i}.jsonl" if a.cpu_by_test else None
            run = time_suite(checkout, workers, a.timeout, counted)
            runs.append(run)
            print(f"{run['workers']} workers: {run['wall_seconds']:.0f} s wall, {run['cpu_seconds']:.0f} CPU-s, "
                  f"{run['passed']} passed, {run['failed']} failed, "
                  f"load {run['load_before'][0]} -> {run['load_after'][0]} (target {TARGET_SECONDS} s)")
            for test in run["not_passed"]:
                print(f"  {test}")
            if "cpu_by_module" in run:
                print(f"  {run['counted_cpu_seconds']:.0f} CPU-s counted with every process the tests started; "
                      "the costliest modules:")
                for m in run["cpu_by_module"][:12]:
                    print(f"  {m['cpu_seconds']:7.1f} CPU-s {m['wall_seconds']:7.1f} s  {m['tests']:3d} tests  {m['module']}")
                for w in run["workers_timeline"]:
                    print(f"  worker {w['worker']}: {w['tests']} tests, busy {w['busy_seconds']:.0f} s, last ended at {w['end_seconds']:.0f} s")
    out = save("suite-time", {"commit": commit, "fresh_clone": a.clone, "target_seconds": TARGET_SECONDS, "runs": runs},
               argv if argv is not None else sys.argv[2:])
    print(f"results: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
