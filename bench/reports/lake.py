"""The lake against the older JSONL pipeline (`python -m bench --quick`, `--sizes ...`): the benchmark's own table."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, table
from bench.run import table_rows


def report(results_dir: pathlib.Path) -> str:
    out = []
    for run in load_runs(results_dir):
        m = run["machine"]
        commit = f", commit {run['commit'][:10]}" if run.get("commit") else ""
        out.append(f"`{run['command']}` ({run['started_at']}, {m['cpus']} cores, load {m['load_average_at_start'][0]:.1f} "
                   f"at the start{commit}; `bench/results/lake/{run['file']}`), "
                   "min / median / max over repeats" + (f" ({run['stopped']})" if run.get("stopped") else "") + ":\n")
        out.append(table(["figure", "size", "measured", "target", "met"], [list(r) for r in table_rows(run)]))
    return "\n".join(out)
