"""The rollout sampler: tasks x attempts of a policy in an environment, into the lake.

    from halo_agent.sampler import RolloutConfig, run_rollouts
    summary = run_rollouts(RolloutConfig(
        env="miniwob", tasks=["click-button", "enter-text"], rollouts_per_task=4,
        policy="random", lake="lake", run_id="demo"))
    summary.episodes_written, summary.steps_per_second

Every run upserts its ``runs`` row (status running -> finished | failed |
interrupted); every episode is one deterministic ``episode_id`` from (run_id,
task_id, task_seed, attempt_idx), so ``resume=True`` runs exactly the episodes
the lake lacks. ``workers > 1`` spawns that many processes, each with its own
browser; finished episodes come back to this process, whose one
``EpisodeWriter`` commits them in batches. An environment failure ends its
episode with the error recorded and the run goes on; Ctrl-C writes what
finished and marks the run interrupted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import multiprocessing as mp
import os
import platform
import queue
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from halo_data import ids, prompts
from halo_data import schema as S
from halo_data.lake import Lake
from halo_data.writer import EpisodeWriter, Screenshot

from halo_agent.envs import EnvironmentUnavailable, environment_class
from halo_agent.envs.base import EnvError, PageState, TaskSpec, UnknownTaskError, element_for_action
from halo_agent.policies import PolicyUnavailable, check_policy, make_policy
from halo_agent.rewards import EpisodeRewards, RewardConfig
from halo_agent.types import Observation, Policy, PolicyOutput

log = logging.getLogger(__name__)

MODES_FILE = Path(__file__).parent / "configs" / "modes.yaml"
DEFAULT_MAX_STEPS = {"miniwob": 10, "real": 70}
RUN_KINDS = ("rollout", "eval")
_SECRET_NAME = re.compile(r"(key|token|secret|password|passwd|authorization)", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"\b(sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{8,}|Bearer\s+\S+)")


class RolloutError(ValueError):
    """A rollout that cannot start as configured; the message says what to change."""


@dataclasses.dataclass
class RolloutConfig:
    env: str = dataclasses.field(default="miniwob", metadata={"help": "Environment: miniwob | real."})
    tasks: list[str] = dataclasses.field(default_factory=list, metadata={"help": "Task ids (miniwob names may omit the 'miniwob.' prefix)."})
    subset: str | None = dataclasses.field(default=None, metadata={"help": "Named task subset of the environment (or a site name)."})
    sample_size: int | None = dataclasses.field(default=None, metadata={"help": "Sample this many tasks (seeded by --seed) from the tasks or subset."})
    rollouts_per_task: int = dataclasses.field(default=1, metadata={"help": "Attempts per task (a GRPO group)."})
    policy: str = dataclasses.field(default="random", metadata={"help": "random | openai | hf."})
    model: str | None = dataclasses.field(default=None, metadata={"help": "Model name, vLLM-served LoRA name, or local path."})
    adapter: str | None = dataclasses.field(default=None, metadata={"help": "LoRA adapter name or folder."})
    policy_version: str | None = dataclasses.field(default=None, metadata={"help": "Version tag of the policy weights (default: the policy's own)."})
    policy_options: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"help": "Extra keyword options for the policy."})
    temperature: float = dataclasses.field(default=1.0, metadata={"help": "Sampling temperature (random policy: 0 = always the first action)."})
    seed: int = dataclasses.field(default=0, metadata={"help": "Seed of the policy's sampling; each episode derives its own from it."})
    task_seed: int | None = dataclasses.field(default=None, metadata={"help": "Seed of the task instances (default: --seed); all attempts of a task share it."})
    max_steps: int | None = dataclasses.field(default=None, metadata={"help": "Steps per episode (default: 10 for miniwob, 70 for real)."})
    workers: int = dataclasses.field(default=1, metadata={"help": "Parallel worker processes, each with its own browser."})
    pin_workers: bool = dataclasses.field(default=True, metadata={"help": "Keep each worker process, and the browser it starts, on one CPU (round robin over the CPUs this process may use)."})
    lake: str = dataclasses.field(default="lake", metadata={"help": "Lake root (created if missing)."})
    run_id: str | None = dataclasses.field(default=None, metadata={"help": "Run id (default: <kind>-<env>-<UTC time>)."})
    resume: bool = dataclasses.field(default=False, metadata={"help": "Complete the missing episodes of an existing run."})
    kind: str = dataclasses.field(default="rollout", metadata={"help": "rollout | eval."})
    mode: str | None = dataclasses.field(default=None, metadata={"help": "Named policy configuration (default: the policy name)."})
    split: str = dataclasses.field(default="all", metadata={"help": "train | eval | all: tasks of this registry split only."})
    task_version: str | None = dataclasses.field(default=None, metadata={"help": "REAL task version (the real env's default when unset)."})
    task_registry: str | None = dataclasses.field(default=None, metadata={"help": "Task registry snapshot (JSON) to take tasks from."})
    env_options: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"help": "Extra keyword options for the environment."})
    reward_config: str | None = dataclasses.field(default=None, metadata={"help": "Reward rules/weights YAML (default: halo_agent/configs/rewards.yaml)."})
    headless: bool = dataclasses.field(default=True, metadata={"help": "Run the browser headless."})
    flush_episodes: int = dataclasses.field(default=32, metadata={"help": "Commit to the lake every this many episodes..."})
    flush_seconds: float = dataclasses.field(default=30.0, metadata={"help": "...or at the first episode this long after the last commit."})
    progress: bool = dataclasses.field(default=True, metadata={"help": "Show a progress bar."})
    command: str | None = dataclasses.field(default=None, metadata={"help": "Command line to record (secrets are redacted)."})

    def __post_init__(self) -> None:
        if self.kind not in RUN_KINDS:
            raise RolloutError(f"kind must be one of {', '.join(RUN_KINDS)}, got {self.kind!r}")
        if int(self.rollouts_per_task) < 1:
            raise RolloutError("--rollouts-per-task must be at least 1")
        if int(self.workers) < 1:
            raise RolloutError("--workers must be at least 1")
        if self.max_steps is not None and int(self.max_steps) < 1:
            raise RolloutError("--max-steps must be at least 1")
        if self.sample_size is not None and int(self.sample_size) < 1:
            raise RolloutError("--sample-size must be at least 1")
        if self.tasks and self.subset:
            raise RolloutError("give either --tasks or --subset, not both")
        if self.temperature < 0:
            raise RolloutError("--temperature must be >= 0")
        if self.run_id is not None:
            try:
                ids.check_run_id(self.run_id)
            except ValueError as e:
                raise RolloutError(str(e)) from None
        if self.split not in ("train", "eval", "all"):
            raise RolloutError(f"--split must be train, eval or all, got {self.split!r}")

    @property
    def effective_task_seed(self) -> int:
        return int(self.seed if self.task_seed is None else self.task_seed)

    @property
    def effective_max_steps(self) -> int:
        return int(self.max_steps or DEFAULT_MAX_STEPS.get(self.env, 30))

    @property
    def effective_mode(self) -> str:
        return self.mode or self.policy

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.pop("command", None)
        return json.dumps(redact_mapping(data), sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    task: TaskSpec
    task_seed: int
    attempt_idx: int
    episode_id: str
    policy_seed: int


@dataclasses.dataclass
class EpisodeResult:
    episode: dict[str, Any]
    steps: list[dict[str, Any]]
    screenshots: list[Screenshot]
    env_seconds: float = 0.0
    policy_seconds: float = 0.0


@dataclasses.dataclass
class RunSummary:
    run_id: str
    lake: str
    status: str
    planned_episodes: int
    skipped_episodes: int  # already in the lake (resume)
    episodes_written: int
    successes: int
    env_errors: int
    steps: int
    wall_seconds: float
    lake_seconds: float
    workers: int

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def lake_share(self) -> float:
        """Fraction of the run's wall time spent committing to the lake."""
        return self.lake_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["steps_per_second"] = round(self.steps_per_second, 3)
        out["lake_share"] = round(self.lake_share, 4)
        return out


