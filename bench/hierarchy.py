"""Does the verified action cache cut worker calls without losing success? And do loops recover? Side by side, in one run.

    .venv/bin/python -m bench hierarchy                    # MiniWoB++ and the local GoMail site, about 15 minutes
    .venv/bin/python -m bench hierarchy --skip-gomail --seeds 2

1. The cache: the same tasks and task seeds run twice by the hierarchical policy with the
   cache on, the first time on an empty lake (no entries), the second time with the cache
   read from the lake the first run filled (its successes are the entries). Per run: success
   rate, worker calls per successful episode, cache hits, steps per episode. On MiniWoB++ and
   on the local GoMail clone (``halo-local.gomail-local-2``, agisdk's evaluator, offline).
2. Loops: the worker alone, then the same worker under the manager with recovery; per
   condition, episodes that hit a loop (an action repeated from the same state: ``r_loop < 0``)
   and how many recovered (reached a state the episode had not seen before, or succeeded).

The worker is HALO's random policy (no model weights can be downloaded here; a served model
is one ``--worker openai --model NAME`` away), so "worker calls" count calls to the worker
policy. The manager is a tiny model served by HALO's chat server on 127.0.0.1. Figures are
printed and written to bench/results/hierarchy/<time>.json; a measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.reports import save

MINIWOB_TASKS = ("click-button", "click-link", "click-dialog", "click-test-2", "click-tab", "click-widget", "focus-text-2",
                 "click-checkboxes")
GOMAIL_TASK = "halo-local.gomail-local-2"


@dataclasses.dataclass
class Arm:
    name: str
    lake: str
    env: str
    tasks: list[str]
    seeds: list[int]
    attempts: int
    max_steps: int
    options: dict[str, Any]
    temperature: float = 1.0
    env_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    task_version: str | None = None
    model: str | None = None


def run_arm(arm: Arm) -> list[str]:
    """One run per task seed (a run shares one task seed); their run ids."""
    from halo_agent.rollout import RolloutConfig, run_rollouts

    run_ids = []
    for seed in arm.seeds:
        run_id = f"{arm.name}-s{seed}"
        run_rollouts(RolloutConfig(env=arm.env, tasks=arm.tasks, rollouts_per_task=arm.attempts, policy="hierarchy",
                                   policy_options=dict(arm.options), model=arm.model, temperature=arm.temperature, seed=seed,
                                   task_seed=seed, max_steps=arm.max_steps, lake=arm.lake, run_id=run_id, progress=False,
                                   env_options=arm.env_options, task_version=arm.task_version))
        run_ids.append(run_id)
    return run_ids


def cache_figures(lake: str, run_ids: list[str]) -> dict[str, Any]:
    from halo_data.lake import Lake

    row = Lake.open(lake).query_arrow(
        "select count(*) episodes, count(*) filter (where success) successes, sum(n_policy_steps)::BIGINT worker_calls, "
        "sum(n_cache_hits)::BIGINT cache_hits, sum(n_manager_calls)::BIGINT manager_calls, avg(n_actions) steps "
        "from episodes where list_contains($runs, run_id)", {"runs": run_ids}).to_pylist()[0]
    row["success_rate"] = row["successes"] / row["episodes"] if row["episodes"] else 0.0
    row["worker_calls_per_success"] = row["worker_calls"] / row["successes"] if row["successes"] else None
    return row


def loop_figures(lake: str, run_ids: list[str]) -> dict[str, Any]:
    """Episodes with a repeated (state, action), and those that afterwards reached a new state or succeeded."""
    from halo_data.lake import Lake

    rows = Lake.open(lake).query_arrow(
        "select episode_id, step_idx, state_hash, r_loop, success, action_source from steps "
        "where list_contains($runs, run_id) and action_source is distinct from 'manager' order by episode_id, step_idx",
        {"runs": run_ids}).to_pylist()
    episodes: dict[str, list[dict]] = {}
    for r in rows:
        episodes.setdefault(r["episode_id"], []).append(r)
    looped = recovered = recovery_steps = 0
    for steps in episodes.values():
        first = next((i for i, s in enumerate(steps) if (s["r_loop"] or 0) < 0), None)
        if first is None:
            continue
        looped += 1
        seen = {s["state_hash"] for s in steps[: first + 1]}
        later = {s["state_hash"] for s in steps[first + 1:]}
        recovered += int(bool(later - seen) or bool(steps[0]["success"]))
        recovery_steps += sum(s["action_source"] == "recovery" for s in steps)
    return {"episodes": len(episodes), "looped": looped, "recovered": recovered, "recovery_steps": recovery_steps,
            "successes": sum(bool(s[0]["success"]) for s in episodes.values())}


@contextlib.contextmanager
def manager_server(work: Path):
    """A tiny model (built locally, no download) behind HALO's chat server, as the manager."""
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_train.tiny_model import build_tiny_model

    model = build_tiny_model(work / "manager")
    with ChatCompletionServer(LocalChatModel(model, device="cpu"), served_model_name="tiny-manager") as server:
        yield {"model": "tiny-manager", "base_url": server.url, "max_tokens": 32}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench hierarchy", description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(MINIWOB_TASKS), help="MiniWoB++ tasks.")
    ap.add_argument("--seeds", type=int, default=3, help="Task seeds per task (0..N-1).")
    ap.add_argument("--attempts", type=int, default=2, help="Attempts per task and seed.")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--gomail-attempts", type=int, default=60, help="Attempts of the GoMail task (one task seed).")
    ap.add_argument("--gomail-max-steps", type=int, default=2)
    ap.add_argument("--skip-gomail", action="store_true")
    ap.add_argument("--workdir", help="Where the lakes go (default: a temporary folder).")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    t0 = time.perf_counter()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="halo-hierarchy-"))
    tasks, seeds = a.tasks.split(","), list(range(a.seeds))
    cache_only = {"worker": "random", "cache": True, "macros": False, "recovery": False}
    result: dict[str, Any] = {"options": vars(a), "cache": {}, "loops": {}}

    def cache_experiment(label: str, **arm: Any) -> None:
        from halo_data.lake import Lake

        lake = str(work / f"{label}-lake")
        # Each arm reads the cache as of one version for all its runs: the empty lake, then the lake after the first arm.
        empty = run_arm(Arm(f"{label}-empty", lake, options={**cache_only, "cache_version": Lake.init(lake).versions()["steps"]}, **arm))
        after_first = Lake.open(lake).versions()["steps"]
        cached = run_arm(Arm(f"{label}-cached", lake, options={**cache_only, "cache_version": after_first}, **arm))
        result["cache"][label] = {"empty": cache_figures(lake, empty), "cached": cache_figures(lake, cached)}

    cache_experiment("miniwob", env="miniwob", tasks=tasks, seeds=seeds, attempts=a.attempts, max_steps=a.max_steps)
    if not a.skip_gomail:
        from halo_agent.sites import LocalSite

        with LocalSite("gomail") as site:
            cache_experiment("gomail", env="real", tasks=[GOMAIL_TASK], seeds=[0], attempts=a.gomail_attempts,
                             max_steps=a.gomail_max_steps, env_options={"site_urls": {"gomail": site.url}}, task_version="halo-local")
    with manager_server(work) as manager:
        lake = str(work / "loops-lake")
        common = dict(env="miniwob", tasks=tasks, seeds=seeds, attempts=1, max_steps=a.max_steps, temperature=0.0)
        alone = run_arm(Arm("worker-alone", lake, options={"worker": "random", "recovery": False}, **common))
        managed = run_arm(Arm("worker-manager-recovery", lake, options={"worker": "random", "manager": manager}, **common))
        result["loops"] = {"worker alone": loop_figures(lake, alone), "worker + manager + recovery": loop_figures(lake, managed)}
    result["seconds"] = time.perf_counter() - t0
    print(report(result))
    out = save("hierarchy", result, argv)
    print(f"{result['seconds']:.0f} s; results in {out}")


def report(result: dict[str, Any]) -> str:
    """The cache table and the loop table of one run's result."""
    lines = ["| site | cache | episodes | success rate | worker calls | worker calls per success | cache hits | steps per episode |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for site, arms in result["cache"].items():
        for arm, f in arms.items():
            per = "-" if f["worker_calls_per_success"] is None else f"{f['worker_calls_per_success']:.2f}"
            lines.append(f"| {site} | {arm} | {f['episodes']} | {f['success_rate']:.1%} | {f['worker_calls']} | {per} | "
                         f"{f['cache_hits']} | {f['steps']:.2f} |")
        before, after = arms["empty"], arms["cached"]
        if before["worker_calls_per_success"] and after["worker_calls_per_success"] is not None:
            cut = 1 - after["worker_calls_per_success"] / before["worker_calls_per_success"]
            lines.append(f"| {site} | change | | {after['success_rate'] - before['success_rate']:+.1%} | | {-cut:+.0%} | | |")
    lines += ["", "| condition | episodes | hit a loop | recovered | recovery steps | successes |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, f in result["loops"].items():
        lines.append(f"| {name} | {f['episodes']} | {f['looped']} | {f['recovered']} | {f['recovery_steps']} | {f['successes']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
