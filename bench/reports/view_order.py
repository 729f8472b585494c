"""What read_view's one row order costs as the lake grows (`python -m bench view-order`)."""

from __future__ import annotations

import pathlib
import statistics

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for size, measured in run["sizes"].items():
            for cell, data in measured["views"].items():
                view, scope = cell.split("/")
                o, u = data["ordered"], data["unordered"]
                rows.append([run["date"], f"{size} ({measured['steps']:,})", view, "lake-wide" if scope == "lake" else "one run",
                             o["rows"], f"{o['arrow_mb']:.0f}",
                             f"{statistics.median(o['seconds']):.2f} / {statistics.median(u['seconds']):.2f}",
                             f"{data['ratios']['seconds']}×", f"{data['ratios']['cpu_s']}×",
                             f"{statistics.median(o['peak_rss_mb']):.0f} / {statistics.median(u['peak_rss_mb']):.0f}",
                             f"{data['ratios']['peak_rss_mb']}×"])
    text = table(["date", "lake steps", "view", "read", "rows", "Arrow MB", "seconds, ordered / not", "time ratio",
                  "CPU ratio", "peak MB, ordered / not", "memory ratio"], rows)
    return text + "\n" + "\n".join(f"- `{r['command']}`: {provenance(r)}, median of {r['repeats']} reads each" for r in runs) + "\n"
