"""The os sandbox's start and command time, today's sandbox against an earlier revision's, side by side in one run.

    python -m bench os-sandbox                          # against the revision before the user namespace
    python -m bench os-sandbox --baseline-rev 6063a23 --starts 40

The earlier revision's ``halo_agent/envs/os_sandbox.py`` is loaded from git (it imports only the
standard library) and both sandboxes are started in turns (A, B, A, B, ...), so that the load of the
machine, shared with other jobs, falls on both alike. For each: the median and p90 of ``start``
(to the holder's ready line), of ``close``, and of ``true`` run through ``run``. The figures go to
``bench/results/os-sandbox/<date>-<time>.json``; ``python -m bench report os-sandbox`` tables them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "os-sandbox"
MODULE = "halo_agent/envs/os_sandbox.py"
# The last revision whose sandbox ran as real root with the host's / as its lower layer.
BASELINE_REV = "6063a23"


def load_revision(rev: str):
    """The sandbox module as it was at ``rev`` (from git), as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:{MODULE}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader(f"os_sandbox_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"{rev}:{MODULE}", "exec"), module.__dict__)
    return module


def measure_once(module, commands: int) -> dict[str, float | list[float]]:
    box = module.Sandbox()
    box.start()
    runs = [box.run("true").duration_ms for _ in range(commands)]
    t0 = time.perf_counter()
    box.close()
    return {"start_ms": box.start_ms, "close_ms": (time.perf_counter() - t0) * 1000.0, "command_ms": runs}


def summarize(samples: list[dict]) -> dict[str, float]:
    def p90(values: list[float]) -> float:
        return sorted(values)[int(0.9 * (len(values) - 1))]

    starts = [s["start_ms"] for s in samples]
    closes = [s["close_ms"] for s in samples]
    commands = [c for s in samples for c in s["command_ms"]]
    return {"start_median_ms": statistics.median(starts), "start_p90_ms": p90(starts),
            "close_median_ms": statistics.median(closes), "command_median_ms": statistics.median(commands),
            "starts": len(starts), "commands": len(commands)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench os-sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision of the sandbox to compare against")
    parser.add_argument("--starts", type=int, default=40, help="fresh sandboxes started by each")
    parser.add_argument("--commands", type=int, default=5, help="`true` commands run in each sandbox")
    args = parser.parse_args(argv)
    from halo_agent.envs import os_sandbox

    os_sandbox.check_host()
    baseline = load_revision(args.baseline_rev)
    measure_once(os_sandbox, 1)  # the root template is made once per host: not a start's cost
    current_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    samples: dict[str, list[dict]] = {"current": [], "baseline": []}
    for _ in range(args.starts):
        samples["baseline"].append(measure_once(baseline, args.commands))
        samples["current"].append(measure_once(os_sandbox, args.commands))
    result = {
        "command": "python -m bench os-sandbox " + " ".join(argv or []),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "baseline": {"revision": args.baseline_rev, "sandbox": "real root, host / as the overlay's lower layer, masked folders",
                     **summarize(samples["baseline"])},
        "current": {"revision": current_rev, "sandbox": "user namespace, root template + read-only /usr, own /etc",
                    **summarize(samples["current"])},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    from bench.reports.os_sandbox import report

    print(report(RESULTS))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