# ------------------------------------------------------------------------------------------ tasks


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
    """Every task of an environment (``options``: e.g. ``task_version`` for real)."""
    cls = environment_class(env)
    options = {k: v for k, v in options.items() if v is not None}
    return list(cls.list_tasks(**options))


def resolve_tasks(config: RolloutConfig) -> list[TaskSpec]:
    """The tasks a run covers, in a stable order."""
    if config.task_registry:
        available = load_task_registry(config.task_registry)
    else:
        available = list_tasks(config.env, task_version=config.task_version)
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
        chosen = select_subset(config.env, config.subset, available)
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


def select_subset(env: str, subset: str, available: Sequence[TaskSpec]) -> list[TaskSpec]:
    """A named subset: the environment's own (``subsets()``), else a site or split name, else a task-id prefix."""
    cls = environment_class(env)
    named = getattr(cls, "subsets", None)
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
    task_seed = config.effective_task_seed
    return [
        EpisodeSpec(
            task=t,
            task_seed=task_seed,
            attempt_idx=a,
            episode_id=ids.episode_id(run_id, t.task_id, task_seed, a),
            policy_seed=policy_seed(config.seed, t.task_id, task_seed, a),
        )
        for t in tasks
        for a in range(int(config.rollouts_per_task))
    ]


