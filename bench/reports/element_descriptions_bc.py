"""BC on the same random successes with and without the descriptions of unnamed elements
(`python -m bench element-descriptions-bc`)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table
from bench.reports.element_descriptions import _difference, _rate


def report(results_dir: pathlib.Path) -> str:
    parts = []
    for run in load_runs(results_dir):
        rows = []
        for task, cells in [*run["results"].items(), ("all", run["totals"])]:
            samples = run["samples"]["elements"].get(task)
            sampled = f"{samples['successes']}/{samples['episodes']}" if samples else (
                f"{sum(s['successes'] for s in run['samples']['elements'].values())}/"
                f"{sum(s['episodes'] for s in run['samples']['elements'].values())}")
            rows.append([task, sampled, _rate(cells["elements-v2"]), _rate(cells["elements"]),
                         _difference(cells["elements"], cells["elements-v2"])])
        bc = run["bc"]
        head = (f"{run['model']}, {len(run['tasks'])} tasks: random on {run['train_seeds']} train seeds each (the same "
                f"episodes under both observations), BC {run['train_steps']} steps at lr {run['lr']:g} on their "
                f"successes ({bc['elements-v2']['rows']} and {bc['elements']['rows']} rows), then each adapter on "
                f"{run['seeds']} test seeds from {run['first_seed']} under its observation, temperature "
                f"{run['temperature']:g}:")
        parts.append(head + "\n\n" + table(
            ["task", "random's successes BC read", "BC, elements-v2", "BC, elements", "elements − elements-v2, points [95%]"],
            rows) + f"\n- {run['seconds'] / 60:.0f} min in all\n- {provenance(run)}; load {run['load_before'][0]:.1f} "
                    f"before, {run['load_after'][0]:.1f} after")
    return "\n\n".join(parts) + "\n"
