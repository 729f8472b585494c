"""Online GRPO with and without the descriptions of unnamed elements, then the test seeds
(`python -m bench element-descriptions-online`), beside the base model zero-shot and BC on the same seeds."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table
from bench.reports.element_descriptions import _difference, _rate

ARMS = ("elements-v2", "elements")


def _same_seeds(folder: pathlib.Path, run: dict) -> dict | None:
    """The newest committed run of a sibling benchmark on the same test seeds (first seed, count, steps), if any;
    for BC, the one on random's successes."""
    if not folder.is_dir():
        return None
    same = [r for r in load_runs(folder) if (r["first_seed"], r["seeds"], r["steps"]) == (run["first_seed"], run["seeds"], run["steps"])
            and r.get("temperature", 1.0) == 1.0 and r.get("teacher", "random") == "random"]
    return same[-1] if same else None


def _halves(values: list, fmt: str) -> str:
    """The mean of the first half of the iterations' values, then of the second (an iteration without an update
    has none)."""
    half = len(values) // 2
    means = []
    for part in (values[:half], values[half:]):
        kept = [v for v in part if v is not None]
        means.append(format(sum(kept) / len(kept), fmt) if kept else "–")
    return " → ".join(means)


def report(results_dir: pathlib.Path) -> str:
    parts = []
    for run in load_runs(results_dir):
        zero_shot = _same_seeds(results_dir.parent / "element-descriptions", run)
        bc = _same_seeds(results_dir.parent / "element-descriptions-bc", run)
        rows = []
        for task in [*run["tasks"], "all"]:
            cells = {arm: (run["totals"][arm] if task == "all" else run["arms"][arm]["results"].get(task)) for arm in ARMS}
            before = []
            for sibling in (zero_shot, bc):
                for arm in ARMS:
                    if sibling is None:
                        before.append("–")
                    elif task == "all":
                        before.append(_rate({k: sum(sibling["results"][t][arm][k] for t in run["tasks"]
                                                    if t in sibling["results"]) for k in ("successes", "episodes")}))
                    else:
                        before.append(_rate(sibling["results"].get(task, {}).get(arm)))
            online = [_rate(cells[arm]) for arm in ARMS]
            diff = (_difference(cells["elements"], cells["elements-v2"])
                    if all(cells[arm] and cells[arm]["episodes"] for arm in ARMS) else "–")
            rows.append([task, *before, *online, diff])
        head = (f"{run['model']}, {len(run['tasks'])} tasks: online GRPO ({run['iterations']} iterations, a group of "
                f"{run['group_size']} on one train task seed of each task per iteration, lr {run['lr']:g}), then the final "
                f"version on {run['seeds']} test seeds from {run['first_seed']} per task, one episode each, temperature 1. "
                f"Zero-shot and BC: the newest committed `element-descriptions` and `element-descriptions-bc` (on random's "
                f"successes) runs on the same seeds.")
        per_arm = [[arm, _halves(run["arms"][arm]["per_iteration"]["success_rate/train"], ".0%"),
                    f"{sum(v or 0 for v in run['arms'][arm]['per_iteration']['rows_trained']):.0f}",
                    ", ".join(run["arms"][arm]["versions"]) or "–",
                    _halves(run["arms"][arm]["per_iteration"]["displacement_from_previous"], ".4f"),
                    _halves(run["arms"][arm]["per_iteration"]["approx_kl"], ".5f")] for arm in ARMS]
        parts.append(
            head + "\n\n"
            + table(["task", "zero-shot, elements-v2", "zero-shot, elements", "BC, elements-v2", "BC, elements",
                     "online, elements-v2", "online, elements", "online: elements − elements-v2, points [95%]"], rows)
            + "\n"
            + table(["arm", "sampled success on train seeds, first half → second", "rows trained", "version tested",
                     "moved per update, first half → second", "KL per update, first half → second"], per_arm)
            + f"\n- {run['seconds'] / 60:.0f} min in all\n- {provenance(run)}; load {run['load_before'][0]:.1f} "
              f"before, {run['load_after'][0]:.1f} after")
    return "\n\n".join(parts) + "\n"