# ------------------------------------------------------------------------------------------ episodes


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def build_observation(page: PageState, task_id: str, history: Sequence[str], step_idx: int, use_screenshot: bool, screenshot_hash: str | None) -> Observation:
    messages = prompts.render_messages(
        goal=page.goal,
        url=page.url,
        observation=page.axtree,
        history=history,
        screenshot_hash=screenshot_hash,
        use_screenshot=use_screenshot,
    )
    return Observation(
        goal=page.goal,
        url=page.url,
        axtree=page.axtree,
        elements=page.elements,
        screenshot=page.screenshot,
        screenshot_hash=screenshot_hash,
        messages=messages,
        history=list(history),
        step_idx=step_idx,
        task_id=task_id,
        extra=dict(page.extra),
    )


class EpisodeRunner:
    """Runs episodes of one environment and policy (one per worker) into lake records."""

    def __init__(self, config: RolloutConfig, run_id: str, env, policy: Policy, reward_config: RewardConfig):
        self.config = config
        self.run_id = run_id
        self.env = env
        self.policy = policy
        self.rewards = reward_config
        self.max_steps = config.effective_max_steps
        self.weights_json = json.dumps(reward_config.weights.as_dict(), sort_keys=True)
        self._sent_screenshots: set[str] = set()

    def _shot(self, png: bytes | None, shots: dict[str, Screenshot]) -> str | None:
        if not png:
            return None
        shot = Screenshot.from_bytes(png)
        if shot.hash not in self._sent_screenshots:
            shots.setdefault(shot.hash, shot)
        return shot.hash

    def run(self, spec: EpisodeSpec) -> EpisodeResult:
        cfg = self.config
        task = spec.task
        started = _now()
        steps: list[dict[str, Any]] = []
        shots: dict[str, Screenshot] = {}
        history: list[str] = []
        error: str | None = None
        error_kind: str | None = None
        terminated = False
        task_reward = 0.0
        raw_reward: float | None = None
        env_seconds = 0.0
        policy_seconds = 0.0
        use_screenshot = bool(getattr(self.policy, "uses_screenshot", False))

        t0 = time.perf_counter()
        try:
            page = self.env.reset(task, spec.task_seed)
        except EnvError as e:
            page = None
            error, error_kind = _first_line(e), "env"
        except Exception as e:  # an unexpected failure of the environment is still the environment's
            log.exception("reset of %s failed", task.task_id)
            page = None
            error, error_kind = _first_line(e), "env"
        reset_ms = (time.perf_counter() - t0) * 1000.0
        env_seconds += reset_ms / 1000.0

        if page is None:
            steps.append(self._error_step(0, error, reset_ms))
        else:
            self.policy.reset(spec.policy_seed)
            shot_hash = self._shot(page.screenshot, shots)
            state = ids.state_hash(page.url, page.axtree)
            rewards = EpisodeRewards(self.rewards, task.site, start_url=page.url, start_state=state)
            for step_idx in range(self.max_steps):
                obs = build_observation(page, task.task_id, history, step_idx, use_screenshot, shot_hash)
                prompt = prompts.dumps(obs.messages)
                t1 = time.perf_counter()
                try:
                    out = self.policy.act(obs)
                except Exception as e:
                    log.exception("policy failed on %s step %d", task.task_id, step_idx)
                    out = PolicyOutput(model_output=None, action=None, parse_error=None, api_error=None)
                    error, error_kind = _first_line(e), "policy"
                policy_ms = (time.perf_counter() - t1) * 1000.0
                policy_seconds += policy_ms / 1000.0
                if out.api_error and error is None:
                    error, error_kind = str(out.api_error), "api"

                outcome = None
                action_error = None
                env_ms = 0.0
                if error is None and out.action is not None:
                    t2 = time.perf_counter()
                    try:
                        outcome = self.env.step(out.action)
                        action_error = outcome.action_error
                    except EnvError as e:
                        error, error_kind = _first_line(e), "env"
                        action_error = str(e)
                    except Exception as e:
                        log.exception("step of %s failed", task.task_id)
                        error, error_kind = _first_line(e), "env"
                        action_error = str(e)
                    env_ms = (time.perf_counter() - t2) * 1000.0
                    if step_idx == 0:
                        env_ms += reset_ms
                    env_seconds += env_ms / 1000.0

                after = outcome.page if outcome is not None else None
                after_hash = self._shot(after.screenshot, shots) if after is not None else None
                state_after = ids.state_hash(after.url, after.axtree) if after is not None else None
                action_valid = out.action is not None and outcome is not None and not action_error
                env_reward = float(outcome.reward) if outcome is not None else 0.0
                step_rewards = rewards.step(
                    state_hash=state,
                    action=out.action,
                    action_valid=action_valid,
                    parse_error=out.parse_error,
                    action_error=action_error,
                    target=element_for_action(out.action, page.elements),
                    url_after=after.url if after is not None else page.url,
                    page_after=after.axtree if after is not None else page.axtree,
                    state_hash_after=state_after if after is not None else state,
                    env_reward=env_reward,
                )
                extra: dict[str, Any] = {"policy_seed": spec.policy_seed}
                target = element_for_action(out.action, page.elements)
                target_bbox = page.extra.get("element_bboxes", {}).get(target.bid) if target is not None else None
                if target_bbox is not None:
                    extra["action_bbox"] = target_bbox
                if step_rewards.milestones:
                    extra["milestones"] = step_rewards.milestones
                if outcome is not None and outcome.info:
                    extra["env_info"] = _jsonable(outcome.info)
                steps.append(
                    {
                        "step_idx": step_idx,
                        "url": page.url,
                        "goal": page.goal,
                        "observation": page.axtree,
                        "screenshot_hash": shot_hash,
                        "screenshot_after_hash": after_hash,
                        "prompt": prompt,
                        "prompt_version": prompts.PROMPT_VERSION,
                        "prompt_hash": ids.sha256_hex(prompt),
                        "model_output": out.model_output,
                        "action": out.action,
                        "action_source": out.action_source,
                        "action_valid": action_valid,
                        "parse_error": out.parse_error,
                        "action_error": action_error,
                        "r_progress": step_rewards.components["progress"],
                        "r_novelty": step_rewards.components["novelty"],
                        "r_loop": step_rewards.components["loop"],
                        "r_validity": step_rewards.components["validity"],
                        "r_success": step_rewards.components["success"],
                        "reward": step_rewards.reward,
                        "reward_weights": self.weights_json,
                        "cumulative_progress": step_rewards.cumulative_progress,
                        "state_hash": state,
                        "state_hash_version": S.STATE_HASH_VERSION,
                        "latency_ms": out.latency_ms or policy_ms,
                        "env_ms": env_ms,
                        "prompt_tokens": out.prompt_tokens,
                        "completion_tokens": out.completion_tokens,
                        "logprobs": out.logprobs,
                        "logprob_sum": out.logprob_sum,
                        "extra": json.dumps(extra, sort_keys=True, default=str),
                    }
                )
                history.append(out.action or (out.model_output or ""))
                if outcome is not None:
                    task_reward = float(outcome.reward)
                    if outcome.raw_reward is not None:
                        raw_reward = float(outcome.raw_reward)
                    if outcome.terminated or outcome.truncated:
                        terminated = bool(outcome.terminated)
                        break
                if error is not None:
                    break
                if after is not None:
                    page, shot_hash, state = after, after_hash, state_after

        n_steps = len(steps)
        truncated = error is None and not terminated and n_steps >= self.max_steps
        self._sent_screenshots.update(shots)
        episode = {
            "run_id": self.run_id,
            "env": cfg.env,
            "episode_id": spec.episode_id,
            "task_id": task.task_id,
            "site": task.site,
            "task_version": task.task_version,
            "split": cfg.split,
            "mode": cfg.effective_mode,
            "policy": getattr(self.policy, "name", cfg.policy),
            "model": cfg.model or getattr(self.policy, "model", None),
            "adapter": cfg.adapter or getattr(self.policy, "adapter", None),
            "policy_version": cfg.policy_version or getattr(self.policy, "policy_version", None) or cfg.adapter or cfg.model,
            "attempt_idx": spec.attempt_idx,
            "seed": cfg.seed,
            "task_seed": spec.task_seed,
            "temperature": float(cfg.temperature),
            "success": bool(terminated and task_reward > 0 and error is None),
            "task_reward": task_reward,
            "raw_reward": raw_reward,
            "n_steps": n_steps,
            "terminated": terminated,
            "truncated": truncated,
            "error": error,
            "error_kind": error_kind,
            "started_at": started,
            "ended_at": _now(),
        }
        return EpisodeResult(episode, steps, list(shots.values()), env_seconds, policy_seconds)

    def _error_step(self, step_idx: int, error: str | None, env_ms: float) -> dict[str, Any]:
        return {
            "step_idx": step_idx,
            "action_valid": False,
            "action_error": error,
            "env_ms": env_ms,
            "reward_weights": self.weights_json,
            "r_progress": 0.0,
            "r_novelty": 0.0,
            "r_loop": 0.0,
            "r_validity": 0.0,
            "r_success": 0.0,
            "reward": 0.0,
            "cumulative_progress": 0.0,
            "state_hash_version": S.STATE_HASH_VERSION,
        }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


