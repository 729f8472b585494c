"""An experiment's report from its exported episodes.parquet: success per arm, split and temperature, the
differences the protocol names, and its targets, each recomputed from the episodes; then the lake's evidence of
why (success per task and how much of it partial credit, what each training job read and what its train_metrics
say it did, what each online update had to learn from, how many evaluated states training had already seen:
evidence.json and timing.json; and how much each arm's first action depends on the page).

Intervals: each arm's pooled rate with Wilson's interval; each difference paired by task seed with a two-level
bootstrap (``paired_bootstrap``) that resamples the task seeds (the same draw for both arms: the pairing) and each
arm's own training or sampling seeds, so an interval carries both arms' seed-to-seed and binomial variance.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from halo_data.stats import wilson
from halo_train.experiment.screen import screening_rules

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


def final_rows(rows: list[dict[str, Any]], split: str, temperature: float, default: float) -> list[dict[str, Any]]:
    """The episodes of final policies (not an online arm's dev curve) on one split at one temperature."""
    return [r for r in rows if r["split"] == split and r.get("version") is None and _temperature(r, default) == temperature]


def matrix(rows: list[dict[str, Any]], arm: str, split: str, temperature: float, default: float):
    """(seeds, units, successes[seed][unit]) of one arm's final policies: a unit is (task, task seed); attempts of a
    unit are averaged."""
    cells: dict[int, dict[tuple[str, int], list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in final_rows(rows, split, temperature, default):
        if r["arm"] == arm:
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


def arm_table(p, rows: list[dict[str, Any]], split: str, temperature: float,
              title: str | None = None) -> tuple[str, dict[str, Any]]:
    default = float(p.interface["temperature"])
    arms = [a for a in p.arms if any(r["arm"] == a and r["split"] == split and _temperature(r, default) == temperature
                                     for r in rows)]
    mats = {a: matrix(rows, a, split, temperature, default) for a in arms}
    final = final_rows(rows, split, temperature, default)
    lines = [title or f"**{split}, temperature {temperature:g}**", "",
             "| arm | seeds | attempts | success % [Wilson] | per seed | vs zero_shot (paired, both variances) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for arm in arms:
        seeds, units, values = mats[arm]
        episodes = [r for r in final if r["arm"] == arm]
        successes, attempts = sum(r["success"] for r in episodes), len(episodes)
        lo, hi = wilson(successes, attempts)
        per_seed = ", ".join(_pct(sum(v for v in row if v is not None) / max(1, sum(v is not None for v in row)))
                             for row in values)
        vs = "–" if arm == "zero_shot" or "zero_shot" not in mats else _diff(*paired_bootstrap(mats[arm], mats["zero_shot"]))
        lines.append(f"| {arm} | {len(seeds)} | {attempts} | {_pct(successes / attempts if attempts else None)} "
                     f"[{_pct(lo)}, {_pct(hi)}] | {per_seed} | {vs} |")
    return "\n".join(lines), mats


def trained_pairs_table(p, rows: list[dict[str, Any]]) -> str:
    """Every pair of trained arms at the primary temperature, on each split: the difference paired by task seed with
    both arms' seed-to-seed and binomial variance (what separates one learner from another, as the differences from
    zero-shot above separate each from the base model), each arm against those the protocol lists before it."""
    t0, default = p.temperatures[0], float(p.interface["temperature"])
    splits = ("test_seeds", "heldout_tasks")
    mats = {(a, s): matrix(rows, a, s, t0, default) for a in p.trained_arms() for s in splits}
    arms = [a for a in p.trained_arms() if any(mats[a, s][0] for s in splits)]
    pairs = [(b, a) for i, a in enumerate(arms) for b in arms[i + 1:]]  # each later arm against each earlier one
    if not pairs:
        return ""
    lines = [f"**Trained arms against each other** (temperature {t0:g}, paired by task seed, both arms' variances)", "",
             "| difference | " + " | ".join(splits) + " |", "| --- " * (1 + len(splits)) + "|"]
    for a, b in pairs:
        cells = [_diff(*paired_bootstrap(mats[a, s], mats[b, s])) if mats[a, s][0] and mats[b, s][0] else "–"
                 for s in splits]
        lines.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def _short(task: str) -> str:
    return task.removeprefix("miniwob.")


def per_task_table(p, rows: list[dict[str, Any]], split: str, temperature: float) -> str:
    """Successes per task and arm (final policies, every training or sampling seed pooled): where a gain or a loss
    comes from."""
    default = float(p.interface["temperature"])
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in final_rows(rows, split, temperature, default):
        cell = cells[(r["task_id"], r["arm"])]
        cell[0] += int(r["success"])
        cell[1] += 1
    arms = [a for a in p.arms if any(arm == a for _, arm in cells)]
    if not arms:
        return ""
    lines = [f"**Per task: {split}, temperature {temperature:g}** (successes / attempts, seeds pooled)", "",
             "| task | " + " | ".join(arms) + " |", "| --- " * (1 + len(arms)) + "|"]
    for task in sorted({t for t, _ in cells}):
        row = []
        for arm in arms:
            ok, n = cells.get((task, arm), (0, 0))
            row.append(f"{ok}/{n} ({100 * ok / n:.0f}%)" if n else "–")
        lines.append(f"| {_short(task)} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def partial_credit_table(p, rows: list[dict[str, Any]], split: str, temperature: float) -> str:
    """How many successes had every part of the answer right, on the tasks that give partial credit. A success is
    BrowserGym's: the environment's raw reward above 0. MiniWoB's checkbox tasks score +1 per box right and -1 per
    box wrong, over the boxes, so an answer with most boxes right is a success: submitting before checking
    anything succeeds whenever fewer than half the boxes are asked for. A task shows here when one of its successes
    had a raw reward below 1; empty for an export without raw rewards."""
    default = float(p.interface["temperature"])
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    partial: set[str] = set()
    for r in final_rows(rows, split, temperature, default):
        raw = r.get("raw_reward")
        cell = cells[(r["task_id"], r["arm"])]
        cell[0] += int(bool(r["success"]) and raw is not None and raw >= 1.0)
        cell[1] += int(r["success"])
        cell[2] += 1
        if r["success"] and raw is not None and raw < 1.0:
            partial.add(r["task_id"])
    arms = [a for a in p.arms if any(arm == a for _, arm in cells)]
    if not partial or not arms:
        return ""
    lines = [f"**Partial credit: {split}, temperature {temperature:g}** (on the tasks whose successes include answers "
             "with a raw reward below 1: successes with every part right / successes / attempts, seeds pooled; a "
             "success is the raw reward above 0)", "",
             "| task | " + " | ".join(arms) + " |", "| --- " * (1 + len(arms)) + "|"]
    for task in sorted(partial):
        row = []
        for arm in arms:
            right, ok, n = cells.get((task, arm), (0, 0, 0))
            row.append(f"{right}/{ok}/{n}" if n else "–")
        lines.append(f"| {_short(task)} | " + " | ".join(row) + " |")
    strict = []
    for arm in arms:
        mine = {t: c for (t, a), c in cells.items() if a == arm}
        ok, n = sum(c[1] for c in mine.values()), sum(c[2] for c in mine.values())
        partial_only = sum(c[1] - c[0] for t, c in mine.items() if t in partial)
        strict.append(f"{100 * (ok - partial_only) / n:.1f} ({100 * ok / n:.1f})" if n else "–")
    lines.append("| all tasks: success % without those partial answers (with them) | " + " | ".join(strict) + " |")
    return "\n".join(lines)


def first_actions_table(p, rows: list[dict[str, Any]], split: str) -> str:
    """Whether an arm's first action depends on the page: per task, how many of its episodes (final policies, seeds
    pooled, at the lowest temperature the arm was evaluated at: least blurred by sampling) open with the arm's most
    frequent first action there, and that action. The heuristic's column shows how the right first actions spread
    over the task's pages; a policy that opens the same way on every page does not read them. Empty for an export
    without first actions."""
    default = float(p.interface["temperature"])
    opened = [r for r in rows if r["split"] == split and r.get("version") is None and r.get("first_action") is not None]
    temperatures: dict[str, float] = {}
    for r in opened:
        temperatures[r["arm"]] = min(temperatures.get(r["arm"], math.inf), _temperature(r, default))
    firsts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in opened:
        if _temperature(r, default) == temperatures[r["arm"]]:
            firsts[(r["task_id"], r["arm"])][r["first_action"]] += 1
    arms = [a for a in p.arms if a in temperatures]
    if not arms:
        return ""
    lines = [f"**First actions: {split}** (episodes that open with the arm's most frequent first action on the task / "
             "episodes, and that action; each arm at its lowest temperature)", "",
             "| task | " + " | ".join(f"{a} (T={temperatures[a]:g})" for a in arms) + " |", "| --- " * (1 + len(arms)) + "|"]
    for task in sorted({t for t, _ in firsts}):
        row = []
        for arm in arms:
            counts = firsts.get((task, arm))
            if not counts:
                row.append("–")
                continue
            action, top = counts.most_common(1)[0]
            row.append(f"{top}/{sum(counts.values())} `{action}`".replace("|", "\\|"))
        lines.append(f"| {_short(task)} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _ends(job: dict[str, Any], metric: str, digits: int = 3) -> str:
    first, last = job.get("first", {}).get(metric), job.get("last", {}).get(metric)
    return "–" if first is None or last is None else f"{first:.{digits}f} → {last:.{digits}f}"


def offline_table(evidence: dict[str, Any]) -> str:
    """Each bc/dpo job: what it read (rows, passes over them) and its train_metrics at its start and its end."""
    jobs = evidence.get("offline_jobs") or []
    if not jobs:
        return ""
    window = jobs[0].get("window", 1)
    lines = [f"**Training jobs** (train_metrics: the mean of the first and of the last {window} logged steps)", "",
             "| arm | seed | round | read | rows | passes | steps | loss | token accuracy | reward accuracy | reward margin |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for j in jobs:
        epochs = j.get("epochs")
        lines.append(
            f"| {j['arm']} | {j['training_seed']} | {'–' if j.get('round') is None else j['round']} | {j['job_type']} | "
            f"{j.get('rows') if j.get('rows') is not None else '–'} | {'–' if epochs is None else f'{epochs:.2f}'} | "
            f"{j.get('logged_steps', 0)} | {_ends(j, 'loss')} | {_ends(j, 'mean_token_accuracy', 2)} | "
            f"{_ends(j, 'rewards/accuracies', 2)} | {_ends(j, 'rewards/margins')} |")
    return "\n".join(lines)


def samples_table(evidence: dict[str, Any]) -> str:
    """Each training seed's sample of the base model (dpo's data, and what bc_filtered's first round keeps)."""
    samples = evidence.get("samples") or {}
    if not samples:
        return ""
    tasks = sorted({t for per_task in samples.values() for t in per_task})
    lines = ["**Samples of the base model** (successes / episodes per task: the pairs and successes learnt from)", "",
             "| seed | " + " | ".join(_short(t) for t in tasks) + " |", "| --- " * (1 + len(tasks)) + "|"]
    for seed, per_task in sorted(samples.items()):
        lines.append(f"| {seed} | " + " | ".join(
            f"{per_task[t]['successes']}/{per_task[t]['episodes']}" if t in per_task else "–" for t in tasks) + " |")
    return "\n".join(lines)


def _halves(values: list[float]) -> str:
    if not values:
        return "–"
    half = max(1, len(values) // 2)
    first, second = values[:half], values[half:] or values[-1:]
    return f"{sum(first) / len(first):.3g} → {sum(second) / len(second):.3g}"


def online_run_key(key: str) -> tuple[str, str]:
    """(arm, "sN") of a key of timing.json's ``online_iterations``: "ARM-sN"; exports older than the second online arm
    wrote online_grpo's as "sN"."""
    arm, _, seed = key.rpartition("-")
    return arm or "online_grpo", seed


def online_table(timing: dict[str, Any]) -> str:
    """What each online run's updates had to learn from, and what they did: its iterations' signals, the mean of the
    first half of the iterations and of the second."""
    runs = timing.get("online_iterations") or {}
    if not any(runs.values()):
        return ""
    # (the keys a signal is recorded under, newest first: the persistent learner's approx_kl, the per-job update's kl)
    signals = ((("success_rate/train",), "sampled success"), (("rewards/std",), "reward std"),
               (("frac_reward_zero_std",), "groups without spread"), (("trainable_groups",), "trainable groups"),
               (("rows_produced",), "rows produced"), (("rows_trained",), "rows trained"), (("approx_kl", "kl"), "KL"),
               (("displacement_from_previous",), "moved"), (("step_advantage_share",), "step credit share"),
               (("clip_ratio",), "clipped"))

    def value(it: dict[str, Any], keys: tuple[str, ...]) -> float | None:
        got = next((it.get("signal", {}).get(k) for k in keys if it.get("signal", {}).get(k) is not None), None)
        return None if got is None else float(got)

    lines = ["**Online updates** (each iteration's signal, the mean of the first half of the iterations → the second; "
             "moved: the adapter's displacement from the version before)",
             "", "| run | iterations | trained | " + " | ".join(label for _, label in signals) + " |",
             "| --- " * (3 + len(signals)) + "|"]
    for name, its in sorted(runs.items()):
        if not its:
            continue
        trained = sum(1 for it in its if it.get("update") == "trained")
        cells = [_halves([v for it in its if (v := value(it, keys)) is not None]) for keys, _ in signals]
        arm, seed = online_run_key(name)
        lines.append(f"| {arm}-{seed} | {len(its)} | {trained} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def novelty_table(evidence: dict[str, Any]) -> str:
    """How many evaluated states some training run had seen (zero_shot's episodes: first pages and steps)."""
    novelty = evidence.get("state_novelty") or {}
    if not novelty:
        return ""
    lines = ["**Evaluated states seen in training** (zero_shot's episodes; a state is its prompt, hashed)", "",
             "| split | task | distinct first pages | first pages seen in training | steps seen in training |",
             "| --- | --- | --- | --- | --- |"]
    for split, per_task in sorted(novelty.items()):
        for task, v in sorted(per_task.items()):
            lines.append(f"| {split} | {_short(task)} | {v['distinct_first_pages']}/{v['episodes']} | "
                         f"{v['first_state_seen']}/{v['episodes']} | {v['steps_seen']}/{v['steps']} |")
    return "\n".join(lines)


def seen_tasks(p, evidence: dict[str, Any]) -> dict[str, list[str]]:
    """Per split, the tasks whose evaluated first pages (zero_shot's) training had seen more often than the
    protocol's screening rule ``max_pages_in_training`` lets a dev page be seen."""
    limit = float(screening_rules(p)["max_pages_in_training"])
    novelty = evidence.get("state_novelty") or {}
    return {split: sorted(task for task, v in per_task.items() if v["first_state_seen"] > limit * v["episodes"])
            for split, per_task in novelty.items()}


def new_pages_sections(p, rows: list[dict[str, Any]], evidence: dict[str, Any]) -> list[str]:
    """Success and the targets again without the tasks whose evaluated first pages training had seen (``seen_tasks``):
    what an arm does on pages that are new to it. The protocol's metric stays the registered one; this reads it
    apart."""
    seen = {split: tasks for split, tasks in seen_tasks(p, evidence).items() if tasks}
    if not seen:
        return []
    t0 = p.temperatures[0]
    kept = [r for r in rows if r["task_id"] not in seen.get(r["split"], ())]
    parts = []
    for split, tasks in sorted(seen.items()):
        names = ", ".join(_short(t) for t in tasks)
        text, _ = arm_table(p, kept, split, t0, title=f"**New pages only: {split}, temperature {t0:g}** (without {names}, "
                                                            "whose evaluated first pages training had seen)")
        parts.append(text)
    targets = targets_table(p, kept)
    if targets:
        parts.append("**Targets on new pages only** (read apart; the verdict above is the registered one)\n\n" + targets)
    return parts


def names_table(evidence: dict[str, Any]) -> str:
    """What the elements observation named (zero_shot's evaluation steps): offered elements per step, of them
    without a name, and the steps where none had one."""
    names = evidence.get("observation_names") or {}
    if not names:
        return ""
    lines = ["**What the observation named** (zero_shot's evaluation steps; under `halo-prompt-v2-elements` an element "
             "without an accessible name is a bare `image ''` line, told from the others by position only)", "",
             "| split | task | steps | elements offered per step | of them without a name | steps where none had one |",
             "| --- | --- | --- | --- | --- | --- |"]
    for split, per_task in sorted(names.items()):
        for task, v in sorted(per_task.items()):
            n = max(v["steps"], 1)
            lines.append(f"| {split} | {_short(task)} | {v['steps']} | {v['elements'] / n:.1f} | {v['unnamed'] / n:.1f} | "
                         f"{v['steps_with_no_name']}/{v['steps']} |")
    return "\n".join(lines)


def evidence_sections(p, rows: list[dict[str, Any]], results: Path) -> list[str]:
    """The lake's evidence of why, after the targets: per-task success at the primary temperature, then what the
    trained arms learnt from and did, and how each arm's first actions spread over the pages."""
    t0 = p.temperatures[0]
    parts = [per_task_table(p, rows, split, t0) for split in ("test_seeds", "heldout_tasks")]
    parts += [partial_credit_table(p, rows, split, t0) for split in ("test_seeds", "heldout_tasks")]
    evidence_file, timing_file = results / "evidence.json", results / "timing.json"
    evidence = json.loads(evidence_file.read_text()) if evidence_file.exists() else {}
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
    parts += [samples_table(evidence), offline_table(evidence), online_table(timing), novelty_table(evidence)]
    parts += new_pages_sections(p, rows, evidence)
    parts += [names_table(evidence)]
    parts += [first_actions_table(p, rows, split) for split in ("test_seeds", "heldout_tasks")]
    return [part for part in parts if part]


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
    pairs = trained_pairs_table(p, rows)
    if pairs:
        out += [pairs, ""]
    for section in evidence_sections(p, rows, results):
        out += [section, ""]
    return "\n".join(out).rstrip() + "\n"
