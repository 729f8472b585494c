"""Task-aware against milestone progress (`python -m bench task-progress`): the benchmark's own table, per run."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance
from bench.task_progress import report as render


def report(results_dir: pathlib.Path) -> str:
    return "\n".join(f"`{run['command']}` (site {run['site']}; {provenance(run)}):\n\n{render(run)}\n"
                     for run in load_runs(results_dir))