# ------------------------------------------------------------------------------------------ workers


def _make_env(config: RolloutConfig):
    cls = environment_class(config.env)
    options = dict(config.env_options)
    options.setdefault("headless", config.headless)
    if config.task_version is not None:
        options.setdefault("task_version", config.task_version)
    if config.env == "real" and config.task_registry:
        # Workers must run the snapshot's own task JSONs and eval scripts, not the live SDK's.
        options.setdefault("task_registry", config.task_registry)
    return cls(**options)


def _make_policy(config: RolloutConfig) -> Policy:
    return make_policy(
        config.policy,
        model=config.model,
        adapter=config.adapter,
        temperature=config.temperature,
        seed=config.seed,
        **config.policy_options,
    )


def pin_to_cpu(worker_idx: int) -> int | None:
    """Keep this process, and every process it starts from now on (Playwright's driver, Chromium), on one CPU.

    A browser worker is a chain of processes (Python, Playwright's driver, Chromium's browser,
    renderer and GPU processes) that hand each step to one another; with every worker's chain
    on its own CPU they stop preempting each other. Measured on 2 cores with 2 workers:
    1.55-1.7x the throughput of one worker, against 1.45-1.55x unpinned (``bench/rollout.py``).
    Returns the CPU, or None where affinity cannot be set.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[worker_idx % len(cpus)]
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError) as e:  # not Linux, or not permitted
        log.debug("could not pin worker %d: %s", worker_idx, e)
        return None


def _worker_main(config: RolloutConfig, run_id: str, worker_idx: int, inbox: "mp.Queue", results: "mp.Queue") -> None:
    """A spawned worker: its own browser and policy; episodes in, finished records out."""
    # Ctrl-C is the parent's to handle: it writes what finished and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=os.environ.get("HALO_LOG_LEVEL", "WARNING"))
    from halo_agent.browser import ensure_environment

    ensure_environment()
    if config.pin_workers:
        pin_to_cpu(worker_idx)
    parent = mp.parent_process()
    env = policy = None
    try:
        env = _make_env(config)
        policy = _make_policy(config)
        runner = EpisodeRunner(config, run_id, env, policy, RewardConfig.load(config.reward_config))
        results.put(("ready", worker_idx, None))
        while True:
            if parent is not None and not parent.is_alive():
                return  # the parent is gone (killed): nothing would write our episodes
            try:
                spec = inbox.get(timeout=1.0)
            except queue.Empty:
                continue
            if spec is None:
                return
            results.put(("episode", worker_idx, runner.run(spec)))
    except BaseException as e:  # report why this worker stopped; the parent decides
        results.put(("fatal", worker_idx, _first_line(e)))
    finally:
        for thing in (policy, env):
            if thing is not None:
                try:
                    thing.close()
                except Exception:
                    pass
        results.put(("exit", worker_idx, None))


class TaskStickyDispatch:
    """Hands out episodes so that a worker runs the attempts of one task back to back.

    The next attempt of the task a worker's page holds is the cheapest episode it can run
    (MiniWoB restarts it in place); a worker that has finished its task's attempts takes the
    next task no other worker holds, and only when none is left joins the task with the most
    attempts remaining.
    """

    def __init__(self, todo: Sequence[EpisodeSpec]):
        self.pending: dict[str, list[EpisodeSpec]] = {}
        for spec in todo:
            self.pending.setdefault(spec.task.task_id, []).append(spec)
        for specs in self.pending.values():
            specs.reverse()  # pop() from the end gives plan order
        self.holds: dict[int, str] = {}
        self.assigned: dict[int, dict[str, EpisodeSpec]] = {}  # worker -> episodes sent, not yet back

    def done(self, worker_idx: int, episode_id: str) -> None:
        self.assigned.get(worker_idx, {}).pop(episode_id, None)

    def give_back(self, worker_idx: int) -> None:
        """A worker stopped: the episodes it was sent and did not finish go to the others."""
        for spec in self.assigned.pop(worker_idx, {}).values():
            self.pending.setdefault(spec.task.task_id, []).append(spec)
        self.holds.pop(worker_idx, None)

    def next_for(self, worker_idx: int) -> EpisodeSpec | None:
        spec = self._pick(worker_idx)
        if spec is not None:
            self.assigned.setdefault(worker_idx, {})[spec.episode_id] = spec
        return spec

    def _pick(self, worker_idx: int) -> EpisodeSpec | None:
        task_id = self.holds.get(worker_idx)
        if not self.pending.get(task_id or ""):
            held = set(self.holds.values())
            free = [t for t, specs in self.pending.items() if specs and t not in held]
            if free:
                task_id = free[0]
            else:
                busy = [t for t, specs in self.pending.items() if specs]
                if not busy:
                    return None
                task_id = max(busy, key=lambda t: len(self.pending[t]))
        self.holds[worker_idx] = task_id
        return self.pending[task_id].pop()


def _run_in_workers(config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], write: Callable[[EpisodeResult], None]) -> None:
    ctx = mp.get_context("spawn")  # never fork: delta-rs and Playwright do not survive it
    results: mp.Queue = ctx.Queue()
    n_workers = min(int(config.workers), len(todo))
    inboxes: list[mp.Queue] = [ctx.Queue() for _ in range(n_workers)]
    dispatch = TaskStickyDispatch(todo)
    procs = [
        ctx.Process(target=_worker_main, args=(config, run_id, i, inboxes[i], results), name=f"halo-worker-{i}", daemon=True)
        for i in range(n_workers)
    ]
    for p in procs:
        p.start()
    remaining = len(todo)
    alive = n_workers
    fatal: list[str] = []

    def send_next(worker_idx: int) -> None:
        inboxes[worker_idx].put(dispatch.next_for(worker_idx))  # None: no more work, the worker exits

    def handle(kind: str, worker_idx: int, payload: Any) -> None:
        nonlocal remaining, alive
        if kind == "ready":
            # two episodes queued per worker, so it never waits for this process's lake writes
            send_next(worker_idx)
            send_next(worker_idx)
        elif kind == "episode":
            dispatch.done(worker_idx, payload.episode["episode_id"])
            send_next(worker_idx)
            write(payload)
            remaining -= 1
        elif kind == "fatal":
            fatal.append(f"worker {worker_idx}: {payload}")
            log.error("worker %d stopped: %s", worker_idx, payload)
            dispatch.give_back(worker_idx)
        elif kind == "exit":
            alive -= 1
            dispatch.give_back(worker_idx)

    try:
        while remaining > 0 and alive > 0:
            try:
                message = results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            handle(*message)
        if remaining > 0:
            # drain episodes that arrived while the last workers exited
            while True:
                try:
                    message = results.get(timeout=0.5)
                except queue.Empty:
                    break
                handle(*message)
        if remaining > 0:
            reason = "; ".join(fatal) or "workers exited early"
            raise RuntimeError(f"{remaining} episode(s) were not run ({reason}); re-run with --resume to complete them")
    finally:
        for p in procs:
            p.join(timeout=5 if remaining == 0 else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        # Undelivered episode specs (after an interrupt) must not keep this process alive at exit.
        for q in (*inboxes, results):
            q.cancel_join_thread()
            q.close()


# ------------------------------------------------------------------------------------------ runs


def redact_text(text: str) -> str:
    return _SECRET_VALUE.sub("[REDACTED]", text)


def redact_mapping(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: ("[REDACTED]" if _SECRET_NAME.search(str(k)) and v else redact_mapping(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_mapping(v) for v in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


def redact_argv(argv: Sequence[str]) -> str:
    """The command line with the values of secret-looking options (and key-like strings) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("[REDACTED]")
            hide_next = False
            continue
        if arg.startswith("-") and _SECRET_NAME.search(arg):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=[REDACTED]")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return shlex.join(out)


