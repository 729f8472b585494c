"""MCTS against best-of-N at one environment-step budget (`python -m bench search`): the benchmark's own tables."""

from __future__ import annotations

import argparse
import pathlib

from bench.reports import load_runs, provenance
from bench.search import render


def report(results_dir: pathlib.Path) -> str:
    return "\n".join(f"`{run['command']}` ({provenance(run)}):\n\n{render(run['table'], argparse.Namespace(**run['args']))}\n"
                     for run in load_runs(results_dir))
