"""Does a search find what sampling cannot? MCTS against best-of-N sampling, same policy, same env-step budget.

    .venv/bin/python -m bench search                                    # 5 tasks x 4 task seeds, 100 steps each
    .venv/bin/python -m bench search --seeds 8 --budget 120 --tasks click-checkboxes,click-tab-2
    .venv/bin/python -m bench search --pages tests/pages --tasks code-lock      # HALO's test page (code A, C, B)

For every task seed, both methods get the same budget of environment steps (every
``env.step`` counts: MCTS's replays to restore a node and its progress critic's trials
too) and the same policy (random, HALO's offline default), the same depth limit:

- best-of-N: independent episodes of the policy until the budget is spent;
- MCTS (``halo_agent.search``): one tree, UCB1 on the blended Q, K candidates per call,
  the ``progress`` critic, until the budget is spent or a success is found; one column per
  ``--widen`` value (0 is Agent Q's single expansion per node, widened only once every
  child is closed; 0.5 is progressive widening).

A task seed counts as solved when the method reached a successful terminal state. The
fractions are printed side by side and written to bench/results/search/<time>.json. It
is a measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from bench.reports import save

ROOT = Path(__file__).resolve().parent.parent
# Multi-step widgets and forms where one random episode rarely succeeds.
TASKS = ("click-button-sequence", "click-checkboxes", "click-collapsible-2", "click-tab-2", "use-spinner")


def best_of_n(env, policy, task, task_seed: int, budget: int, max_depth: int) -> dict:
    """Independent episodes until ``budget`` environment steps are spent; solved at the first success."""
    from halo_agent.rollout.episode import build_observation
    from halo_agent.search.mcts import CountingEnv

    env = CountingEnv(env)
    episodes = 0
    while env.steps < budget:
        policy.reset(task_seed * 100_003 + episodes)
        page, history = env.reset(task, task_seed), []
        episodes += 1
        for depth in range(max_depth):
            action = policy.act(build_observation(page, task.task_id, history, depth, False, None)).action
            outcome = env.step(action)
            if outcome.terminated or outcome.truncated:
                if outcome.reward > 0:
                    return {"solved": True, "env_steps": env.steps, "episodes": episodes}
                break
            page, history = outcome.page, history + [action]
    return {"solved": False, "env_steps": env.steps, "episodes": episodes}


def mcts(searcher, task, task_seed: int) -> dict:
    result = searcher.search(task, task_seed, f"bench-{task.task_id}-{task_seed}")
    return {"solved": result.solved, "env_steps": result.env_steps, "simulations": result.simulations,
            "nodes": sum(1 for _ in result.tree.nodes())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench search", description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", type=int, default=4, help="Task seeds per task.")
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--budget", type=int, default=100, help="Environment steps per task seed, for each method.")
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument("--expansions", type=int, default=3)
    ap.add_argument("--c-exp", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--pages", default=None, help="A folder of MiniWoB-style pages to take --tasks from (e.g. tests/pages).")
    ap.add_argument("--widen", default="0,0.5", help="Progressive widening exponents, one MCTS column each (0: Agent Q's one expansion per node).")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from halo_agent.browser import ensure_environment
    from halo_agent.envs.base import TaskSpec
    from halo_agent.envs.miniwob import MiniWoBEnv, page_folder
    from halo_agent.policies import make_policy
    from halo_agent.search import SearchConfig
    from halo_agent.search.run import build_search

    ensure_environment()
    workdir = tempfile.TemporaryDirectory(prefix="halo-bench-search-")
    base_dir = page_folder(args.pages, workdir.name) if args.pages else None
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    tasks = [TaskSpec(f"miniwob.{n}", "miniwob", "miniwob") for n in names] if base_dir else [MiniWoBEnv.task_spec(n) for n in names]
    widens = [float(w) for w in args.widen.split(",") if w.strip()]
    env = MiniWoBEnv(base_dir=base_dir)
    searchers = {
        f"mcts_widen_{w:g}": build_search(SearchConfig(
            env="miniwob", tasks=[t.task_id for t in tasks], simulations=10_000, expansions=args.expansions, c_exp=args.c_exp,
            alpha=args.alpha, widen=w, max_depth=args.max_depth, critic="progress", max_env_steps=args.budget,
            stop_on_success=True, lake="unused"), env)
        for w in widens
    }
    sampler = make_policy("random", seed=0)
    rows = []
    t0 = time.perf_counter()
    try:
        for task in tasks:
            for task_seed in range(args.seed_start, args.seed_start + args.seeds):
                row = {"task": task.task_id, "task_seed": task_seed,
                       "best_of_n": best_of_n(env, sampler, task, task_seed, args.budget, args.max_depth)}
                row.update({name: mcts(searcher, task, task_seed) for name, searcher in searchers.items()})
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        env.close()
        workdir.cleanup()
    table = summarise(rows)
    print(render(table, args))
    out = save("search", {"args": vars(args), "rows": rows, "table": table, "seconds": time.perf_counter() - t0}, argv)
    print(f"written to {out.relative_to(ROOT)}")


def summarise(rows: list[dict]) -> dict:
    """Per task: seeds, and per method the seeds it solved and the env steps each solved seed took."""
    table: dict = {}
    for r in rows:
        t = table.setdefault(r["task"], {"seeds": 0})
        t["seeds"] += 1
        for method, result in r.items():
            if isinstance(result, dict):
                t.setdefault(method, [])
                if result["solved"]:
                    t[method].append(result["env_steps"])
    return table


def _cell(steps: list[int], seeds: int) -> str:
    return f"{len(steps) / seeds:.2f}" + (f" ({statistics.median(steps):g})" if steps else "")


def render(table: dict, args) -> str:
    """Fraction of task seeds solved per method, with the median env steps of the solved ones in brackets."""
    methods = [m for m in next(iter(table.values())) if m != "seeds"]
    lines = [f"budget {args.budget} env steps per task seed (replays included), depth {args.max_depth}, random policy, "
             f"K={args.expansions}, c={args.c_exp}, alpha={args.alpha}, critic progress; solved (median env steps)", "",
             "| task | seeds | " + " | ".join(methods) + " |", "| --- | --- |" + " --- |" * len(methods)]
    seeds = sum(t["seeds"] for t in table.values())
    for task, t in table.items():
        lines.append(f"| {task} | {t['seeds']} | " + " | ".join(_cell(t[m], t["seeds"]) for m in methods) + " |")
    solved = {m: [s for t in table.values() for s in t[m]] for m in methods}
    base = len(solved["best_of_n"])
    cells = [_cell(solved[m], seeds) + (f", {len(solved[m]) / base:.2f}x" if base and m != "best_of_n" else "") for m in methods]
    lines.append(f"| all | {seeds} | " + " | ".join(cells) + " |")
    lines += ["", "Task seeds solved within a smaller budget (the same runs: a search or a sampler that succeeded "
              "after s env steps succeeds under any budget of s or more):", "",
              "| budget | " + " | ".join(methods) + " |", "| --- |" + " --- |" * len(methods)]
    for budget in sorted({args.budget // 4, args.budget // 2, args.budget}):
        within = {m: sum(1 for s in solved[m] if s <= budget or budget == args.budget) for m in methods}  # the last simulation may overrun
        ratio = {m: f" ({within[m] / within['best_of_n']:.2f}x)" if within["best_of_n"] and m != "best_of_n" else "" for m in methods}
        lines.append(f"| {budget} | " + " | ".join(f"{within[m] / seeds:.2f}{ratio[m]}" for m in methods) + " |")
    return "\n".join(lines)
