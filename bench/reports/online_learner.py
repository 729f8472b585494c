"""A job per update against the persistent learner (`python -m bench online-learner`): how far each update moves
the adapter, the rows it trains, its seconds per row, and dev success, side by side."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    out = []
    for run in runs:
        rows = []
        for arm, r in run["arms"].items():
            p = r["per_iteration"]
            heldout = [f"it {k + 1}: {v:.0%}" for k, v in enumerate(p["success_rate/heldout"]) if v is not None]
            m = run["means"][arm]
            rows.append([arm, _fmt(m["displacement_from_previous"], ".4f"), _fmt(m["rows_trained"], ".0f"),
                         _fmt(m["update_seconds"], ".1f"), _fmt(m["seconds_per_trained_row"], ".2f"),
                         _fmt(m.get("cpu_seconds_per_trained_row"), ".2f"),
                         _fmt(m["step_advantage_share"], ".2f"), ", ".join(heldout) or "–", r["commit"][:10]])
        head = ["arm", "moved per iteration", "rows trained", "update s", "s per trained row", "CPU s per trained row",
                "step share of advantage",
                "dev success", "commit"]
        out.append(table(head, rows))
        ratios = []
        if "displacement_ratio" in run:
            ratios.append(f"persistent / jobs displacement per iteration: {run['displacement_ratio']:.2f}× (target ≥ 3×)")
        if "seconds_per_row_ratio" in run:
            ratios.append(f"update seconds per trained row: {run['seconds_per_row_ratio']:.2f}× (target ≤ 0.7×)")
        if "cpu_seconds_per_row_ratio" in run:
            ratios.append(f"update CPU seconds per trained row: {run['cpu_seconds_per_row_ratio']:.2f}× (target ≤ 0.7×)")
        out.append("\n".join(f"- {line}" for line in ratios + [
            f"{provenance(run)}; load {run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after"]) + "\n")
    return "\n".join(out)
