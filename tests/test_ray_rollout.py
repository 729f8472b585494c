"""Rollouts on Ray: a local Ray instance on 127.0.0.1 (2 CPUs, shut down after), 2 Ray workers, real MiniWoB++ browsers."""

from __future__ import annotations

from pathlib import Path

import pytest

from halo_data import ids
from halo_data.lake import Lake

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASKS = ["click-button", "click-checkboxes"]


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()


def config(lake: Path, run_id: str, **overrides):
    from halo_agent.rollout import RolloutConfig

    options = dict(env="miniwob", tasks=TASKS, rollouts_per_task=2, policy="random", seed=3, task_seed=7, max_steps=4,
                   lake=str(lake), run_id=run_id, progress=False, workers=2, ray_address="auto", flush_episodes=1)
    return RolloutConfig(**{**options, **overrides})


def actions(lake: Path, run_id: str) -> list[tuple]:
    rows = Lake.open(lake).query_arrow(
        "select task_id, attempt_idx, list(action order by step_idx) as actions, "
        "list(state_hash order by step_idx) as states, count(*) as n from steps where run_id = $r group by all order by all",
        {"r": run_id}).to_pylist()
    return [(r["task_id"], r["attempt_idx"], r["actions"], r["states"], r["n"]) for r in rows]


def test_ray_workers_land_the_same_episodes_and_resume_exactly_the_missing_ones(ray_instance, tmp_path):
    from halo_agent.rollout import run_rollouts

    lake = tmp_path / "lake"
    summary = run_rollouts(config(lake, "r-ray"))
    assert (summary.status, summary.planned_episodes, summary.episodes_written, summary.workers) == ("finished", 4, 4, 2)
    episodes = Lake.open(lake).query_arrow("select episode_id, task_id, attempt_idx from episodes").to_pylist()
    assert sorted(e["episode_id"] for e in episodes) == sorted(
        ids.episode_id("r-ray", e["task_id"], 7, e["attempt_idx"]) for e in episodes)
    assert {(e["task_id"], e["attempt_idx"]) for e in episodes} == {(f"miniwob.{t}", a) for t in TASKS for a in range(2)}
    # the same seeds give the same actions as the run in this process, one episode at a time
    local = run_rollouts(config(lake, "r-local", workers=1, ray_address=None))
    assert local.episodes_written == 4
    ray_actions = actions(lake, "r-ray")
    assert [a[:4] for a in ray_actions] == [a[:4] for a in actions(lake, "r-local")]
    assert summary.steps == sum(a[4] for a in ray_actions)

    # lose two episodes (as a worker killed before its flush would), then --resume over Ray
    lost = sorted(e["episode_id"] for e in episodes)[:2]
    Lake.open(lake).table("steps").delete(f"episode_id in ('{lost[0]}', '{lost[1]}')")
    resumed = run_rollouts(config(lake, "r-ray", resume=True))
    assert (resumed.status, resumed.skipped_episodes, resumed.episodes_written) == ("finished", 2, 2)
    assert actions(lake, "r-ray") == ray_actions  # every episode once, each step once, the lost ones replayed alike
    run = Lake.open(lake).query_arrow("select status, planned_episodes from runs where run_id = 'r-ray'").to_pylist()
    assert run == [{"status": "finished", "planned_episodes": 4}]
