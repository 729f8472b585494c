"""Which tasks a run covers, and the episodes it plans: tasks x attempts, each with its deterministic id and seeds."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Sequence

from halo_data import ids

from halo_agent.envs import environment_class
from halo_agent.envs.base import TaskSpec, UnknownTaskError
from halo_agent.rollout.config import EpisodeSpec, RolloutConfig, RolloutError


def _task_lookup(tasks: Sequence[TaskSpec], env: str) -> dict[str, TaskSpec]:
    lookup = {t.task_id: t for t in tasks}
    # MiniWoB names may be given without their prefix; REAL ids without their version.
    for t in tasks:
        short = t.task_id.split(".", 1)[1] if "." in t.task_id else t.task_id
        lookup.setdefault(short, t)
    return lookup


def load_task_registry(path: str | os.PathLike[str]) -> list[TaskSpec]:
    p = Path(path)
    if not p.exists():
        raise RolloutError(f"task registry {p} does not exist: write one with `halo-agent tasks --env real --snapshot {p}`")
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise RolloutError(f"task registry {p} is not JSON: {e}") from None
    rows = data.get("tasks", data) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise RolloutError(f"task registry {p} must hold a list of tasks")
    return [TaskSpec.from_dict(r) for r in rows]


def list_tasks(env: str, **options: Any) -> list[TaskSpec]:
    """Every task of an environment (``options``: e.g. ``task_version`` for real, ``task_file`` for os)."""
    cls = environment_class(env)
    options = {k: v for k, v in options.items() if v is not None}
    return list(cls.list_tasks(**options))


def _task_options(config: RolloutConfig) -> dict[str, Any]:
    """What an environment lists its tasks from: the task version, and a task file given as an env option."""
    options: dict[str, Any] = {"task_version": config.task_version}
    if config.env_options.get("task_file"):
        options["task_file"] = config.env_options["task_file"]
    return options


def resolve_tasks(config: RolloutConfig) -> list[TaskSpec]:
    """The tasks a run covers, in a stable order."""
    if config.task_registry:
        available = load_task_registry(config.task_registry)
    else:
        available = list_tasks(config.env, **_task_options(config))
    if config.split != "all":
        available = [t for t in available if t.split == config.split]
    lookup = _task_lookup(available, config.env)
    if config.tasks:
        chosen = []
        for name in config.tasks:
            name = name.strip()
            if not name:
                continue
            if name not in lookup:
                raise UnknownTaskError(
                    f"unknown {config.env} task {name!r}: list them with `halo-agent tasks --env {config.env}`"
                )
            chosen.append(lookup[name])
    elif config.subset:
        chosen = select_subset(config.env, config.subset, available, **_task_options(config))
    else:
        chosen = list(available)
    # one entry per task id, first occurrence wins
    seen: set[str] = set()
    chosen = [t for t in chosen if not (t.task_id in seen or seen.add(t.task_id))]
    if config.sample_size is not None and config.sample_size < len(chosen):
        rng = random.Random(f"halo-sample:{config.seed}")
        picked = set(t.task_id for t in rng.sample(chosen, int(config.sample_size)))
        chosen = [t for t in chosen if t.task_id in picked]
    if not chosen:
        raise RolloutError(f"no {config.env} tasks selected: check --tasks, --subset, --split or --task-registry")
    return chosen


def select_subset(env: str, subset: str, available: Sequence[TaskSpec], task_file: str | None = None, **_: Any) -> list[TaskSpec]:
    """A named subset: the environment's own (``subsets()``), else a site or split name, else a task-id prefix."""
    cls = environment_class(env)
    named = getattr(cls, "subsets", None)
    if task_file and callable(named):
        named = functools.partial(named, task_file=task_file)
    if callable(named):
        subsets = named()
        if subset in subsets:
            wanted = set(subsets[subset])
            return [t for t in available if t.task_id in wanted]
    by_site = [t for t in available if t.site == subset or t.split == subset]
    if by_site:
        return by_site
    by_prefix = [t for t in available if t.task_id.split(".", 1)[-1].startswith(subset)]
    if by_prefix:
        return by_prefix
    names = sorted(named().keys()) if callable(named) else []
    hint = f" (named subsets: {', '.join(names)})" if names else ""
    raise RolloutError(f"unknown subset {subset!r} for {env}: use a subset name, a site or a task-name prefix{hint}")


def policy_seed(seed: int, task_id: str, task_seed: int, attempt_idx: int) -> int:
    """Each episode's sampling seed, independent of which worker runs it or in what order."""
    digest = hashlib.sha256(f"policy-seed\x1f{seed}\x1f{task_id}\x1f{task_seed}\x1f{attempt_idx}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def plan_episodes(config: RolloutConfig, run_id: str, tasks: Sequence[TaskSpec]) -> list[EpisodeSpec]:
    first = config.effective_task_seed
    return [
        EpisodeSpec(
            task=t,
            task_seed=task_seed,
            attempt_idx=a,
            episode_id=ids.episode_id(run_id, t.task_id, task_seed, a),
            policy_seed=policy_seed(config.seed, t.task_id, task_seed, a),
        )
        for task_seed in range(first, first + int(config.task_seeds))
        for t in tasks
        for a in range(int(config.rollouts_per_task))
    ]
