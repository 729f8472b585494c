"""The os environment's speed (`python -m bench os`): sandbox start, per-command overhead, samples per second."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    rows = []
    for run in load_runs(results_dir):
        s, c, (one, two) = run["sandbox"], run["command_overhead"], run["rollout"]
        rows.append([run["date"], f"{run['machine']['load_average'][0]}", f"{s['start_median_ms']:.1f}",
                     f"{s['start_p90_ms']:.1f}", f"{c['command_median_ms']:.2f}", f"{c['host_bash_median_ms']:.2f}",
                     f"{one['samples_per_second']:.2f}", f"{two['samples_per_second']:.2f}",
                     f"×{two['samples_per_second'] / one['samples_per_second']:.2f}", f"`{run['command']}`"])
    return table(["date", "load", "sandbox start median (ms)", "start p90 (ms)", "`true` in the sandbox (ms)",
                  "`bash -c true` on the host (ms)", "samples/s, 1 worker", "samples/s, 2 workers", "2 workers / 1",
                  "command"], rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in load_runs(results_dir)) + "\n"
