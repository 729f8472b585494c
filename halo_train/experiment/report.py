"""An experiment's report from its exported episodes.parquet: success per arm, split and temperature, the
differences the protocol names, and its targets, each recomputed from the episodes.

Intervals: each arm's pooled rate with Wilson's interval; each difference paired by task seed with a two-level
bootstrap (``paired_bootstrap``) that resamples the task seeds (the same draw for both arms: the pairing) and each
arm's own training or sampling seeds, so an interval carries both arms' seed-to-seed and binomial variance.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from halo_data.stats import wilson

BOOTSTRAP = 4000


def load_rows(results: Path) -> list[dict[str, Any]]:
    path = results / "episodes.parquet"
    if not path.exists():
        return []
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _temperature(row: dict[str, Any], default: float) -> float:
    t = row.get("temperature")
    return default if t is None else float(t)


def matrix(rows: list[dict[str, Any]], arm: str, split: str, temperature: float, default: float):
    """(seeds, units, successes[seed][unit]) of one arm's final policies: a unit is (task, task seed); attempts of a
    unit are averaged."""
    cells: dict[int, dict[tuple[str, int], list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if (r["arm"] == arm and r["split"] == split and r.get("version") is None
                and _temperature(r, default) == temperature):
            cells[r["training_seed"]][(r["task_id"], r["task_seed"])].append(int(r["success"]))
    seeds = sorted(cells)
    units = sorted({u for s in seeds for u in cells[s]})
    values = [[(sum(cells[s][u]) / len(cells[s][u])) if cells[s].get(u) else None for u in units] for s in seeds]
    return seeds, units, values


def paired_bootstrap(a, b, reps: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float | None, float | None]:
    """Difference of mean success (a - b) over the task seeds both arms have, with a 95% percentile interval from
    resampling those task seeds (once per draw, for both arms) and each arm's seeds independently."""
    import numpy as np

    (_, ua, va), (_, ub, vb) = a, b
    shared = sorted(set(ua) & set(ub))
    if not shared or not va or not vb:
        return float("nan"), None, None
    ia, ib = [ua.index(u) for u in shared], [ub.index(u) for u in shared]
    xa = np.array([[row[i] if row[i] is not None else np.nan for i in ia] for row in va], dtype=float)
    xb = np.array([[row[i] if row[i] is not None else np.nan for i in ib] for row in vb], dtype=float)
    d = float(np.nanmean(xa) - np.nanmean(xb))
    rng = np.random.default_rng(seed)
    n = len(shared)
    units = rng.integers(0, n, size=(reps, n))
    sa = rng.integers(0, xa.shape[0], size=(reps, xa.shape[0]))
    sb = rng.integers(0, xb.shape[0], size=(reps, xb.shape[0]))
    ra = np.array([np.nanmean(xa[sa[k]][:, units[k]]) for k in range(reps)])
    rb = np.array([np.nanmean(xb[sb[k]][:, units[k]]) for k in range(reps)])
    lo, hi = np.percentile(ra - rb, [2.5, 97.5])
    return d, float(lo), float(hi)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _diff(d: float, lo: float | None, hi: float | None) -> str:
    return "–" if lo is None else f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def arm_table(p, rows: list[dict[str, Any]], split: str, temperature: float) -> tuple[str, dict[str, Any]]:
    default = float(p.interface["temperature"])
    arms = [a for a in p.arms if any(r["arm"] == a and r["split"] == split and _temperature(r, default) == temperature
                                     for r in rows)]
    mats = {a: matrix(rows, a, split, temperature, default) for a in arms}
    lines = [f"**{split}, temperature {temperature:g}**", "",
             "| arm | seeds | attempts | success % [Wilson] | per seed | vs zero_shot (paired, both variances) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for arm in arms:
        seeds, units, values = mats[arm]
        successes = sum(r["success"] for r in rows if r["arm"] == arm and r["split"] == split and r.get("version") is None
                        and _temperature(r, default) == temperature)
        attempts = sum(1 for r in rows if r["arm"] == arm and r["split"] == split and r.get("version") is None
                       and _temperature(r, default) == temperature)
        lo, hi = wilson(successes, attempts)
        per_seed = ", ".join(_pct(sum(v for v in row if v is not None) / max(1, sum(v is not None for v in row)))
                             for row in values)
        vs = "–" if arm == "zero_shot" or "zero_shot" not in mats else _diff(*paired_bootstrap(mats[arm], mats["zero_shot"]))
        lines.append(f"| {arm} | {len(seeds)} | {attempts} | {_pct(successes / attempts if attempts else None)} "
                     f"[{_pct(lo)}, {_pct(hi)}] | {per_seed} | {vs} |")
    return "\n".join(lines), mats


def targets_table(p, rows: list[dict[str, Any]]) -> str:
    """The protocol's ``statistics.targets`` (a list of {name, split, arm, against, points, interval_above}; ``arm:
    best_trained`` is the trained arm with the highest rate there, ``best_online`` the best online arm), decided at
    the primary temperature."""
    targets = (p.raw.get("statistics") or {}).get("targets")
    if not isinstance(targets, list):
        return ""
    t0 = p.temperatures[0]
    default = float(p.interface["temperature"])
    lines = ["| target | estimate | verdict |", "| --- | --- | --- |"]
    for t in targets:
        mats = {a: matrix(rows, a, t["split"], t0, default) for a in p.arms}
        mats = {a: m for a, m in mats.items() if m[0]}

        def rate(a):
            vals = [v for row in mats[a][2] for v in row if v is not None]
            return sum(vals) / len(vals)

        pool = {"best_trained": p.trained_arms(), "best_online": p.online_arms()}.get(t["arm"], [t["arm"]])
        pool = [a for a in pool if a in mats]
        if not pool or t["against"] not in mats:
            lines.append(f"| {t['name']} | not measured yet | – |")
            continue
        arm = max(pool, key=rate)
        d, lo, hi = paired_bootstrap(mats[arm], mats[t["against"]])
        need = float(t.get("points", 0)) / 100
        ok = d >= need and (t.get("interval_above") is None or (lo is not None and lo > float(t["interval_above"]) / 100))
        lines.append(f"| {t['name']} | {arm} − {t['against']}: {_diff(d, lo, hi)} | {'met' if ok else 'not met'} |")
    return "\n".join(lines)


def report(p, results: Path) -> str:
    rows = load_rows(results)
    if not rows:
        return f"No results under {results} yet: `halo-train experiment export {p.path}` writes them."
    meta_file = results / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    out = [f"# {p.name}", ""]
    planned = meta.get("planned", {})
    have = defaultdict(int)
    for r in rows:
        have[r["run_id"]] += 1
    short = [run for run, cell in planned.items() if have.get(run, 0) < cell["episodes"]]
    if short:
        out += [f"**PARTIAL**: {len(short)} of {len(planned)} planned cells are short.", ""]
    if meta.get("stage_commits"):
        out += [f"Stages ran at commit(s) {', '.join(c[:12] for c in meta['stage_commits'])}.", ""]
    for temperature in p.temperatures:
        for split in ("test_seeds", "heldout_tasks"):
            text, _ = arm_table(p, rows, split, temperature)
            out += [text, ""]
    evidence_file = results / "evidence.json"
    spent = json.loads(evidence_file.read_text()).get("budget") if evidence_file.exists() else None
    if spent:
        out += ["**Environment budget** (training episodes and steps, from the lake; planned in brackets)", "",
                "| arm | " + " | ".join(sorted({s for seeds in spent.values() for s in seeds})) + " |",
                "| --- " * (1 + len({s for seeds in spent.values() for s in seeds})) + "|"]
        for arm, seeds in spent.items():
            out.append(f"| {arm} | " + " | ".join(f"{v['episodes']} ({v['planned_episodes']}), {v['steps']} steps"
                                                  for _, v in sorted(seeds.items())) + " |")
        out.append("")
    targets = targets_table(p, rows)
    if targets:
        out += ["**Targets** (primary temperature)", "", targets, ""]
    return "\n".join(out).rstrip() + "\n"
