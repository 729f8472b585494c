"""learning-v1's tables from its committed results (bench/results/learning-v1/): success per arm with the
registered intervals, the differences, the held-out curve and the seconds each part took.

    .venv/bin/python -m bench report learning-v1
"""

from __future__ import annotations

import json
import pathlib
import re
from collections import defaultdict
from typing import Any

from halo_data.stats import mean_interval, newcombe, welch_interval, wilson
from halo_train.experiment.report import online_run_key

SPLIT_ORDER = ("test_seeds", "heldout_tasks", "dev")
ARM_ORDER = ("zero_shot", "random", "heuristic", "bc_filtered", "dpo", "online_grpo")
TRAINED = ("bc_filtered", "dpo", "online_grpo")
RUN = "`python -m bench learning run`"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _interval(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{100 * lo:.1f}, {100 * hi:.1f}]"


def _signed(d: float, lo: float | None, hi: float | None) -> str:
    return f"{100 * d:+.1f} " + ("" if lo is None else f"[{100 * lo:+.1f}, {100 * hi:+.1f}]")


def load_rows(results_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = results_dir / "episodes.parquet"
    if not path.exists():
        return []
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def cells(rows: list[dict[str, Any]], split: str) -> dict[str, dict[int, tuple[int, int]]]:
    """arm -> training seed -> (successes, attempts) of the final policies on one split (the curve's
    intermediate online_grpo versions left out)."""
    out: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in rows:
        if r["split"] == split and r.get("version") is None:
            c = out[r["arm"]][r["training_seed"]]
            c[0] += int(r["success"])
            c[1] += 1
    return {arm: {seed: (s, n) for seed, (s, n) in seeds.items()} for arm, seeds in out.items()}


def _arm_rank(arm: str) -> int:
    return ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER)


def _ordered(arms) -> list[str]:
    return sorted(arms, key=lambda a: (_arm_rank(a), a))


