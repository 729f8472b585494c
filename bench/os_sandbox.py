"""The os sandbox's start and command time, today's sandbox against an earlier revision's, side by side in one run.

    python -m bench os-sandbox                          # against the revision before the static entry helper
    python -m bench os-sandbox --baseline-rev 6063a23 --starts 40   # against the sandbox before the user namespace

The earlier revision's ``halo_agent/envs/os_sandbox.py`` is loaded from git (it imports only the
standard library) and both sandboxes are started in turns (A, B, A, B, ...), so that the load of the
machine, shared with other jobs, falls on both alike. For each: the median and p90 of ``start``
(to the holder's ready line), the median CPU time of a start and close (this process and its
children, user and system: what the start costs whatever the load), of ``close``, and of ``true``
run through ``run`` (in one sandbox of each, in turns), and of ``true`` run as a check through
``evaluate`` where the revision has it. The figures go to
``bench/results/os-sandbox/<date>-<time>.json``; ``python -m bench report os-sandbox`` tables them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "os-sandbox"
MODULE = "halo_agent/envs/os_sandbox.py"
# The last revision whose commands entered through nsenter and a dynamically linked setpriv (capabilities
# dropped after the loader ran), evaluated inside the sandbox, with no CPU quota nor freezing.
BASELINE_REV = "d223e2c"


BASELINE_SANDBOXES = {
    "6063a23": "real root, host / as the overlay's lower layer, masked folders",
    "d223e2c": "user namespace, root template + read-only /usr, own /etc; nsenter + setpriv",
}


def load_revision(rev: str):
    """The sandbox module as it was at ``rev`` (from git), as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:{MODULE}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader(f"os_sandbox_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"{rev}:{MODULE}", "exec"), module.__dict__)
    return module


def _cpu_ms() -> float:
    """CPU time (user + system) of this process and of its reaped children, in ms."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000.0 * (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime)


def measure_start(module) -> dict[str, float]:
    """One fresh sandbox started and closed: wall times, and the CPU time both took (the kernel's included).

    The CPU time hardly moves with the machine's load, unlike the wall time: on an idle machine the
    start takes about its CPU time."""
    cpu = _cpu_ms()
    box = module.Sandbox()
    box.start()
    t0 = time.perf_counter()
    box.close()
    return {"start_ms": box.start_ms, "close_ms": (time.perf_counter() - t0) * 1000.0, "cpu_ms": _cpu_ms() - cpu}


def measure_commands(modules: dict, commands: int) -> dict[str, list[float]]:
    """``true`` through ``run``, in one sandbox of each module, in turns."""
    boxes = {name: module.Sandbox() for name, module in modules.items()}
    for box in boxes.values():
        box.start()
    try:
        times: dict[str, list[float]] = {name: [] for name in boxes}
        for _ in range(commands):
            for name, box in boxes.items():
                times[name].append(box.run("true").duration_ms)
                if hasattr(box, "evaluate"):  # a check from the trusted root (revisions that have one)
                    times.setdefault(f"{name}-evaluate", []).append(box.evaluate("true").duration_ms)
        return times
    finally:
        for box in boxes.values():
            box.close()


def summarize(samples: list[dict], commands: list[float], evaluations: list[float] | None = None) -> dict[str, float]:
    def p90(values: list[float]) -> float:
        return sorted(values)[int(0.9 * (len(values) - 1))]

    starts = [s["start_ms"] for s in samples]
    return {"start_median_ms": statistics.median(starts), "start_p90_ms": p90(starts),
            "start_close_cpu_median_ms": statistics.median(s["cpu_ms"] for s in samples),
            "close_median_ms": statistics.median(s["close_ms"] for s in samples),
            "command_median_ms": statistics.median(commands), "starts": len(starts), "commands": len(commands),
            **({"evaluate_median_ms": statistics.median(evaluations)} if evaluations else {})}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench os-sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision of the sandbox to compare against")
    parser.add_argument("--starts", type=int, default=40, help="fresh sandboxes started by each")
    parser.add_argument("--commands", type=int, default=100, help="`true` commands run through each sandbox")
    args = parser.parse_args(argv)
    from halo_agent.envs import os_sandbox

    os_sandbox.check_host()
    baseline = load_revision(args.baseline_rev)
    measure_start(os_sandbox)  # the root template is made once per host: not a start's cost
    current_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    samples: dict[str, list[dict]] = {"current": [], "baseline": []}
    for _ in range(args.starts):
        samples["baseline"].append(measure_start(baseline))
        samples["current"].append(measure_start(os_sandbox))
    commands = measure_commands({"baseline": baseline, "current": os_sandbox}, args.commands)
    result = {
        "command": "python -m bench os-sandbox " + " ".join(argv or []),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "baseline": {"revision": args.baseline_rev, "sandbox": BASELINE_SANDBOXES.get(args.baseline_rev, "earlier revision"),
                     **summarize(samples["baseline"], commands["baseline"], commands.get("baseline-evaluate"))},
        "current": {"revision": current_rev, "sandbox": "static entry helper, seccomp, own keyring, CPU quota, frozen between "
                                                         "commands, trusted evaluation root",
                    **summarize(samples["current"], commands["current"], commands.get("current-evaluate"))},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    from bench.reports.os_sandbox import report

    print(report(RESULTS))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
