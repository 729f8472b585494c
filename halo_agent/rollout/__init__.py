"""Rollouts: tasks x attempts of a policy in an environment, into the lake.

    from halo_agent.rollout import RolloutConfig, run_rollouts
    summary = run_rollouts(RolloutConfig(
        env="miniwob", tasks=["click-button", "enter-text"], rollouts_per_task=4,
        policy="random", lake="lake", run_id="demo"))
    summary.episodes_written, summary.steps_per_second

Every episode is one deterministic ``episode_id`` from (run_id, task_id,
task_seed, attempt_idx), so ``resume=True`` runs exactly the episodes the lake
lacks. ``workers > 1`` spawns that many processes, each with its own browser;
finished episodes come back to this process, whose one ``EpisodeWriter``
commits them in batches. An environment failure ends its episode with the error
recorded and the run goes on; Ctrl-C writes what finished and marks the run
interrupted.

The parts:

- ``config``: ``RolloutConfig``, ``EpisodeSpec``, ``EpisodeResult``, ``RunSummary``;
- ``tasks``: the task registry, which tasks a run covers, ``plan_episodes``;
- ``episode``: ``EpisodeRunner``, the episode loop;
- ``workers``: in-process and spawned workers, ``TaskStickyDispatch``, CPU pinning;
- ``run``: ``run_rollouts`` and its ``runs`` row;
- ``eval``: modes, ``run_eval`` and ``verify_exploration``.
"""

from halo_agent.rollout.config import EpisodeResult, EpisodeSpec, RolloutConfig, RolloutError, RunSummary
from halo_agent.rollout.episode import EpisodeRunner, build_observation
from halo_agent.rollout.eval import ExplorationReport, Mode, load_modes, run_eval, verify_exploration
from halo_agent.rollout.run import default_run_id, run_rollouts
from halo_agent.rollout.tasks import list_tasks, load_task_registry, plan_episodes, policy_seed, resolve_tasks, select_subset
from halo_agent.rollout.workers import TaskStickyDispatch, pin_to_cpu

__all__ = [
    "EpisodeResult",
    "EpisodeRunner",
    "EpisodeSpec",
    "ExplorationReport",
    "Mode",
    "RolloutConfig",
    "RolloutError",
    "RunSummary",
    "TaskStickyDispatch",
    "build_observation",
    "default_run_id",
    "list_tasks",
    "load_modes",
    "load_task_registry",
    "pin_to_cpu",
    "plan_episodes",
    "policy_seed",
    "resolve_tasks",
    "run_eval",
    "run_rollouts",
    "select_subset",
    "verify_exploration",
]
