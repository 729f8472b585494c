"""Zero-shot success with unnamed elements described against not (`python -m bench element-descriptions`)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table
from halo_data.stats import newcombe, wilson


def _rate(cell: dict | None) -> str:
    if cell is None:  # an arm a run did not have
        return "–"
    ok, n = cell["successes"], cell["episodes"]
    lo, hi = wilson(ok, n)
    return f"{ok}/{n} ({100 * ok / max(n, 1):.0f}% [{100 * lo:.0f}, {100 * hi:.0f}])"


def _difference(new: dict, old: dict) -> str:
    d, lo, hi = newcombe(new["successes"], new["episodes"], old["successes"], old["episodes"])
    return f"{100 * d:+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}]"


def _tokens(cell: dict) -> str:
    value = cell.get("prompt_tokens_per_step")
    return "–" if value is None else f"{value:.0f}"


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    parts = []
    for run in runs:
        rows = []
        for task, cells in [*run["results"].items(), ("all", run["totals"])]:
            rows.append([task, _rate(cells["random"]), _rate(cells.get("heuristic elements-v2")),
                         _rate(cells.get("heuristic elements")), _rate(cells["elements-v2"]), _rate(cells["elements"]),
                         _difference(cells["elements"], cells["elements-v2"]),
                         _tokens(cells["elements-v2"]), _tokens(cells["elements"])])
        head = (f"{run['model']}, {len(run['tasks'])} tasks × {run['seeds']} task seeds from {run['first_seed']}, one "
                f"episode each, at most {run['steps']} actions, temperature {run['temperature']:g}, sampling seed "
                f"{run['seed']} under both observations:")
        parts.append(head + "\n\n" + table(
            ["task", "random", "goal-match, elements-v2", "goal-match, elements", "zero-shot, elements-v2",
             "zero-shot, elements", "zero-shot: elements − elements-v2, points [95%]",
             "prompt tokens per step, elements-v2", "prompt tokens per step, elements"], rows)
            + f"\n- elements / elements-v2 prompt tokens per step: {run['ratios']['prompt_tokens_per_step']}×; "
              f"{run['seconds'] / 60:.0f} min in all\n- {provenance(run)}; load {run['load_before'][0]:.1f} before, "
              f"{run['load_after'][0]:.1f} after")
    return "\n\n".join(parts) + "\n"
