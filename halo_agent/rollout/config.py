"""What a rollout is asked to do (``RolloutConfig``), one planned episode (``EpisodeSpec``) and what came back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from halo_data import ids, prompts
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.runs import redact_mapping
from halo_data.writer import Screenshot

from halo_agent.envs.base import TaskSpec

DEFAULT_MAX_STEPS = {"miniwob": 10, "real": 70, "os": 5}
RUN_KINDS = ("rollout", "eval")


class RolloutError(ValueError):
    """A rollout that cannot start as configured; the message says what to change."""


@dataclasses.dataclass
class RolloutConfig:
    env: str = dataclasses.field(default="miniwob", metadata={"help": "Environment: miniwob | real | os."})
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
    task_seeds: int = dataclasses.field(default=1, metadata={"help": "Task seeds per task: task_seed, task_seed + 1, ...; each gets --rollouts-per-task attempts (a group each)."})
    observation: str = dataclasses.field(default="axtree", metadata={"help": "The page in the prompt: axtree (the whole tree) | elements (only the elements a policy may act on, one line each)."})
    max_steps: int | None = dataclasses.field(default=None, metadata={"help": "Steps per episode (default: 10 for miniwob, 70 for real, 5 for os)."})
    candidates_per_state: int = dataclasses.field(default=0, metadata={"help": "Sample this many actions in the policy's call at each step and score each from the restored state into `candidates` (0: none; else at least 2)."})
    workers: int = dataclasses.field(default=1, metadata={"help": "Parallel worker processes, each with its own browser."})
    ray_address: str | None = dataclasses.field(default=None, metadata={"help": "Run the episodes on this Ray cluster (auto, or HOST:PORT): --workers actors, each with its own browser, each writing to the lake."})
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
        if self.observation not in prompts.OBSERVATION_FORMATS:
            raise RolloutError(f"--observation must be one of {', '.join(prompts.OBSERVATION_FORMATS)}, got {self.observation!r}")
        if int(self.task_seeds) < 1:
            raise RolloutError("--task-seeds must be at least 1")
        if int(self.workers) < 1:
            raise RolloutError("--workers must be at least 1")
        if self.max_steps is not None and int(self.max_steps) < 1:
            raise RolloutError("--max-steps must be at least 1")
        if int(self.candidates_per_state) != 0 and int(self.candidates_per_state) < 2:
            raise RolloutError("--candidates must be 0 (none) or at least 2: a group of one has nothing to compare")
        if self.candidates_per_state and self.policy == "hierarchy":
            raise RolloutError("--candidates needs a plain policy: a hierarchical policy's manager rows have no action to replay")
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
    episode: EpisodeRecord
    steps: list[StepRecord]
    screenshots: list[Screenshot]
    env_seconds: float = 0.0
    policy_seconds: float = 0.0
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rows of `candidates`


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
    candidates: int = 0  # candidate rows written

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def lake_share(self) -> float | None:
        """Fraction of the run's wall time spent committing to the lake; None when the run wrote nothing."""
        # With nothing written the writer's time is only opening the lake: a share of that says nothing.
        if self.episodes_written == 0 or self.wall_seconds <= 0:
            return None
        return self.lake_seconds / self.wall_seconds

    def stop_if_interrupted(self) -> "RunSummary":
        """The summary, or ``KeyboardInterrupt`` where the run was interrupted (Ctrl-C or SIGTERM).

        ``run_rollouts`` turns an interruption into a written, resumable run and returns; a caller that goes on to
        train on the run or to start another one must stop too (an update on part of an iteration's episodes would
        be trained once, and its resume would never train on the rest)."""
        if self.status == "interrupted":
            raise KeyboardInterrupt
        return self

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["steps_per_second"] = round(self.steps_per_second, 3)
        out["lake_share"] = None if self.lake_share is None else round(self.lake_share, 4)
        return out

    def describe(self) -> str:
        """One line for a person: what the run did, and the lake's share of its time when it wrote anything."""
        text = (
            f"{self.run_id}: {self.status}, {self.episodes_written} episodes written "
            f"({self.skipped_episodes} already in the lake, {self.planned_episodes} planned), "
            f"{self.successes} successes, {self.env_errors} env errors, "
            f"{self.steps} steps at {self.steps_per_second:.1f} steps/s"
        )
        if self.candidates:
            text += f", {self.candidates} candidates"
        if self.lake_share is not None:
            text += f", lake {self.lake_share:.1%} of the time"
        return text
