"""The os sandbox's start time: the user-namespace sandbox against the earlier one, measured side by side."""

from __future__ import annotations

import json
import pathlib


def _cpu(arm: dict) -> str:
    return f"{arm['start_close_cpu_median_ms']:.1f}" if "start_close_cpu_median_ms" in arm else "not measured"


def report(results_dir: pathlib.Path) -> str:
    rows = [
        "| run | sandbox | revision | start median (ms) | start p90 (ms) | start + close CPU median (ms) | close median (ms) | `true` median (ms) | starts | command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(pathlib.Path(results_dir).glob("*.json")):
        result = json.loads(path.read_text())
        for arm in ("baseline", "current"):
            r = result[arm]
            rows.append(
                f"| {result['date']} (load {result['load_average']:.1f}, {result['cpus']} CPUs) | {r['sandbox']} | "
                f"{r['revision']} | {r['start_median_ms']:.1f} | {r['start_p90_ms']:.1f} | {_cpu(r)} | {r['close_median_ms']:.1f} | "
                f"{r['command_median_ms']:.1f} | {r['starts']} | `{result['command'].strip()}` |"
            )
    return "\n".join(rows) + "\n"
