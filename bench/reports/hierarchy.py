"""The verified action cache and loop recovery (`python -m bench hierarchy`): the benchmark's own tables, per run."""

from __future__ import annotations

import pathlib

from bench.hierarchy import report as tables
from bench.reports import load_runs, provenance


def report(results_dir: pathlib.Path) -> str:
    return "\n".join(f"`{run['command']}` ({provenance(run)}):\n\n{tables(run)}" for run in load_runs(results_dir))