def provenance() -> dict[str, Any]:
    """Package versions, git sha, host and Python of this run; never secrets."""
    from importlib import metadata

    versions = {}
    for dist in ("halo", "agisdk", "playwright", "miniwob", "deltalake", "duckdb", "pyarrow", "openai", "transformers", "torch", "peft", "trl"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    sha = None
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent.parent,
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "packages": versions,
        "git_sha": sha,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def default_run_id(config: RolloutConfig) -> str:
    return f"{config.kind}-{config.env}-{_now().strftime('%Y%m%dT%H%M%S')}"


def _existing_run(lake: Lake, run_id: str) -> dict[str, Any] | None:
    rows = lake.query_arrow("select * from runs where run_id = $r", {"r": run_id}, views=False).to_pylist()
    return rows[0] if rows else None


# Config fields that decide which episodes a run plans: a resume must keep them.
_PLAN_FIELDS = ("env", "tasks", "subset", "sample_size", "rollouts_per_task", "seed", "task_seed", "split", "task_version", "task_registry", "policy", "model", "adapter")


def _run_row(config: RolloutConfig, run_id: str, planned: int, status: str, started_at: dt.datetime, ended_at: dt.datetime | None, command: str, prov: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "kind": config.kind,
        "mode": config.effective_mode,
        "env": config.env,
        "policy": config.policy,
        "model": config.model,
        "adapter": config.adapter,
        "policy_version": config.policy_version,
        "split": config.split,
        "task_version": config.task_version,
        "config": config.to_json(),
        "command": command,
        "planned_episodes": planned,
        "status": status,
        "started_at": started_at,
        "ended_at": ended_at,
        "provenance": json.dumps(prov, sort_keys=True),
    }


class _Progress:
    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = None
        self.done = 0
        self.successes = 0
        self.steps = 0
        self.started = time.perf_counter()
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)

    def update(self, result: EpisodeResult) -> None:
        self.done += 1
        self.successes += int(bool(result.episode["success"]))
        self.steps += len(result.steps)
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            self.bar.set_postfix(success=f"{self.successes}/{self.done}", steps_s=f"{self.steps / elapsed:.1f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_rollouts(config: RolloutConfig) -> RunSummary:
    """Run (or resume) a rollout or eval run into the lake; returns what it did."""
    from halo_agent.browser import ensure_environment

    ensure_environment()
    try:
        check_policy(config.policy)
        environment_class(config.env)
    except (PolicyUnavailable, EnvironmentUnavailable) as e:
        raise RolloutError(str(e)) from None
    RewardConfig.load(config.reward_config)  # fail now on a bad reward file, not in every worker

    tasks = resolve_tasks(config)  # bad task ids fail before anything is written
    # In-process runs build their policy now, so a policy that cannot start (no model, no key) writes nothing.
    local_policy = _make_policy(config) if config.workers == 1 else None
    lake = Lake.init(config.lake)
    run_id = config.run_id or default_run_id(config)
    plan = plan_episodes(config, run_id, tasks)
    command = redact_argv(sys.argv) if config.command is None else redact_text(config.command)
    prov = provenance()

    existing = _existing_run(lake, run_id)
    started_at = _now()
    done_ids: set[str] = set()
    if existing is not None:
        if not config.resume:
            raise RolloutError(f"run {run_id!r} already exists in {config.lake}: pass --resume to complete it, or choose another --run-id")
        stored = json.loads(existing.get("config") or "{}")
        mine = json.loads(config.to_json())
        changed = [k for k in _PLAN_FIELDS if k in stored and stored.get(k) != mine.get(k)]
        if changed:
            raise RolloutError(f"--resume of {run_id!r} with different {', '.join(changed)} than the run had: use the original options")
        started_at = existing.get("started_at") or started_at
        done_ids = lake.episode_ids(run_id)
    todo = [spec for spec in plan if spec.episode_id not in done_ids]
    skipped = len(plan) - len(todo)
    lake.upsert_runs([_run_row(config, run_id, len(plan), "running", started_at, None, command, prov)])
    log.info("run %s: %d planned, %d already in the lake, %d to run", run_id, len(plan), skipped, len(todo))

    writer = EpisodeWriter(lake, flush_episodes=config.flush_episodes, flush_seconds=config.flush_seconds)
    progress = _Progress(len(todo), config.progress, desc=run_id)
    stats = {"written": 0, "successes": 0, "env_errors": 0, "steps": 0, "lake_seconds": 0.0}
    status = "failed"
    wall0 = time.perf_counter()

    def write(result: EpisodeResult) -> None:
        t = time.perf_counter()
        writer.write_episode(result.episode, result.steps, result.screenshots)
        stats["lake_seconds"] += time.perf_counter() - t
        stats["written"] += 1
        stats["successes"] += int(bool(result.episode["success"]))
        stats["env_errors"] += int(result.episode["error_kind"] == "env")
        stats["steps"] += len(result.steps)
        progress.update(result)

    previous_sigterm = None
    if hasattr(signal, "SIGTERM") and _is_main_thread():
        # SIGTERM (a scheduler stopping us) is handled like Ctrl-C: write what finished, mark interrupted.
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        if todo:
            if config.workers == 1:
                _run_in_process(config, run_id, todo, write, local_policy)
                local_policy = None
            else:
                _run_in_workers(config, run_id, todo, write)
        t = time.perf_counter()
        writer.close()
        stats["lake_seconds"] += time.perf_counter() - t
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        t = time.perf_counter()
        writer.close()
        stats["lake_seconds"] += time.perf_counter() - t
        log.warning("run %s interrupted: %d episodes written; complete it with --resume --run-id %s", run_id, stats["written"], run_id)
    except BaseException:
        status = "failed"
        try:
            writer.close()
        except Exception:
            log.exception("could not write the finished episodes of run %s", run_id)
        raise
    finally:
        if local_policy is not None:
            local_policy.close()
        progress.close()
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        wall = time.perf_counter() - wall0
        try:
            lake.upsert_runs([_run_row(config, run_id, len(plan), status, started_at, _now(), command, prov)])
        except Exception:
            log.exception("could not mark run %s %s", run_id, status)
    summary = RunSummary(
        run_id=run_id,
        lake=str(config.lake),
        status=status,
        planned_episodes=len(plan),
        skipped_episodes=skipped,
        episodes_written=stats["written"],
        successes=stats["successes"],
        env_errors=stats["env_errors"],
        steps=stats["steps"],
        wall_seconds=wall,
        lake_seconds=stats["lake_seconds"],
        workers=config.workers,
    )
    log.info("run %s %s: %s", run_id, status, json.dumps(summary.as_dict()))
    return summary


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_keyboard_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def _run_in_process(config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], write: Callable[[EpisodeResult], None], policy: Policy | None = None) -> None:
    policy = policy if policy is not None else _make_policy(config)
    env = _make_env(config)
    try:
        runner = EpisodeRunner(config, run_id, env, policy, RewardConfig.load(config.reward_config))
        for spec in todo:
            write(runner.run(spec))
    finally:
        for thing in (policy, env):
            try:
                thing.close()
            except Exception as e:
                log.debug("closing %s failed: %s", thing, e)



