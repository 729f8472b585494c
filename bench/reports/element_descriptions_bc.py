"""BC on a teacher's successes (random's: the same episodes) with and without the descriptions of unnamed
elements (`python -m bench element-descriptions-bc`)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table
from bench.reports.element_descriptions import _difference, _rate

ARMS = ("elements-v2", "elements")


def report(results_dir: pathlib.Path) -> str:
    parts = []
    for run in load_runs(results_dir):
        rows = []
        teacher = run.get("teacher", "random")
        for task, cells in [*run["results"].items(), ("all", run["totals"])]:
            read = []
            for arm in ARMS:
                samples = run["samples"][arm]
                picked = [samples[task]] if task in samples else list(samples.values())
                read.append(f"{sum(c['successes'] for c in picked)}/{sum(c['episodes'] for c in picked)}")
            rows.append([task, *read, _rate(cells["elements-v2"]), _rate(cells["elements"]),
                         _difference(cells["elements"], cells["elements-v2"])])
        bc = run["bc"]
        same = " (the same episodes under both observations)" if teacher == "random" else ""
        head = (f"{run['model']}, {len(run['tasks'])} tasks: {teacher} on {run['train_seeds']} train seeds each{same}, "
                f"BC {run['train_steps']} steps at lr {run['lr']:g} on their "
                f"successes ({bc['elements-v2']['rows']} and {bc['elements']['rows']} rows), then each adapter on "
                f"{run['seeds']} test seeds from {run['first_seed']} under its observation, temperature "
                f"{run['temperature']:g}:")
        parts.append(head + "\n\n" + table(
            ["task", f"{teacher}'s successes BC read, elements-v2", f"{teacher}'s, elements", "BC, elements-v2",
             "BC, elements", "elements − elements-v2, points [95%]"],
            rows) + f"\n- {run['seconds'] / 60:.0f} min in all\n- {provenance(run)}; load {run['load_before'][0]:.1f} "
                    f"before, {run['load_after'][0]:.1f} after")
    return "\n\n".join(parts) + "\n"
