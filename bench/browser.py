"""Headless Chromium's cost: Debian's full browser against its headless shell, side by side in one run.

    .venv/bin/python -m bench browser                       # 10 launches and 32 MiniWoB++ episodes per binary, 3 rounds
    .venv/bin/python -m bench browser --launches 20 --rounds 5

Each measurement is a fresh Python process with ``HALO_CHROMIUM`` naming the binary, and its CPU is what it and
every process below it used (Playwright's driver and Chromium's processes, waited for): ``launch`` launches
Chromium, opens a page, sets a button, takes a screenshot and closes, ``--launches`` times; ``episodes`` runs
``--episodes`` random-policy MiniWoB++ episodes through HALO's environment (one browser, a context per episode).
The binaries take turns round by round, so the machine's load falls on both alike. Results go to
``bench/results/browser/<time>.json``; ``python -m bench report browser`` makes the table.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCH = """
import sys, time
from halo_agent.browser import CHROMIUM_ARGS, chromium_executable, ensure_environment
ensure_environment()
from playwright.sync_api import sync_playwright
with sync_playwright() as pw:
    for _ in range(int(sys.argv[1])):
        browser = pw.chromium.launch(headless=True, executable_path=chromium_executable(True), args=list(CHROMIUM_ARGS))
        page = browser.new_page()
        page.set_content("<button>Send</button>")
        page.screenshot()
        browser.close()
"""

EPISODES = """
import sys
from halo_agent.rollout import RolloutConfig, run_rollouts
tasks = ["click-button", "enter-text", "click-checkboxes", "choose-list"]
summary = run_rollouts(RolloutConfig(env="miniwob", tasks=tasks, rollouts_per_task=int(sys.argv[1]) // len(tasks),
                                     policy="random", max_steps=4, lake=sys.argv[2], run_id="browser", progress=False))
assert summary.episodes_written == int(sys.argv[1]) // len(tasks) * len(tasks), summary
"""

IMPORTS_ONLY = "import halo_agent.rollout, playwright.sync_api"


def measure(script: str, binary: str, *args: str) -> dict:
    """Wall and CPU seconds of ``script`` in a fresh process (and every process it waited for) with ``binary``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, *args], env={**os.environ, "HALO_CHROMIUM": binary},
                          capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"Error: the measurement with {binary} failed:\n{done.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": wall, "cpu_seconds": cpu}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench browser", description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=10, help="launches per measurement")
    ap.add_argument("--episodes", type=int, default=32, help="MiniWoB++ episodes per measurement (a multiple of 4)")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per binary, taken in turns")
    a = ap.parse_args(argv)
    from halo_agent.browser import CHROMIUM_CANDIDATES, HEADLESS_SHELL_CANDIDATES

    # Each binary where HALO itself looks for it (the first installed candidate).
    found = {name: next((c for c in candidates if os.access(c, os.X_OK)), None)
             for name, candidates in (("chromium", CHROMIUM_CANDIDATES), ("chromium-headless-shell", HEADLESS_SHELL_CANDIDATES))}
    binaries = {name: path for name, path in found.items() if path}
    if len(binaries) < 2:
        raise SystemExit("Error: needs Debian's chromium and chromium-headless-shell "
                         "(apt-get install chromium chromium-headless-shell)")
    from bench.reports import save

    samples: dict[str, dict[str, list[dict]]] = {name: {"imports": [], "launch": [], "episodes": []} for name in binaries}
    with tempfile.TemporaryDirectory(prefix="halo-browser-") as scratch:
        for round_ in range(a.rounds):
            for name, path in binaries.items():
                samples[name]["imports"].append(measure(IMPORTS_ONLY, path))
                samples[name]["launch"].append(measure(LAUNCH, path, str(a.launches)))
                samples[name]["episodes"].append(measure(EPISODES, path, str(a.episodes), str(Path(scratch) / f"{name}-{round_}")))

    def median(name: str, what: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[name][what])

    arms = {}
    for name in binaries:
        imports = median(name, "imports", "cpu_seconds")  # the Python process's own start, taken off both
        arms[name] = {
            "binary": binaries[name], "rounds": a.rounds, "launches": a.launches, "episodes": a.episodes,
            "import_cpu_seconds": round(imports, 3),
            "cpu_per_launch": round((median(name, "launch", "cpu_seconds") - imports) / a.launches, 3),
            "wall_per_launch": round(median(name, "launch", "wall_seconds") / a.launches, 3),
            "cpu_per_episode": round((median(name, "episodes", "cpu_seconds") - imports) / a.episodes, 3),
            "wall_per_episode": round(median(name, "episodes", "wall_seconds") / a.episodes, 3),
            "samples": samples[name],
        }
    full, shell = arms["chromium"], arms["chromium-headless-shell"]
    ratios = {"launch_cpu": round(full["cpu_per_launch"] / shell["cpu_per_launch"], 2),
              "episode_cpu": round(full["cpu_per_episode"] / shell["cpu_per_episode"], 2)}
    for name, arm in arms.items():
        print(f"{name:24s} {arm['cpu_per_launch']:.3f} CPU-s per launch ({arm['wall_per_launch']:.2f} s), "
              f"{arm['cpu_per_episode']:.3f} CPU-s per episode ({arm['wall_per_episode']:.2f} s)")
    print(f"full browser / headless shell: {ratios['launch_cpu']}x the CPU per launch, {ratios['episode_cpu']}x per episode")
    out = save("browser", {"arms": arms, "ratios": ratios}, argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