# ------------------------------------------------------------------------------------------ modes, eval, exploration


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    policy: str
    model: str | None = None
    adapter: str | None = None
    policy_version: str | None = None
    temperature: float | None = None
    policy_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""


def load_modes(extra_file: str | os.PathLike[str] | None = None) -> dict[str, Mode]:
    """Shipped modes, plus (and overridden by) those of ``extra_file``."""
    from halo_data.config import load_yaml_or_json

    modes: dict[str, Mode] = {}
    for path in [MODES_FILE, *( [Path(extra_file)] if extra_file else [])]:
        try:
            data = load_yaml_or_json(path)
        except FileNotFoundError:
            raise RolloutError(f"modes file {path} does not exist") from None
        entries = data.get("modes", data)
        if not isinstance(entries, dict):
            raise RolloutError(f"{path}: expected a mapping of mode names under 'modes'")
        for name, raw in entries.items():
            if not isinstance(raw, dict) or "policy" not in raw:
                raise RolloutError(f"{path}: mode {name!r} needs at least a policy")
            unknown = set(raw) - {f.name for f in dataclasses.fields(Mode)}
            if unknown:
                raise RolloutError(f"{path}: mode {name!r} has unknown field(s) {', '.join(sorted(unknown))}")
            modes[str(name)] = Mode(name=str(name), **{k: v for k, v in raw.items() if k != "name"})
    return modes