def _final_counts(rows: list[dict[str, Any]], keep, column) -> dict[tuple[str, str], list[int]]:
    """(task, column(row)) -> [successes, attempts] of the final policies' episodes that ``keep`` keeps."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r.get("version") is None and keep(r):
            c = counts[(r["task_id"], column(r))]
            c[0] += int(r["success"])
            c[1] += 1
    return counts


def _pooled(seeds: dict[int, tuple[int, int]]) -> tuple[int, int]:
    return sum(s for s, _ in seeds.values()), sum(n for _, n in seeds.values())


def _rates(seeds: dict[int, tuple[int, int]]) -> list[float]:
    return [s / n for s, n in seeds.values() if n]


def split_table(rows: list[dict[str, Any]], split: str, planned: dict[str, Any]) -> str:
    by_arm = cells(rows, split)
    if not by_arm:
        return f"No {split} episodes yet.\n"
    lines = ["| arm | training seeds | attempts | mean over seeds [95% t] | pooled [95% Wilson] | vs zero_shot, pooled [Newcombe] | vs zero_shot, seed means [Welch] | command |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    zero = by_arm.get("zero_shot")
    for arm in _ordered(by_arm):
        seeds = by_arm[arm]
        s, n = _pooled(seeds)
        m, lo, hi = mean_interval(_rates(seeds))
        wl, wh = wilson(s, n)
        planned_n = sum(c["episodes"] for c in planned.values() if c["arm"] == arm and c["split"] == split)
        attempts = f"{n}" + (f" of {planned_n}" if planned_n and n < planned_n else "")
        if zero and arm != "zero_shot":
            zs, zn = _pooled(zero)
            pooled_diff = _signed(*newcombe(s, n, zs, zn))
            seed_diff = _signed(*welch_interval(_rates(seeds), _rates(zero)))
        else:
            pooled_diff = seed_diff = "–"
        lines.append(f"| {arm} | {len(seeds)} | {attempts} | {_pct(m)} {_interval(lo, hi)} | {_pct(s / n)} {_interval(wl, wh)} "
                     f"| {pooled_diff} | {seed_diff} | {RUN} --arms {arm} |")
    if "online_grpo" in by_arm and "bc_filtered" in by_arm:
        o, b = by_arm["online_grpo"], by_arm["bc_filtered"]
        lines.append(f"\nonline_grpo − bc_filtered ({split}): pooled {_signed(*newcombe(*_pooled(o), *_pooled(b)))}, "
                     f"seed means {_signed(*welch_interval(_rates(o), _rates(b)))} (points).")
    return "\n".join(lines) + "\n"


def seed_task_table(rows: list[dict[str, Any]], split: str = "test_seeds") -> str:
    """Success per task (rows) and trained arm's training seed (columns) on one split: where seeds differ, which
    tasks make the difference."""
    counts = _final_counts(rows, lambda r: r["split"] == split and r["arm"] in TRAINED,
                           lambda r: f"{r['arm']} s{r['training_seed']}")
    if not counts:
        return ""
    columns = sorted({col for _, col in counts}, key=lambda c: (TRAINED.index(c.split()[0]), c))
    lines = ["| task | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for task in sorted({t for t, _ in counts}):
        lines.append(f"| {task.split('.', 1)[-1]} | " + " | ".join(
            f"{100 * counts[(task, c)][0] / counts[(task, c)][1]:.0f}" if (task, c) in counts else "–" for c in columns) + " |")
    return "\n".join(lines) + "\n"


# The protocol's targets (its statistics.targets), as differences of pooled rates on a split.
TARGETS = (("test_seeds", "best trained arm ≥ zero_shot + 20 points", 0.20),
           ("heldout_tasks", "best trained arm ≥ zero_shot + 5 points", 0.05))


def _verdict(d: float, lo: float, hi: float, target: float) -> str:
    if lo >= target:
        return "met, its whole interval too"
    if d >= target:
        return "met by the estimate; the interval reaches below"
    if hi >= target:
        return "not met by the estimate; the interval reaches it"
    return "not met: the whole interval lies below"


def targets_table(rows: list[dict[str, Any]]) -> str:
    """Each registered target against the pooled difference that decides it, with its Newcombe interval. The best
    trained arm is the one with the highest pooled rate on that split: chosen after the fact, so its difference
    leans high."""
    lines = []
    for split, text, target in TARGETS:
        by_arm = cells(rows, split)
        trained = [a for a in TRAINED if a in by_arm]
        if "zero_shot" not in by_arm or not trained:
            continue
        best = max(trained, key=lambda a: _pooled(by_arm[a])[0] / _pooled(by_arm[a])[1])
        d, lo, hi = newcombe(*_pooled(by_arm[best]), *_pooled(by_arm["zero_shot"]))
        lines.append(f"| {split}: {text} | {best}: {_signed(d, lo, hi)} | {_verdict(d, lo, hi, target)} |")
    for split in SPLIT_ORDER[:2]:
        by_arm = cells(rows, split)
        if "online_grpo" in by_arm and "bc_filtered" in by_arm:
            d, lo, hi = newcombe(*_pooled(by_arm["online_grpo"]), *_pooled(by_arm["bc_filtered"]))
            lines.append(f"| {split}: online_grpo ≥ bc_filtered at equal environment steps | online_grpo − bc_filtered: "
                         f"{_signed(d, lo, hi)} | {_verdict(d, lo, hi, 0.0)} |")
    if not lines:
        return ""
    return "\n".join(["| target | pooled difference, points [95% Newcombe] | verdict |", "| --- | --- | --- |", *lines]) + "\n"


def task_table(rows: list[dict[str, Any]]) -> str:
    """Pooled success per task (rows) and arm (columns), final policies, test seeds of every task."""
    counts = _final_counts(rows, lambda r: r["split"] != "dev", lambda r: r["arm"])
    if not counts:
        return ""
    arms = _ordered({arm for _, arm in counts})
    tasks = sorted({task for task, _ in counts}, key=lambda t: (not any(r["task_id"] == t and r["split"] == "test_seeds" for r in rows), t))
    lines = ["| task | " + " | ".join(arms) + " |", "| --- |" + " --- |" * len(arms)]
    for task in tasks:
        cells_ = [f"{100 * counts[(task, a)][0] / counts[(task, a)][1]:.0f} ({counts[(task, a)][1]})" if (task, a) in counts else "–"
                  for a in arms]
        lines.append(f"| {task.split('.', 1)[-1]} | " + " | ".join(cells_) + " |")
    return "\n".join(lines) + "\n"


def curve_table(rows: list[dict[str, Any]]) -> str:
    """Held-out tasks on dev seeds against the environment steps the evaluated policy was trained with."""
    points: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["split"] == "dev":
            p = points[(r["arm"], int(r["env_steps"] or 0))]
            p[0] += int(r["success"])
            p[1] += 1
    if not points:
        return "No curve points yet.\n"
    lines = ["| arm | environment steps | held-out success on dev seeds [95% Wilson] | episodes |", "| --- | --- | --- | --- |"]
    for (arm, steps) in sorted(points, key=lambda k: (_arm_rank(k[0]), k[1])):
        s, n = points[(arm, steps)]
        lines.append(f"| {arm} | {steps} | {_pct(s / n)} {_interval(*wilson(s, n))} | {n} |")
    return "\n".join(lines) + "\n"


# An online run's held-out curve evaluates each policy version as one run per dev seed: RUN-eval-vN-sSEED.
_CURVE_RUN = re.compile(r"^(?P<version>.+-eval-v\d+)-s\d+$")


def eval_timing_rows(eval_runs: list[dict[str, Any]]) -> list[tuple[str, int, float, float]]:
    """(run, steps, policy s/step, wall s/step) per evaluation run, an online curve point's per-seed runs summed
    into one row (``RUN-eval-vN``, its seconds weighted by steps)."""
    grouped: dict[str, list[float]] = {}
    for e in eval_runs:
        if not e.get("steps"):
            continue
        m = _CURVE_RUN.match(e["run_id"])
        key = f"{m['version']} ({{}} runs)" if m else e["run_id"]
        g = grouped.setdefault(key, [0, 0.0, 0.0, 0])
        g[0] += e["steps"]
        g[1] += (e["policy_seconds_per_step"] or 0.0) * e["steps"]
        g[2] += (e["wall_seconds_per_step"] or 0.0) * e["steps"]
        g[3] += 1
    return [(key.format(runs), steps, policy / steps, wall / steps) for key, (steps, policy, wall, runs) in grouped.items()]


def timing_table(timing: dict[str, Any]) -> str:
    lines = []
    evals = eval_timing_rows(timing.get("eval_runs", []))
    if evals:
        lines += ["| run | steps | policy s/step | wall s/step |", "| --- | --- | --- | --- |"]
        lines += [f"| {run} | {steps} | {policy:.2f} | {wall:.2f} |" for run, steps, policy, wall in evals]
    for key, its in (timing.get("online_iterations") or {}).items():
        run = " ".join(online_run_key(key))
        for it in its:
            total, update, reload = it.get("iteration_seconds") or 0.0, it.get("update_seconds") or 0.0, it.get("reload_seconds") or 0.0
            rollout = it.get("rollout_seconds") or 0.0
            if rollout + update + reload > total + 1.0:
                # A resumed iteration: its rollout's wall time runs from the first run's start, across the gap.
                lines.append(f"- {run} iteration {it['iteration']}: interrupted and resumed: {total:.0f} s after "
                             f"the resume; rollout {rollout:.0f} s (its wall time spans the gap), update {update:.0f} s, "
                             f"reload {reload:.1f} s ({it.get('update')})")
                continue
            lines.append(f"- {run} iteration {it['iteration']}: {total:.0f} s: rollout {rollout:.0f} s, update {update:.0f} s, "
                         f"reload {reload:.1f} s, the rest (held-out curve, bookkeeping) {max(0.0, total - rollout - update - reload):.0f} s "
                         f"({it.get('update')})")
    for job in timing.get("train_jobs", []):
        took = "not finished" if job["job_seconds"] is None else f"{job['job_seconds']:.0f} s"
        lines.append(f"- {job['job_type']} {pathlib.Path(str(job['output_dir'])).name}: {took}")
    return ("\n".join(lines) + "\n") if lines else "No timings yet.\n"


def signal_table(timing: dict[str, Any]) -> str:
    """online_grpo by iteration: what each update had to learn from (sampled success, reward spread, flat groups)
    and what it did (loss, clipping, the held-out curve)."""
    def num(value, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    lines = []
    for key, its in (timing.get("online_iterations") or {}).items():
        if not any("signal" in it for it in its):
            continue
        arm, seed = online_run_key(key)
        seed = seed if arm == "online_grpo" else f"{arm} {seed}"
        if not lines:
            lines = ["| seed | iteration | sampled success % | reward mean ± std | flat groups % | trainable groups | loss | "
                     "clip ratio | held-out dev % | update |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for it in its:
            g = it.get("signal", {})
            success, heldout, flat = g.get("success_rate/train"), g.get("success_rate/heldout"), g.get("frac_reward_zero_std")
            lines.append(f"| {seed} | {it['iteration']} | {num(None if success is None else 100 * success, '.0f')} | "
                         f"{num(g.get('rewards/mean'), '.3f')} ± {num(g.get('rewards/std'), '.3f')} | "
                         f"{num(None if flat is None else 100 * flat, '.0f')} | {num(g.get('trainable_groups'), '.0f')} | "
                         f"{num(g.get('loss'), '.4f')} | {num(g.get('clip_ratio'), '.3f')} | "
                         f"{num(None if heldout is None else 100 * heldout, '.0f')} | {it.get('update')} |")
    return ("\n".join(lines) + "\n") if lines else ""


def sample_table(evidence: dict[str, Any]) -> str:
    """Successes per task in each training seed's sample: all that bc_filtered trains on (and dpo's chosen side)."""
    samples = evidence.get("samples") or {}
    if not samples:
        return ""
    seeds = list(samples)
    tasks = sorted({t for s in samples.values() for t in s})
    lines = ["| task | " + " | ".join(seeds) + " |", "| --- |" + " --- |" * len(seeds)]
    for task in tasks:
        counts = [f"{samples[s][task]['successes']} of {samples[s][task]['episodes']}" if task in samples[s] else "–"
                  for s in seeds]
        lines.append(f"| {task.split('.', 1)[-1]} | " + " | ".join(counts) + " |")
    totals = [f"{sum(c['successes'] for c in samples[s].values())} of {sum(c['episodes'] for c in samples[s].values())}"
              for s in seeds]
    lines.append("| all | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


def offline_table(evidence: dict[str, Any]) -> str:
    """What each bc/dpo job read and what its train_metrics did, from the mean of its first logged steps to the
    mean of its last (the export's window)."""
    jobs = evidence.get("offline_jobs") or []
    if not jobs:
        return ""

    def move(job: dict[str, Any], metric: str, fmt: str) -> str:
        a, b = job["first"].get(metric), job["last"].get(metric)
        return "–" if a is None or b is None else f"{format(a, fmt)} → {format(b, fmt)}"

    lines = ["| arm | seed | read | epochs | loss | token accuracy | preference accuracy | reward margin | "
             "logp chosen | logp rejected |", "| --- |" + " --- |" * 9]
    for job in sorted(jobs, key=lambda j: (_arm_rank(j["arm"]), str(j["training_seed"]))):
        unit = "pairs" if job["job_type"] == "dpo" else "rows"
        read = "–" if job.get("rows") is None else f"{job['rows']} {unit}"
        epochs = "–" if job.get("epochs") is None else f"{job['epochs']:.1f}"
        lines.append(f"| {job['arm']} | s{job['training_seed']} | {read} | {epochs} | {move(job, 'loss', '.3f')} | "
                     f"{move(job, 'mean_token_accuracy', '.2f')} | {move(job, 'rewards/accuracies', '.2f')} | "
                     f"{move(job, 'rewards/margins', '.3f')} | {move(job, 'logps/chosen', '.1f')} | "
                     f"{move(job, 'logps/rejected', '.1f')} |")
    return "\n".join(lines) + "\n"


REPEATING = 0.5  # a task whose test seeds start on training pages this often is called repeating


def novelty_table(evidence: dict[str, Any]) -> str:
    """Per task of the test splits: how many different first pages zero_shot's episodes start on, and its first
    pages and steps that some training run also had."""
    novelty = evidence.get("state_novelty") or {}
    lines = []
    for split in SPLIT_ORDER[:2]:
        for task, n in sorted((novelty.get(split) or {}).items()):
            if not lines:
                lines = ["| split | task | different first pages | first pages seen in training | "
                         "zero_shot steps seen in training |", "| --- | --- | --- | --- | --- |"]
            lines.append(f"| {split} | {task.split('.', 1)[-1]} | {n.get('distinct_first_pages', '–')} of {n['episodes']} | "
                         f"{n['first_state_seen']} of {n['episodes']} | {n['steps_seen']} of {n['steps']} |")
    return ("\n".join(lines) + "\n") if lines else ""


def repeating_tasks(evidence: dict[str, Any]) -> list[str]:
    """Train tasks whose test seeds mostly start on pages a training run had (the observation renders every seed
    alike): their test seeds measure memory of training states, not new seeds."""
    tasks = (evidence.get("state_novelty") or {}).get("test_seeds") or {}
    return sorted(t for t, n in tasks.items() if n["episodes"] and n["first_state_seen"] / n["episodes"] >= REPEATING)


def without_tasks_table(rows: list[dict[str, Any]], split: str, dropped: list[str]) -> str:
    """Pooled success per arm on a split with some tasks left out (an exploratory reading, not the protocol's)."""
    by_arm: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["split"] == split and r["task_id"] not in dropped:
            by_arm[r["arm"]][0] += int(r["success"])
            by_arm[r["arm"]][1] += 1
    lines = ["| arm | attempts | pooled [95% Wilson] |", "| --- | --- | --- |"]
    for arm in _ordered(by_arm):
        k, n = by_arm[arm]
        lines.append(f"| {arm} | {n} | {_pct(k / n)} {_interval(*wilson(k, n))} |")
    return "\n".join(lines) + "\n"


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def report(results_dir: pathlib.Path) -> str:
    results_dir = pathlib.Path(results_dir)
    meta = _read_json(results_dir / "meta.json")
    planned = meta.get("planned", {})
    rows = load_rows(results_dir)
    done: dict[str, int] = defaultdict(int)
    for r in rows:
        done[r["run_id"]] += 1
    short = [run for run, c in planned.items() if done.get(run, 0) < c["episodes"]]
    out = [f"Protocol `{meta.get('protocol', 'bench/protocols/learning-v1.yaml')}` (registered at commit "
           f"{(meta.get('registered_at_commit') or '?')[:10]}); exported {meta.get('exported_at', '?')}.\n"]
    if short:
        out.append(f"**PARTIAL**: {len(planned) - len(short)} of {len(planned)} planned evaluation cells are complete; "
                   "the figures below are of the episodes that exist and say nothing about the arms still missing.\n")

    def section(heading: str, body: str) -> None:
        if body:  # a section with nothing to show yet (an older export, an arm not run) is left out
            out.append(f"{heading}:\n\n{body}")

    for split in SPLIT_ORDER[:2]:
        section(f"**{split}** (success %, 95% intervals)", split_table(rows, split, planned))
    section("**Targets** (the protocol's `statistics.targets`, reported whatever they show)", targets_table(rows))
    section("**Per task** (pooled success %, attempts; train tasks first)", task_table(rows))
    section("**Per task and training seed** (test seeds of the train tasks, success %)", seed_task_table(rows))
    section("**Curve** (held-out tasks, dev seeds)", curve_table(rows))
    timing = _read_json(results_dir / "timing.json")
    section("**online_grpo by iteration** (the lake's `train_metrics` of each online run)", signal_table(timing))
    evidence = _read_json(results_dir / "evidence.json")
    section("**How new the test states are** (zero_shot's evaluation episodes: first pages, and steps, whose prompt some "
            "training run also had; the first page does not depend on the policy)", novelty_table(evidence))
    repeating = repeating_tasks(evidence)
    if repeating:
        names = ", ".join(t.split(".", 1)[-1] for t in repeating)
        section(f"At least {100 * REPEATING:.0f}% of the test seeds of {names} start on a page that training had: the "
                "observation renders those seeds alike, so there they measure memory of training states rather than "
                "new seeds. The test seeds without them, an exploratory reading that the protocol did not register",
                without_tasks_table(rows, "test_seeds", repeating))
    section("**The samples the offline arms learn from** (successes of the base model's sampled episodes, per task and "
            "training seed)", sample_table(evidence))
    window = (evidence.get("offline_jobs") or [{}])[0].get("window", "a few")
    section(f"**bc_filtered and dpo training** (what each job read; its train_metrics from the mean of the first "
            f"{window} logged steps to the mean of the last {window})", offline_table(evidence))
    section("**Seconds**", timing_table(timing))
    p = _read_json(results_dir / "speed-probe.json")
    if p:
        out.append(f"One online-grpo iteration outside the experiment ({p['date']}, load {p['load_average_1min']} on "
                   f"{p['cpus']} CPUs; `{p['command']}`): rollout {p['rollout_seconds']:.0f} s for {p['rollout_steps']} steps "
                   f"({p['policy_seconds_per_step']:.2f} s per policy step), update {p['update_seconds']:.0f} s for "
                   f"{p['update_optimizer_steps']} optimizer step over {p['update_rows']} rows ({p['update_tokens']} tokens), "
                   f"reload {p['reload_seconds']:.1f} s; {p['iteration_seconds']:.0f} s in all.\n")
    return "\n".join(out)
