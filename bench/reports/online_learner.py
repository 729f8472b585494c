"""A job per update against the persistent learner (`python -m bench online-learner`): how far each update moves
the adapter, the rows it trains, its seconds per row, and dev success, side by side."""

from __future__ import annotations

import pathlib

from bench.online_learner import _mean
from bench.reports import load_runs, provenance, table


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    out = []
    for run in runs:
        o = run.get("options", {})
        out.append(f"{len(o.get('tasks', '').split(','))} tasks ({o.get('tasks', '?')}), at most "
                   f"{o.get('max_episode_steps', '?')} steps per episode, groups of {o.get('group_size', '?')}, "
                   f"{o.get('iterations', '?')} iterations; jobs: {o.get('train_steps', '?')} steps of "
                   f"{o.get('batch_size', '?')} rows an update, persistent: {o.get('mini_batch_size', '?')} rows an "
                   f"optimizer step{_guard(o)}:\n")
        rows = []
        for arm, r in run["arms"].items():
            p = r["per_iteration"]
            heldout = [f"it {k + 1}: {v:.0%}" for k, v in enumerate(p["success_rate/heldout"]) if v is not None]
            m = run["means"][arm]
            last = [v for v in p["displacement_from_base"] if v is not None]
            rows.append([arm, _fmt(m["displacement_from_previous"], ".4f"), _fmt(last[-1] if last else None, ".4f"),
                         _fmt(adds_up(p), ".2f"),
                         _fmt(_mean(p["optimizer_steps"]), ".1f"), _fmt(_mean(p["approx_kl"]), ".4f"),
                         _fmt(_mean(p["success_rate/train"][len(p["success_rate/train"]) // 2:]), ".0%"),
                         _fmt(m["rows_trained"], ".0f"),
                         _fmt(m["update_seconds"], ".1f"), _fmt(m["seconds_per_trained_row"], ".2f"),
                         _fmt(m.get("cpu_seconds_per_trained_row"), ".2f"),
                         _fmt(m["step_advantage_share"], ".2f"), ", ".join(heldout) or "–", r["commit"][:10]])
        head = ["arm", "moved per iteration", "moved from base at the end", "of the moves, net", "optimizer steps per update",
                "KL(new‖old) per update", "sampled success, second half", "rows trained", "update s", "s per trained row", "CPU s per trained row",
                "step share of advantage",
                "dev success", "commit"]
        out.append(table(head, rows))
        out.append(per_iteration(run))
        ratios = []
        if "displacement_ratio" in run:
            ratios.append(f"persistent / jobs displacement per iteration: {run['displacement_ratio']:.2f}× (target ≥ 3×)")
        end = {arm: ([v for v in r["per_iteration"]["displacement_from_base"] if v is not None] or [None])[-1]
               for arm, r in run["arms"].items()}
        if end.get("jobs") and end.get("persistent") is not None:
            ratios.append(f"persistent / jobs moved from base at the end: {end['persistent'] / end['jobs']:.2f}× (no "
                          "target: what the iterations' updates add up to)")
        n = len(run["arms"].get("jobs", {}).get("per_iteration", {}).get("displacement_from_previous", []))
        net = {arm: adds_up(r["per_iteration"]) for arm, r in run["arms"].items()}
        if net.get("jobs") is not None and net.get("persistent") is not None and n:
            ratios.append(f"of the moves, net (moved from base at the end / the iterations' moves added up; 1: every "
                          f"update in one direction, {n ** -0.5:.2f}: {n} independent directions): jobs "
                          f"{net['jobs']:.2f}, persistent {net['persistent']:.2f}")
        kl = {arm: _mean(r["per_iteration"]["approx_kl"]) for arm, r in run["arms"].items()}
        if kl.get("jobs") and kl.get("persistent") is not None:
            ratios.append(f"persistent / jobs approx KL(new‖old) per update: {kl['persistent'] / kl['jobs']:.2f}× "
                          "(no target: what an update does to the policy on its own rows)")
        if "seconds_per_row_ratio" in run:
            ratios.append(f"update seconds per trained row: {run['seconds_per_row_ratio']:.2f}× (target ≤ 0.7×)")
        if "cpu_seconds_per_row_ratio" in run:
            ratios.append(f"update CPU seconds per trained row: {run['cpu_seconds_per_row_ratio']:.2f}× (target ≤ 0.7×)")
        out.append("\n".join(f"- {line}" for line in ratios + [
            f"{provenance(run)}; load {run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after"]) + "\n")
    return "\n".join(out)


def adds_up(p: dict) -> float | None:
    """How much of an arm's movement is net: its displacement from the base at the end over the sum of its
    iterations' displacements from the version before (1 when every update moves the same way; about 1/sqrt(n) for
    n updates in independent directions, a random walk)."""
    moves = [v for v in p["displacement_from_previous"] if v is not None]
    last = [v for v in p["displacement_from_base"] if v is not None]
    return last[-1] / sum(moves) if moves and last and sum(moves) > 0 else None


def per_iteration(run: dict) -> str:
    """Iteration by iteration, each arm's displacement from the version before, rows trained / produced and update
    seconds."""
    arms = list(run["arms"])
    n = max(len(r["per_iteration"]["displacement_from_previous"]) for r in run["arms"].values())
    rows = []
    for k in range(n):
        row = [str(k + 1)]
        for arm in arms:
            p = run["arms"][arm]["per_iteration"]
            row.append(f"{_fmt(p['displacement_from_previous'][k], '.4f')}, {_fmt(p['rows_trained'][k], '.0f')}/"
                       f"{_fmt(p['rows_produced'][k], '.0f')} rows, {_fmt(p['update_seconds'][k], '.0f')} s")
        rows.append(row)
    return table(["iteration", *(f"{arm}: moved, rows trained/produced, update s" for arm in arms)], rows)


def _guard(options: dict) -> str:
    """The persistent arms' --target-kl and --warmup-steps, where the run had them."""
    given = [f"--{name.replace('_', '-')} {options[name]:g}" for name in ("target_kl", "warmup_steps") if options.get(name)]
    return f", {' and '.join(given)}" if given else ""
