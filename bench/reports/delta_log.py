"""A table's Delta log as its commits add up, and what vacuum keeps of it (`python -m bench delta-log`)."""

from __future__ import annotations

import pathlib
import statistics

from bench.reports import load_runs, provenance, table


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _every_statistic(cell: dict, med: dict) -> list[str]:
    """The lake written with every column's statistics beside HALO's: log bytes (checkpoints + commits), their
    ratio, its open seconds; dashes for runs before it was measured."""
    every = cell.get("log_every_statistic")
    if every is None:
        return ["–", "–", "–"]
    log = cell["log"]
    return [f"{_mib(every['checkpoints'])} + {_mib(every['commits'])}",
            f"{(log['checkpoints'] + log['commits']) / (every['checkpoints'] + every['commits']):.2f}×",
            f"{med['every_statistic']['latest']:.3f}"]


def report(results_dir: pathlib.Path) -> str:
    out = []
    for run in load_runs(results_dir):
        rows = []
        for commits, cell in sorted(run["sizes"].items(), key=lambda kv: int(kv[0])):
            med = {copy: {which: statistics.median(v) for which, v in opens.items()}
                   for copy, opens in cell["open_seconds"].items()}
            log, vac = cell["log"], cell["log_vacuumed"]
            rows.append([f"{int(commits):,}", _mib(cell["data_bytes"]),
                         f"{_mib(log['checkpoints'])} ({log['checkpoint_files']} files)", _mib(log["commits"]),
                         f"{(log['checkpoints'] / cell['data_bytes']):.2f}×",
                         f"{_mib(vac['checkpoints'])} ({vac['checkpoint_files']})",
                         f"{med['kept']['latest']:.3f} / {med['vacuumed']['latest']:.3f}",
                         f"{cell['halfway']}: {med['kept']['halfway']:.3f} / {med['vacuumed']['halfway']:.3f}",
                         f"{med['vacuumed']['halfway'] / med['kept']['halfway']:.1f}×", *_every_statistic(cell, med)])
        out.append(table(["commits to steps", "data MiB", "checkpoints MiB", "commits MiB", "checkpoints / data",
                          "checkpoints after vacuum MiB", "open latest s, kept / vacuumed",
                          "open version halfway s, kept / vacuumed", "halfway, vacuumed / kept",
                          "log MiB with every column's statistics", "log, HALO / every statistic",
                          "open latest s, every statistic"], rows)
                   + f"\n- `{run['command']}`: {provenance(run)}; median of {run['repeats']} opens each, alternating; "
                     "the same rows both ways\n")
    return "\n".join(out)