def run_eval(modes: Sequence[str], base: RolloutConfig, modes_file: str | None = None) -> list[RunSummary]:
    """One eval run per mode over the same tasks, run ids ``<base run id>-<mode>``."""
    known = load_modes(modes_file)
    missing = [m for m in modes if m not in known]
    if missing:
        raise RolloutError(f"unknown mode(s) {', '.join(missing)}: known modes are {', '.join(sorted(known))}")
    base_id = base.run_id or default_run_id(dataclasses.replace(base, kind="eval"))
    summaries = []
    for name in modes:
        mode = known[name]
        cfg = dataclasses.replace(
            base,
            kind="eval",
            mode=name,
            policy=mode.policy,
            model=mode.model,
            adapter=mode.adapter,
            policy_version=mode.policy_version,
            temperature=base.temperature if mode.temperature is None else float(mode.temperature),
            policy_options={**mode.policy_options, **base.policy_options},
            run_id=f"{base_id}-{name}",
        )
        summaries.append(run_rollouts(cfg))
    return summaries


@dataclasses.dataclass
class ExplorationReport:
    task_id: str
    task_seed: int
    temperature_a: float
    temperature_b: float
    actions_a: list[str]
    actions_b: list[str]
    compared_steps: int

    @property
    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.actions_a, self.actions_b)):
            if a != b:
                return i
        if len(self.actions_a) != len(self.actions_b):
            return min(len(self.actions_a), len(self.actions_b))
        return None

    @property
    def differ(self) -> bool:
        return self.first_difference is not None


