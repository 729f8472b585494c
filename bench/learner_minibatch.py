"""The persistent learner's default minibatch: 8 rows an optimizer step against 4, on three training seeds.

    .venv/bin/python -m bench learner-minibatch --workdir runs/learner-minibatch      # the protocol's runs
    .venv/bin/python -m bench learner-minibatch --seeds 0 --iterations 2 --tasks click-option --workdir runs/lm-small
    .venv/bin/python -m bench learner-kl-guard --workdir runs/learner-kl-guard         # 4 rows a step with --target-kl
    .venv/bin/python -m bench learner-warmup --workdir runs/learner-warmup             # ... and --warmup-steps 16

The question, the design and the decision rule are in ``bench/protocols/learner-minibatch.md``, committed before the
first run (``bench/protocols/learner-kl-guard.md`` for ``learner-kl-guard``: the same runs and rule, each arm a
minibatch size and a ``--target-kl``, ``--target-kls``; ``bench/protocols/learner-warmup.md`` for ``learner-warmup``,
each arm ``--warmup-steps`` as well). Each (minibatch size, training seed) is its own online run (``halo-train online-grpo --serve --engine
chat``, the persistent learner, omega 1) with its own lake, from the same base model: seed ``s`` samples and trains
with ``--seed s`` on task seeds from ``--train-seed-start + s * --seed-stride``, one new task seed an iteration;
every run is evaluated on the same dev seeds after iterations 4 and 8. A seed's runs are interleaved iteration by
iteration (size 8's iteration k, size 4's, then k + 1).

Per run, from its lake: each iteration's sampled successes and episodes, dev successes after each evaluation, and
``train_metrics``' KL(new‖old), clip fraction, displacement, optimizer steps and update seconds per trained row.
Then, per size, the primary measure (sampled success in the second half of the iterations, versions the first half
trained, on task seeds no update has seen) pooled over seeds with a Wilson interval, its 4 − 8 difference with
Newcombe's interval (pooled) and Welch's (over the seeds' rates), dev success, and the protocol's decision.

Resumable: ``--workdir`` keeps every run's lake and adapters; the same command continues each where it stopped and
records the commit each run started at. Results go to bench/results/learner-minibatch/.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from bench.online_learner import _mean, arm_config, arm_results, run_iterations, start
from bench.reports import save

TASKS = "click-checkboxes,click-option,click-collapsible,choose-list,click-button-sequence,navigate-tree"
# The protocol's decision rule (bench/protocols/learner-minibatch.md), fixed before the first run.
DEV_MARGIN = 0.05  # the candidate's dev success after the last evaluation may be at most this far below the default's
MAX_KL = 0.05  # no update's approximate KL(new || old) above this
MAX_CLIP = 0.1  # mean clip fraction at most this, on every seed


def main(argv: list[str] | None = None, name: str = "learner-minibatch", target_kls: str = "none,none",
         warmup_steps: str = "0,0", workdir: str = "runs/learner-minibatch") -> None:
    ap = argparse.ArgumentParser(prog=f"python -m bench {name}", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--mini-batch-sizes", default="8,4", help="Rows per optimizer step, the default first, then the candidate.")
    ap.add_argument("--target-kls", default=target_kls,
                    help="Each arm's --target-kl, in the order of --mini-batch-sizes (none: no early stop).")
    ap.add_argument("--warmup-steps", default=warmup_steps,
                    help="Each arm's --warmup-steps, in the order of --mini-batch-sizes (0: none).")
    ap.add_argument("--seeds", default="0,1,2", help="Training seeds.")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-episode-steps", type=int, default=6)
    ap.add_argument("--train-seed-start", type=int, default=300_000, help="Seed 0's first train task seed.")
    ap.add_argument("--seed-stride", type=int, default=1000, help="Seed s trains on task seeds from --train-seed-start + s * this.")
    ap.add_argument("--eval-seed-start", type=int, default=350_000, help="Dev seeds, the same for every run.")
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-seeds", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=8, help="Rows per forward pass.")
    ap.add_argument("--workdir", default=workdir, help="Lakes, adapters and logs of the runs (resumed).")
    a = ap.parse_args(argv)
    sizes = _ints(ap, a.mini_batch_sizes, "--mini-batch-sizes")
    arms = _arms(ap, sizes, a.target_kls, a.warmup_steps)
    seeds = _ints(ap, a.seeds, "--seeds")
    last_train_seed = a.train_seed_start + max(seeds) * a.seed_stride + a.iterations - 1
    if a.iterations > a.seed_stride or last_train_seed >= a.eval_seed_start:
        ap.error(f"train task seeds must not repeat across seeds (--iterations <= --seed-stride) and must end before "
                 f"--eval-seed-start {a.eval_seed_start} (the last is {last_train_seed})")
    t0, load_before = start()
    work = Path(a.workdir)
    runs: dict[str, dict] = {}
    for seed in seeds:
        running = {label: _arm(a, arm, label, seed, work) for label, arm in arms.items()}
        for k in range(a.iterations):
            for label, (ns, cfg, folder) in running.items():
                run_iterations(f"mb{label}-s{seed}", cfg, k + 1)
        for label, (ns, cfg, folder) in running.items():
            runs[f"mb{label}-s{seed}"] = {"arm": label, "mini_batch_size": ns.mini_batch_size, "target_kl": ns.target_kl,
                                          "warmup_steps": ns.warmup_steps,
                                          "seed": seed, "train_seed_start": ns.train_seed_start,
                                          **arm_results(ns, "persistent", cfg, folder), **counts(cfg, a.iterations)}
    load_after = os.getloadavg()
    summary = {"options": vars(a), "load_before": load_before, "load_after": load_after, "cores": os.cpu_count(),
               "runs": runs, "sizes": {label: by_size(runs, label, a.iterations) for label in arms}}
    started = {r["commit"] for r in runs.values()}
    if len(started) == 1:  # the commit every run started at, not the checkout's at the end
        summary["commit"] = started.pop()
    if len(arms) == 2:
        summary["comparison"] = compare(*(summary["sizes"][label] for label in arms), *arms)
        summary["comparison"]["decision_options"] = _options(*arms[summary["comparison"]["decision"]])
    print_summary(summary, list(arms))
    print(f"load average after: {load_after[0]:.2f}")
    out = save(name, summary, argv)
    print(f"{time.perf_counter() - t0:.0f} s; results in {out}")


def _ints(ap: argparse.ArgumentParser, text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{flag} takes integers separated by commas, got {text!r}")
    if not values or len(set(values)) != len(values) or min(values) < (1 if flag == "--mini-batch-sizes" else 0):
        ap.error(f"{flag} takes distinct integers (sizes at least 1, seeds at least 0), got {text!r}")
    return values


def _arms(ap: argparse.ArgumentParser, sizes: list[int], kls_text: str,
          warmups_text: str = "0") -> dict[str, tuple[int, float | None, int]]:
    """Each arm's label (``8``; ``4+kl0.02`` with a --target-kl; ``4+kl0.02+wu16`` with --warmup-steps too) and its
    (minibatch size, --target-kl, --warmup-steps)."""
    def per_arm(text: str, flag: str, parse: Callable[[str], Any], valid: Callable[[Any], bool], what: str) -> list:
        given = [x.strip() for x in text.split(",") if x.strip()]
        if len(given) == 1:
            given *= len(sizes)
        try:
            values = [parse(x) for x in given]
        except ValueError:
            ap.error(f"{flag} takes {what} separated by commas, got {text!r}")
        if len(values) != len(sizes) or not all(valid(v) for v in values):
            ap.error(f"{flag} takes one {what.removesuffix('s')} per --mini-batch-sizes entry ({len(sizes)}), got {text!r}")
        return values

    kls = per_arm(kls_text, "--target-kls", lambda x: None if x == "none" else float(x),
                  lambda kl: kl is None or kl > 0, "positive numbers or none")
    warmups = per_arm(warmups_text, "--warmup-steps", int, lambda w: w >= 0, "integers 0 or more")
    arms = {_label(*arm): arm for arm in zip(sizes, kls, warmups)}
    if len(arms) != len(sizes):
        ap.error("each arm (a minibatch size, a --target-kl and --warmup-steps) must be given once")
    return arms


def _label(size: int, kl: float | None, warmup: int) -> str:
    return f"{size}" + (f"+kl{kl:g}" if kl is not None else "") + (f"+wu{warmup}" if warmup else "")


def _options(size: int, kl: float | None, warmup: int = 0) -> str:
    return (f"--mini-batch-size {size}" + (f" --target-kl {kl:g}" if kl is not None else "")
            + (f" --warmup-steps {warmup}" if warmup else ""))


def _arm(a: argparse.Namespace, arm: tuple[int, float | None, int], label: str, seed: int, work: Path):
    """The persistent learner's online run with ``arm``'s rows an optimizer step, --target-kl and --warmup-steps,
    training seed ``seed``."""
    size, kl, warmup = arm
    ns = argparse.Namespace(**{**vars(a), "mini_batch_size": size, "target_kl": kl, "warmup_steps": warmup,
                               "seed": seed, "train_steps": None,
                               "train_seed_start": a.train_seed_start + seed * a.seed_stride})
    folder = work / f"mb{label}" / f"s{seed}"
    return ns, arm_config(ns, "persistent", folder), folder


def counts(cfg, iterations: int) -> dict:
    """The run's successes and episodes: each iteration's rollout (``RUN-kK``), each dev evaluation (``RUN-eval-vV-sSEED``,
    in the order of the versions evaluated)."""
    from halo_data.lake import Lake

    rows = Lake.open(cfg.lake).query_arrow(
        "select run_id, count(*) as n, count(*) filter (where success) as s from episodes "
        "where starts_with(run_id, $p) group by run_id", {"p": f"{cfg.run_id}-"}).to_pylist()
    sampled = [[0, 0] for _ in range(iterations)]
    dev: dict[int, list[int]] = {}
    for r in rows:
        rollout = re.fullmatch(rf"{re.escape(cfg.run_id)}-k(\d+)", r["run_id"])
        evaluation = re.fullmatch(rf"{re.escape(cfg.run_id)}-eval-v(\d+)-s\d+", r["run_id"])
        if rollout and int(rollout[1]) < iterations:
            sampled[int(rollout[1])] = [r["s"], r["n"]]
        elif evaluation:
            s, n = dev.setdefault(int(evaluation[1]), [0, 0])
            dev[int(evaluation[1])] = [s + r["s"], n + r["n"]]
    return {"sampled": sampled, "dev": [[version, *dev[version]] for version in sorted(dev)]}


def by_size(runs: dict, label: str | int, iterations: int) -> dict:
    """One arm's figures over its seeds (``label``: its minibatch size, ``4+kl0.02`` with a --target-kl): the primary
    measure pooled and per seed, dev success at each evaluation pooled, and the update's KL, clip fraction,
    displacement, steps and seconds per row."""
    from halo_data.stats import wilson

    mine = [r for r in runs.values() if r.get("arm", str(r["mini_batch_size"])) == str(label)]
    half = iterations // 2
    primary = [[sum(s for s, _ in r["sampled"][half:]), sum(n for _, n in r["sampled"][half:])] for r in mine]
    s, n = sum(x for x, _ in primary), sum(x for _, x in primary)
    dev = []
    for i in range(max((len(r["dev"]) for r in mine), default=0)):
        cells = [r["dev"][i] for r in mine if len(r["dev"]) > i]
        ds, dn = sum(c[1] for c in cells), sum(c[2] for c in cells)
        dev.append({"evaluation": i + 1, "versions": [c[0] for c in cells], "successes": ds, "episodes": dn,
                    "rate": ds / dn if dn else None, "wilson": wilson(ds, dn)})
    per = [r["per_iteration"] for r in mine]

    def values(key: str) -> list[float]:
        return [v for p in per for v in p[key] if v is not None]

    kl = values("approx_kl")
    clip_by_seed = {r["seed"]: _mean([v for v in r["per_iteration"]["clip_ratio"] if v is not None]) for r in mine}
    return {
        "seeds": [r["seed"] for r in mine],
        "primary": {"iterations": [half + 1, iterations], "successes": s, "episodes": n, "rate": s / n if n else None,
                    "wilson": wilson(s, n), "by_seed": {str(r["seed"]): c for r, c in zip(mine, primary)}},
        "dev": dev,
        "approx_kl_mean": _mean(kl), "approx_kl_max": max(kl, default=None),
        "clip_ratio_mean_by_seed": {str(k): v for k, v in clip_by_seed.items()},
        "displacement_from_previous": _mean(values("displacement_from_previous")),
        "optimizer_steps": _mean(values("optimizer_steps")), "rows_trained": _mean(values("rows_trained")),
        "seconds_per_trained_row": _mean(values("seconds_per_trained_row")),
        "cpu_seconds_per_trained_row": _mean(values("cpu_seconds_per_trained_row")),
    }


def compare(d: dict, c: dict, default: str, candidate: str) -> dict:
    """candidate − default, from their :func:`by_size` figures ``c`` and ``d``: the primary measure (Newcombe,
    pooled; Welch, over the seeds' rates), dev success after the last evaluation (Newcombe), the candidate's
    stability, and the protocol's decision."""
    from halo_data.stats import newcombe, welch_interval

    rates = {size: [s / n for s, n in x["primary"]["by_seed"].values() if n] for size, x in ((default, d), (candidate, c))}
    out: dict = {
        "default": default, "candidate": candidate,
        "primary_pooled": newcombe(c["primary"]["successes"], c["primary"]["episodes"],
                                   d["primary"]["successes"], d["primary"]["episodes"]),
        "primary_seed_means": welch_interval(rates[candidate], rates[default]),
    }
    if d["dev"] and c["dev"]:
        out["dev_last_pooled"] = newcombe(c["dev"][-1]["successes"], c["dev"][-1]["episodes"],
                                          d["dev"][-1]["successes"], d["dev"][-1]["episodes"])
    clips = [v for v in c["clip_ratio_mean_by_seed"].values() if v is not None]
    checks = {
        "primary_not_lower": out["primary_pooled"][0] >= 0,
        "dev_within_margin": "dev_last_pooled" in out and out["dev_last_pooled"][0] >= -DEV_MARGIN,
        "stable": (c["approx_kl_max"] is not None and c["approx_kl_max"] <= MAX_KL and bool(clips)
                   and max(clips) <= MAX_CLIP),
    }
    out["checks"] = checks
    out["decision"] = candidate if all(checks.values()) else default
    return out


def print_summary(summary: dict, labels: list[str]) -> None:
    def pct(x) -> str:
        return "-" if x is None else f"{x:.1%}"

    print("\nrun        sampled success by iteration                      dev success")
    for name, r in summary["runs"].items():
        sampled = " ".join(f"{s}/{n}" for s, n in r["sampled"])
        dev = ", ".join(f"v{v}: {s}/{n}" for v, s, n in r["dev"])
        print(f"{name:<10} {sampled:<50} {dev}")
    for label in labels:
        x = summary["sizes"][label]
        p = x["primary"]
        print(f"mini-batch {label}: sampled success, iterations {p['iterations'][0]}-{p['iterations'][1]}: "
              f"{p['successes']}/{p['episodes']} {pct(p['rate'])} [{pct(p['wilson'][0])}, {pct(p['wilson'][1])}]; dev "
              + ", ".join(f"{pct(e['rate'])} ({e['successes']}/{e['episodes']})" for e in x["dev"])
              + f"; KL mean {x['approx_kl_mean'] or 0:.4f} max {x['approx_kl_max'] or 0:.4f}; moved "
              f"{x['displacement_from_previous'] or 0:.4f} an iteration, {x['optimizer_steps'] or 0:.1f} steps")
    if "comparison" in summary:
        c = summary["comparison"]
        d, lo, hi = c["primary_pooled"]
        print(f"{c['candidate']} - {c['default']}: primary {d:+.1%} [{lo:+.1%}, {hi:+.1%}] (pooled); checks "
              + ", ".join(f"{k} {v}" for k, v in c["checks"].items()) + f"; decision: {c['decision_options']}")


if __name__ == "__main__":
    main()
