"""Headless Chromium's cost (`python -m bench browser`): Debian's full browser against its headless shell."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for name, arm in run["arms"].items():
            rows.append([run["date"], name, f"{arm['cpu_per_launch']:.3f}", f"{arm['wall_per_launch']:.2f}",
                         f"{arm['cpu_per_episode']:.3f}", f"{arm['wall_per_episode']:.2f}",
                         f"{arm['rounds']} × ({arm['launches']} launches, {arm['episodes']} episodes)", f"`{run['command']}`"])
        rows.append([run["date"], "full / headless shell", f"{run['ratios']['launch_cpu']}×", "", f"{run['ratios']['episode_cpu']}×",
                     "", "", f"`{run['command']}`"])
    lines = "\n".join(f"- {provenance(r)}" for r in runs)
    return table(["date", "binary", "CPU-s per launch", "s per launch", "CPU-s per episode", "s per episode", "measured",
                  "command"], rows) + "\n" + lines + "\n"
