"""Per-state groups against episode groups: trainable groups and seconds per online GRPO iteration, same task seeds.

    .venv/bin/python -m bench state-groups --task click-button
    .venv/bin/python -m bench state-groups --task click-button --seeds-per-iteration 4 --group-size 8 --candidates 8

Set-up (CPU, nothing downloaded):
1. warm-up data: the random policy on ``--warmup-seeds`` task seeds (from 50000 on);
2. the tiny model fine-tuned on every valid step of them (the action format, not which element is right);
3. ``run_online`` twice from it, on the same train task seeds, one engine each:
   - ``--group-by episode``: ``--group-size`` attempts of each task seed, a group per seed;
   - ``--group-by state``: ``--state-group-size`` attempts of each task seed (1 by default), and at every
     visited state ``--candidates`` actions sampled in the one call, each executed from the state restored
     by replay (a reset and the episode's actions so far) and scored with the dense reward.

Per iteration it reports the groups read, the trainable ones (reward spread), the rows the update trained
on, the env steps and candidates, the states that did not reproduce, and the seconds: rollout (sampling,
scoring candidates, landing) and update. The figures are printed and written to
bench/results/state-groups/<time>.json. A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from bench.reports import save

WARMUP_SEED_START = 50_000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench state-groups", description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="click-button")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--seeds-per-iteration", type=int, default=4, help="Train task seeds per iteration (the same for both).")
    ap.add_argument("--group-size", type=int, default=8, help="--group-by episode: attempts per task seed.")
    ap.add_argument("--state-group-size", type=int, default=1, help="--group-by state: attempts per task seed.")
    ap.add_argument("--candidates", type=int, default=8, help="--group-by state: candidates sampled at each state.")
    ap.add_argument("--max-episode-steps", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-seeds", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--observation", choices=("axtree", "elements"), default="elements")
    ap.add_argument("--constrain-actions", action=argparse.BooleanOptionalAction, default=True,
                    help="Decode only the page's actions (every answer parses).")
    ap.add_argument("--reward-config", default="default",
                    help="Reward YAML of the rollouts and candidates ('default': HALO's dense rewards).")
    ap.add_argument("--workdir", help="Where the lake, model and adapters go (default: a temporary folder).")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    import torch

    torch.set_num_threads(1)
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="halo-state-groups-"))
    lake = str(work / "lake")
    for seed in range(WARMUP_SEED_START, WARMUP_SEED_START + a.warmup_seeds):
        run_rollouts(RolloutConfig(env="miniwob", tasks=[a.task], rollouts_per_task=4, policy="random",
                                   observation=a.observation, max_steps=a.max_episode_steps, task_seed=seed, seed=seed,
                                   lake=lake, run_id=f"warmup-s{seed}", resume=True, progress=False))
    model = work / "tiny"
    if not (model / "halo_tiny_model.json").exists():
        build_tiny_model(model, warmup_lake=lake, steps=a.warmup_steps, where="run_id like 'warmup-%'", top_percent=100.0)

    result: dict = {"task": a.task, "options": vars(a), "runs": {}}
    for group_by in ("episode", "state"):
        result["runs"][group_by] = one_run(a, group_by, str(model), lake, work)
    result["seconds"] = time.perf_counter() - t0

    print(f"\n{a.task}: {a.seeds_per_iteration} task seeds per iteration, {a.max_episode_steps} steps per episode")
    print("grouping  iteration  episodes  env steps  candidates  unreproducible  groups  trainable  rows trained  "
          "rollout s  update s")
    for group_by, its in result["runs"].items():
        for it in its:
            print(f"{group_by:<8}  {it['iteration']:>9}  {it['episodes']:>8}  {it['env_steps']:>9}  {it['candidates']:>10}  "
                  f"{it['unreproducible_states']:>14}  {it['groups']:>6}  {it['trainable_groups']:>9}  {it['rows_trained']:>12}  "
                  f"{it['rollout_seconds']:>9.1f}  {it['update_seconds']:>8.1f}")
    out = save("state-groups", result, argv)
    print(f"{result['seconds']:.0f} s; results in {out}")


def one_run(a: argparse.Namespace, group_by: str, model: str, lake_root: str, work: Path) -> list[dict]:
    """One online run with this grouping; per iteration its groups, rows and seconds."""
    from halo_data.lake import Lake
    from halo_train.online import OnlineConfig, run_online

    state = group_by == "state"
    cfg = OnlineConfig(
        base_model=model, tasks=[a.task], iterations=a.iterations, group_by=group_by, candidates_per_state=a.candidates,
        group_size=a.state_group_size if state else a.group_size, seeds_per_iteration=a.seeds_per_iteration,
        max_episode_steps=a.max_episode_steps, train_steps=a.train_steps, batch_size=a.batch_size, lr=a.lr,
        constrain_actions=a.constrain_actions, observation=a.observation,
        reward_config=None if a.reward_config == "default" else a.reward_config,
        serve=True, lake=lake_root, output_dir=str(work / f"out-{group_by}"), run_id=group_by, progress=False,
    )
    stamps = [time.perf_counter()]

    def echo(line: str) -> None:
        stamps.append(time.perf_counter())
        print(f"[{group_by}, {stamps[-1] - stamps[-2]:.0f} s] {line}", flush=True)

    summary = run_online(cfg, echo=echo)
    lake = Lake.open(lake_root)
    view = "state_groups" if state else "grpo_groups where level = 'episode'"
    out = []
    for it in summary.iterations:
        run = it["rollout_run"]
        one = lambda sql: lake.query_arrow(sql, {"r": run}).to_pylist()[0]  # noqa: E731
        groups = one(f"select count(distinct group_key) n, count(distinct group_key) filter (where not zero_std) t "
                     f"from (select * from {view}) where run_id = $r")
        counts = one("select (select count(*) from episodes where run_id = $r) e, (select count(*) from steps where run_id = $r) s, "
                     "(select count(*) from candidates where run_id = $r) c, (select count(distinct (episode_id, step_idx)) "
                     "from candidates where run_id = $r and score_source = 'unreproducible') u")
        rows = json.loads((Path(it["adapter"]) / "training_stats.json").read_text())["rows"] if it.get("adapter") else 0
        m = it["metrics"]
        update = m.get("update_seconds", 0.0)
        out.append({
            "iteration": it["iteration"], "episodes": counts["e"], "env_steps": counts["s"], "candidates": counts["c"],
            "unreproducible_states": counts["u"], "groups": groups["n"], "trainable_groups": groups["t"],
            "frac_reward_zero_std": m["frac_reward_zero_std"], "rows_trained": rows, "updated": it["update"] == "trained",
            "update_seconds": update, "reload_seconds": m.get("reload_seconds", 0.0),
            # from the previous line to this one: the first iteration's includes starting the engine
            "iteration_seconds": stamps[it["iteration"] + 1] - stamps[it["iteration"]],
            "rollout_seconds": stamps[it["iteration"] + 1] - stamps[it["iteration"]] - update - m.get("reload_seconds", 0.0),
            "train_success": m["success_rate/train"],
        })
    return out
