"""Evaluation: named policy configurations (modes) run over the same tasks, and ``verify-exploration``.

    from halo_agent.rollout import RolloutConfig, run_eval
    run_eval(["random", "qwen_worker_bc"], RolloutConfig(env="miniwob", subset="click", lake="lake"))

Each mode is one eval run (``<run id>-<mode>``); the ``eval_matrix`` view
summarises them. ``verify_exploration`` checks that two temperatures make a
policy take different actions from the same seeds.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

from halo_agent.rewards import RewardConfig
from halo_agent.rollout.config import RolloutConfig, RolloutError, RunSummary
from halo_agent.rollout.episode import EpisodeRunner
from halo_agent.rollout.run import default_run_id, run_rollouts
from halo_agent.rollout.tasks import plan_episodes, resolve_tasks
from halo_agent.rollout.workers import env_for, policy_for

MODES_FILE = Path(__file__).resolve().parent.parent / "configs" / "modes.yaml"


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
    manager: dict[str, Any] | None = None  # an OpenAI-compatible model (model, base_url, ...) over the worker
    cache: bool = False  # replay the lake's verified actions
    macros: bool = False
    recovery: bool | None = None  # default: on wherever the mode is hierarchical
    hierarchy_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # manager_every, error_threshold, ...

    @property
    def hierarchical(self) -> bool:
        """Whether the mode runs its policy as the worker of ``halo_agent.hierarchy``."""
        return bool(self.manager or self.cache or self.macros or self.recovery or self.hierarchy_options)

    def rollout_fields(self) -> dict[str, Any]:
        """The policy and its options as a run's config takes them: a hierarchical mode's policy becomes its worker."""
        if not self.hierarchical:
            return {"policy": self.policy, "policy_options": dict(self.policy_options)}
        options = {"worker": self.policy, "worker_options": dict(self.policy_options), "manager": self.manager,
                   "cache": self.cache, "macros": self.macros, "recovery": self.recovery is not False, **self.hierarchy_options}
        return {"policy": "hierarchy", "policy_options": options}


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
            if raw.get("manager") is not None and not (isinstance(raw["manager"], dict) and raw["manager"].get("model")):
                raise RolloutError(f"{path}: mode {name!r}: manager needs at least a model (manager: {{model: NAME}})")
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
        fields = mode.rollout_fields()
        cfg = dataclasses.replace(
            base,
            kind="eval",
            mode=name,
            policy=fields["policy"],
            model=mode.model,
            adapter=mode.adapter,
            policy_version=mode.policy_version,
            temperature=base.temperature if mode.temperature is None else float(mode.temperature),
            policy_options={**fields["policy_options"], **base.policy_options},
            run_id=f"{base_id}-{name}",
        )
        summaries.append(run_rollouts(cfg))
        if summaries[-1].status == "interrupted":  # Ctrl-C or SIGTERM stops the evaluation, not only this mode's run
            break
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
    env = env_for(cfg)
    try:
        for temperature in (temperature_a, temperature_b):
            tcfg = dataclasses.replace(cfg, temperature=float(temperature))
            policy = policy_for(tcfg)
            try:
                runner = EpisodeRunner(tcfg, run_id, env, policy, RewardConfig.load(tcfg.reward_config))
                spec = plan_episodes(tcfg, run_id, [spec_task])[0]
                result = runner.run(spec)
            finally:
                policy.close()
            if result.episode.error:
                raise RolloutError(f"the episode at temperature {temperature} failed: {result.episode.error}")
            sequences.append([s.action or s.model_output or "" for s in result.steps])
    finally:
        env.close()
    return ExplorationReport(spec_task.task_id, cfg.effective_task_seed, float(temperature_a), float(temperature_b), sequences[0], sequences[1], int(compare_steps))