def verify_exploration(base: RolloutConfig, task: str, temperature_a: float = 0.0, temperature_b: float = 0.7, compare_steps: int = 10) -> ExplorationReport:
    """Run one episode of ``task`` at each temperature with the same seeds; report whether the actions differ."""
    from halo_agent.browser import ensure_environment

    ensure_environment()
    cfg = dataclasses.replace(base, tasks=[task], subset=None, sample_size=None, rollouts_per_task=1, max_steps=compare_steps)
    spec_task = resolve_tasks(cfg)[0]
    run_id = "verify-exploration"
    sequences = []
    env = _make_env(cfg)
    try:
        for temperature in (temperature_a, temperature_b):
            tcfg = dataclasses.replace(cfg, temperature=float(temperature))
            policy = _make_policy(tcfg)
            try:
                runner = EpisodeRunner(tcfg, run_id, env, policy, RewardConfig.load(tcfg.reward_config))
                spec = plan_episodes(tcfg, run_id, [spec_task])[0]
                result = runner.run(spec)
            finally:
                policy.close()
            if result.episode["error"]:
                raise RolloutError(f"the episode at temperature {temperature} failed: {result.episode['error']}")
            sequences.append([s.get("action") or s.get("model_output") or "" for s in result.steps])
    finally:
        env.close()
    return ExplorationReport(spec_task.task_id, cfg.effective_task_seed, float(temperature_a), float(temperature_b), sequences[0], sequences[1], int(compare_steps))


__all__ = [
    "EpisodeRunner",
    "EpisodeSpec",
    "ExplorationReport",
    "Mode",
    "RolloutConfig",
    "RolloutError",
    "RunSummary",
    "list_tasks",
    "load_modes",
    "plan_episodes",
    "resolve_tasks",
    "run_eval",
    "run_rollouts",
    "verify_exploration",
]
