"""The persistent learner at two minibatch sizes on three training seeds (`python -m bench learner-minibatch`,
bench/protocols/learner-minibatch.md): sampled success on new task seeds, dev success, what each update did, and
the protocol's decision."""

from __future__ import annotations

import pathlib

from bench.learner_minibatch import DEV_MARGIN
from bench.reports import load_runs, provenance, table
from bench.reports.learning_v1 import _interval, _pct, _signed
from bench.reports.online_learner import _fmt as _num


def report(results_dir: pathlib.Path) -> str:
    out = []
    for run in load_runs(results_dir):
        o = run["options"]
        first, last = next(iter(run["sizes"].values()))["primary"]["iterations"]
        out.append(f"{len(o['tasks'].split(','))} tasks ({o['tasks']}), at most {o['max_episode_steps']} steps an "
                   f"episode, groups of {o['group_size']}, {o['iterations']} iterations, lr {o['lr']:g}; training seeds "
                   f"{o['seeds']}; dev seeds {o['eval_seed_start']}–{o['eval_seed_start'] + o['eval_seeds'] - 1}, one "
                   f"attempt each, every {o['eval_every']} iterations. Success in %:\n")
        rows = []
        for size, x in run["sizes"].items():
            p = x["primary"]
            seeds = ", ".join(f"s{seed} {_pct(s / n if n else None)}" for seed, (s, n) in p["by_seed"].items())
            dev = "; ".join(f"{_pct(e['rate'])} ({e['successes']}/{e['episodes']})" for e in x["dev"]) or "–"
            clips = [v for v in x["clip_ratio_mean_by_seed"].values() if v is not None]
            rows.append([size, f"{_pct(p['rate'])} {_interval(*p['wilson'])} "
                               f"({p['successes']}/{p['episodes']})", seeds, dev,
                         f"{_num(x['approx_kl_mean'], '.4f')} / {_num(x['approx_kl_max'], '.4f')}",
                         _num(max(clips) if clips else None, ".3f"), _num(x["displacement_from_previous"], ".4f"),
                         _num(x["optimizer_steps"], ".1f"), _num(x["rows_trained"], ".0f"),
                         _num(x["seconds_per_trained_row"], ".2f")])
        out.append(table(["rows an optimizer step", f"sampled success, iterations {first}–{last}, pooled [95% Wilson]",
                          "by seed", "dev success after each evaluation, pooled",
                          "KL(new‖old) per update, mean / largest", "clip fraction, largest seed mean",
                          "moved per iteration", "optimizer steps per update", "rows trained per update",
                          "s per trained row"], rows))
        per_run = [[name, r["mini_batch_size"], r["seed"], r["train_seed_start"],
                    " ".join(f"{s}/{n}" for s, n in r["sampled"]),
                    ", ".join(f"v{v} {s}/{n}" for v, s, n in r["dev"]) or "–", _kls(r["per_iteration"]), r["commit"][:10]]
                   for name, r in run["runs"].items()]
        out.append(table(["run", "rows a step", "seed", "first task seed", "sampled successes / episodes by iteration",
                          "dev", "KL(new‖old) by update (*: the guard stopped it)", "commit"], per_run))
        lines = []
        c = run.get("comparison")
        if c:
            lines.append(f"{c['candidate']} − {c['default']} rows a step, sampled success in iterations {first}–{last}: "
                         f"{_signed(*c['primary_pooled'])} pooled [Newcombe], "
                         f"{_signed(*c['primary_seed_means'])} over the seeds' rates [Welch]")
            if "dev_last_pooled" in c:
                lines.append(f"dev success after the last evaluation: {_signed(*c['dev_last_pooled'])} [Newcombe]")
            decision = c.get("decision_options") or f"--mini-batch-size {c['decision']}"
            checks = {"primary_not_lower": "primary estimate not lower", "dev_within_margin": f"dev within {100 * DEV_MARGIN:g} points",
                      "stable": "KL and clip fraction within bounds"}
            lines.append("the protocol's checks: " + ", ".join(
                f"{checks.get(k, k)} {'yes' if v else 'no'}" for k, v in c["checks"].items())
                + f"; decision: `{decision}`")
        lines.append(f"{provenance(run)}; load {run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after")
        out.append("\n".join(f"- {line}" for line in lines) + "\n")
    return "\n".join(out)


def _kls(per: dict) -> str:
    """Each update's approximate KL(new || old), starred where --target-kl stopped it early."""
    stopped = per.get("early_stopped") or [None] * len(per["approx_kl"])
    return " ".join(_num(kl, ".3f") + ("*" if stop else "") for kl, stop in zip(per["approx_kl"], stopped))
