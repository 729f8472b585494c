"""``run_search``: a search run into the lake, one whole tree per commit.

    summary = run_search(SearchConfig(env="miniwob", tasks=["click-button-sequence"], policy="random",
                                      simulations=32, expansions=4, critic="progress", lake="lake"))

The run's ``runs`` row holds its options, α, K, c, θ and the depth among them
(``config`` → ``search``). Each tree's nodes are appended to ``mcts_nodes`` in one
commit, after the screenshots they reference: a run killed at any point leaves
whole trees only, and ``resume`` searches the trees the lake does not hold yet.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Any

from halo_data.lake import Lake
from halo_data.runs import RunRecord, existing_run, upsert_runs, utc_now
from halo_data.writer import append_rows, screenshots_table

from halo_agent.envs import environment_class
from halo_agent.policies import make_policy
from halo_agent.rewards import RewardConfig
from halo_agent.rollout.run import _check_can_start  # the same checks as a rollout: browser, policy, env, rewards
from halo_agent.rollout.tasks import resolve_tasks
from halo_agent.rollout.workers import policy_for
from halo_agent.search.config import SearchConfig, SearchError
from halo_agent.search.critics import CriticError, make_critic
from halo_agent.search.mcts import SearchResult, TreeSearch, tree_id_for

log = logging.getLogger(__name__)

# Options that decide which trees a run plans and how it searches them: a resume must keep them.
_PLAN_FIELDS = ("env", "tasks", "subset", "seed", "task_seed", "task_seeds", "policy", "model", "adapter", "search")


@dataclasses.dataclass
class SearchSummary:
    run_id: str
    lake: str
    status: str
    planned_trees: int
    skipped_trees: int
    trees_written: int
    solved: int
    nodes: int
    unreproducible: int
    env_steps: int
    wall_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return (
            f"{self.run_id}: {self.status}, {self.trees_written} trees written ({self.skipped_trees} already in the lake, "
            f"{self.planned_trees} planned), {self.solved} solved, {self.nodes} nodes ({self.unreproducible} unreproducible), "
            f"{self.env_steps} env steps in {self.wall_seconds:.1f} s"
        )


def default_run_id() -> str:
    return f"search-{utc_now().strftime('%Y%m%dT%H%M%S')}"


def build_search(config: SearchConfig, env=None) -> TreeSearch:
    """The searcher for ``config``: its policy (n = K), rollout policy (n = 1) and critic; ``env`` may be set later."""
    reward_config = RewardConfig.load(config.reward_config)
    policy = policy_for(dataclasses.replace(config, policy_options={**config.policy_options, "n": int(config.expansions)}))
    rollout_policy = make_policy(config.policy, model=config.model, adapter=config.adapter, temperature=config.temperature,
                                 seed=config.seed, **{**config.policy_options, "n": 1})
    critic = make_critic(config.critic, reward_config, policy=policy, base_url=config.critic_base_url)
    return TreeSearch(env, policy, rollout_policy, critic, config, reward_config)


def write_tree(lake: Lake, result: SearchResult, *, run_id: str, env: str, alpha: float, policy_version: str | None, sent: set[str]) -> int:
    """Screenshots first, then every node of the tree in one commit; returns the nodes written."""
    shots = [s for h, s in result.screenshots.items() if h not in sent]
    if shots:
        lake.append("screenshots", screenshots_table(shots))
        sent.update(s.hash for s in shots)
    rows = result.tree.rows(run_id=run_id, env=env, alpha=alpha, created_at=utc_now())
    for row in rows:
        row["policy_version"] = policy_version
    append_rows(lake, "mcts_nodes", rows)
    return len(rows)


def trees_held(lake: Lake, run_id: str) -> set[str]:
    table = lake.query_arrow("select distinct tree_id from mcts_nodes where run_id = $r", {"r": run_id}, views=False)
    return set(table.column("tree_id").to_pylist())


def run_search(config: SearchConfig) -> SearchSummary:
    """Search every (task, task seed) of ``config`` into the lake (the missing ones, with ``resume``)."""
    _check_can_start(config)
    tasks = resolve_tasks(config)
    searcher = build_search(config)  # a critic or policy that cannot work fails before the lake is touched
    lake = Lake.init(config.lake)
    run_id = config.run_id or default_run_id()
    plan = [(t, config.effective_task_seed + k) for t in tasks for k in range(int(config.task_seeds))]
    record = _start_record(config, lake, run_id, len(plan))
    held = trees_held(lake, run_id)
    todo = [(t, s) for t, s in plan if tree_id_for(run_id, t.task_id, s) not in held]
    env = environment_class(config.env)(headless=config.headless, **config.env_options)
    searcher.use_env(env)
    t0 = time.perf_counter()
    summary = SearchSummary(run_id, str(config.lake), "failed", len(plan), len(plan) - len(todo), 0, 0, 0, 0, 0, 0.0)
    try:
        upsert_runs(lake, [record])
        sent: set[str] = set()
        for task, task_seed in todo:
            result = searcher.search(task, task_seed, tree_id_for(run_id, task.task_id, task_seed))
            summary.nodes += write_tree(lake, result, run_id=run_id, env=config.env, alpha=float(config.alpha),
                                        policy_version=config.policy_version or getattr(searcher.policy, "policy_version", None), sent=sent)
            summary.trees_written += 1
            summary.solved += int(result.solved)
            summary.env_steps += result.env_steps
            summary.unreproducible += sum(1 for n in result.tree.nodes() if not n.reproducible)
        summary.status = "finished"
    except KeyboardInterrupt:
        summary.status = "interrupted"
    finally:
        env.close()
        summary.wall_seconds = time.perf_counter() - t0
        if existing_run(lake, run_id) is not None:
            upsert_runs(lake, [record.replace(status=summary.status, ended_at=utc_now())])
    log.info("search %s", json.dumps(summary.as_dict()))
    return summary


def _start_record(config: SearchConfig, lake: Lake, run_id: str, planned: int) -> RunRecord:
    record = RunRecord(
        run_id=run_id, kind="rollout", mode=config.effective_mode, env=config.env, policy=config.policy, model=config.model,
        adapter=config.adapter, policy_version=config.policy_version, split=config.split, task_version=config.task_version,
        config=config.to_json(), command=list(sys.argv) if config.command is None else config.command,
        planned_episodes=planned, status="running", started_at=utc_now(),
    )
    existing = existing_run(lake, run_id)
    if existing is None:
        return record
    if not config.resume:
        raise SearchError(f"run {run_id!r} already exists in {config.lake}: pass --resume to complete it, or choose another --run-id")
    stored, mine = json.loads(existing.get("config") or "{}"), json.loads(config.to_json())
    changed = [k for k in _PLAN_FIELDS if stored.get(k) != mine.get(k)]
    if changed:
        raise SearchError(f"--resume of {run_id!r} with different {', '.join(changed)} than the run had: use the original options")
    return record.replace(started_at=existing.get("started_at") or record.started_at)


__all__ = ["CriticError", "SearchSummary", "build_search", "run_search", "trees_held", "write_tree"]
