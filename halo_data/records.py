"""The one step record: how every producer builds the rows of ``steps``.

    episode = EpisodeRecord(run_id="r1", env="miniwob", task_id="miniwob.click-button", task_seed=3, attempt_idx=0)
    step = StepRecord(step_idx=0, url=url, observation=axtree, prompt=prompt, action="click('12')",
                      rewards={"progress": 0.2, "validity": 1.0}, weights=RewardWeights())
    writer.write_episode(episode, [step])

Environments, importers, synthetic data, search and the orchestrator all build
steps here, so the derived columns are filled the same way everywhere:

- ``r_progress`` … ``r_success`` from ``rewards`` (a mapping by component name;
  a component left out is 0, one given as ``None`` is unknown and stored NULL);
- ``reward`` as the weighted sum of the components under ``weights`` (unless a
  producer passes the reward it recorded), and ``reward_weights`` as their JSON;
- ``prompt_hash`` from ``prompt`` and ``prompt_version`` from the renderer;
- ``state_hash_version`` from ``halo_data.schema``;
- ``episode_id`` from (run_id, task_id, task_seed, attempt_idx).

A field of the wrong type, an unknown field or a missing required field raises
``RecordError`` naming the field, where the record is built rather than at
write time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any, Mapping, Sequence

from halo_data import ids, prompts
from halo_data import schema as S
from halo_data.config import RewardWeights
from halo_data.lake import LakeError


class RecordError(LakeError, TypeError):
    """A step or episode record with a missing, unknown or mistyped field."""


_PY_TYPES: dict[str, tuple[type, ...]] = {}


def _python_types(arrow_type) -> tuple[type, ...]:
    import pyarrow as pa

    if pa.types.is_string(arrow_type):
        return (str,)
    if pa.types.is_boolean(arrow_type):
        return (bool,)
    if pa.types.is_integer(arrow_type):
        return (int,)
    if pa.types.is_floating(arrow_type):
        return (int, float)
    if pa.types.is_timestamp(arrow_type):
        return (dt.datetime,)
    if pa.types.is_list(arrow_type):
        return (list, tuple)
    raise TypeError(f"no Python type for {arrow_type}")


for _c in S.STEPS.columns:
    _PY_TYPES[_c.name] = _python_types(_c.type)


def _check(kind: str, name: str, value: Any) -> Any:
    """``value`` as stored in column ``name``, or a RecordError naming the field."""
    if value is None:
        return None
    types = _PY_TYPES[name]
    if isinstance(value, bool) and bool not in types:
        raise RecordError(f"{kind} field {name!r} must be {types[-1].__name__}, got bool {value!r}")
    if not isinstance(value, types):
        raise RecordError(f"{kind} field {name!r} must be {types[-1].__name__}, got {type(value).__name__} {value!r:.80}")
    if types == (int, float):
        value = float(value)
        if value != value:
            raise RecordError(f"{kind} field {name!r} is NaN")
    elif name == "logprobs":
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise RecordError(f"{kind} field 'logprobs' must be a list of numbers")
        value = [float(v) for v in value]
    elif isinstance(value, dt.datetime) and value.tzinfo is None:
        raise RecordError(f"{kind} field {name!r} must be timezone-aware (UTC)")
    return value


def _check_fields(kind: str, record: Any, names: Sequence[str]) -> None:
    for name in names:
        value = getattr(record, name)
        checked = _check(kind, name, value)
        if checked is not value:
            object.__setattr__(record, name, checked)


# ------------------------------------------------------------------------------------- episode
@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """The fields of one episode; the writer repeats them on each of its steps."""

    run_id: str
    env: str
    task_id: str
    episode_id: str | None = None  # derived from (run_id, task_id, task_seed, attempt_idx)
    site: str | None = None
    task_version: str | None = None
    split: str | None = None
    mode: str | None = None
    policy: str | None = None
    model: str | None = None
    adapter: str | None = None
    policy_version: str | None = None
    attempt_idx: int = 0
    seed: int | None = None
    task_seed: int = 0
    temperature: float | None = None
    success: bool | None = None
    task_reward: float | None = None
    raw_reward: float | None = None
    n_steps: int | None = None  # derived from the steps when written
    terminated: bool | None = None
    truncated: bool | None = None
    error: str | None = None
    error_kind: str | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        for name in ("run_id", "env", "task_id"):
            if not getattr(self, name):
                raise RecordError(f"episode field {name!r} is required")
        _check_fields("episode", self, _EPISODE_FIELDS)
        try:
            ids.check_run_id(self.run_id)
        except ValueError as e:
            raise RecordError(f"episode field 'run_id': {e}") from None
        expected = ids.episode_id(self.run_id, self.task_id, self.task_seed, self.attempt_idx)
        if self.episode_id is None:
            object.__setattr__(self, "episode_id", expected)
        elif self.episode_id != expected:
            raise RecordError(
                f"episode field 'episode_id' {self.episode_id} does not match (run_id, task_id, task_seed, attempt_idx); leave it out"
            )

    def row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _EPISODE_FIELDS}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "EpisodeRecord":
        unknown = set(row) - set(_EPISODE_FIELDS)
        if unknown:
            raise RecordError(f"unknown episode field(s): {', '.join(sorted(unknown))}")
        return cls(**row)

    def replace(self, **changes: Any) -> "EpisodeRecord":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------- step
@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One agent step. ``row()`` gives the step's columns of ``steps``, derived ones included."""

    step_idx: int
    url: str | None = None
    goal: str | None = None
    observation: str | None = None
    screenshot_hash: str | None = None
    screenshot_after_hash: str | None = None
    prompt: str | None = None
    prompt_version: str | None = None  # the renderer's version when a prompt is given
    model_output: str | None = None
    action: str | None = None
    action_source: str | None = None
    action_valid: bool | None = None
    parse_error: str | None = None
    action_error: str | None = None
    rewards: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    weights: RewardWeights | Mapping[str, float] | None = None
    reward: float | None = None  # derived from rewards and weights unless given
    cumulative_progress: float | None = None
    state_hash: str | None = None
    latency_ms: float | None = None
    env_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: Sequence[float] | None = None
    logprob_sum: float | None = None
    is_last: bool | None = None  # derived by the writer from the step's position
    extra: Mapping[str, Any] | str | None = None

    def __post_init__(self) -> None:
        if self.step_idx is None or isinstance(self.step_idx, bool) or not isinstance(self.step_idx, int) or self.step_idx < 0:
            raise RecordError(f"step field 'step_idx' must be an int >= 0, got {self.step_idx!r}")
        _check_fields("step", self, _STEP_CHECKED)
        unknown = set(self.rewards) - set(S.REWARD_COMPONENTS)
        if unknown:
            raise RecordError(
                f"step field 'rewards' has unknown component(s) {', '.join(sorted(unknown))}; components are {', '.join(S.REWARD_COMPONENTS)}"
            )
        for name, value in self.rewards.items():
            _check("step", f"r_{name}", value)
        if self.extra is not None and not isinstance(self.extra, (str, Mapping)):
            raise RecordError(f"step field 'extra' must be a mapping or a JSON string, got {type(self.extra).__name__}")

    def components(self) -> dict[str, float | None]:
        """Every reward component: a left-out one is 0, an unknown (None) one stays None."""
        return {c: (None if (v := self.rewards.get(c, 0.0)) is None else float(v)) for c in S.REWARD_COMPONENTS}

    def row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in _STEP_PLAIN}
        components = self.components()
        for c, v in components.items():
            row[f"r_{c}"] = v
        weights = _weights(self.weights)
        if weights is not None:
            row["reward_weights"] = json.dumps(weights, sort_keys=True)
            if self.reward is None:
                row["reward"] = sum((v or 0.0) * weights[c] for c, v in components.items())
        if self.prompt is not None:
            row["prompt_hash"] = ids.sha256_hex(self.prompt)
            row["prompt_version"] = self.prompt_version or prompts.PROMPT_VERSION
        row["state_hash_version"] = S.STATE_HASH_VERSION
        if isinstance(self.extra, Mapping):
            row["extra"] = json.dumps(self.extra, sort_keys=True, default=str)
        if self.logprobs is not None:
            row["logprobs"] = list(self.logprobs)
        return row

    def replace(self, **changes: Any) -> "StepRecord":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "StepRecord":
        """A record from a row of ``steps`` (``r_*`` columns, ``reward_weights`` JSON); derived columns are recomputed."""
        fields = {k: v for k, v in row.items() if k not in _STEP_DERIVED}
        unknown = set(fields) - _STEP_FIELDS
        if unknown:
            raise RecordError(f"unknown step field(s): {', '.join(sorted(unknown))}")
        fields.setdefault("rewards", {c: row.get(f"r_{c}") for c in S.REWARD_COMPONENTS if f"r_{c}" in row})
        if row.get("reward_weights") and fields.get("weights") is None:
            fields["weights"] = json.loads(row["reward_weights"])
        return cls(**fields)


def _weights(weights: RewardWeights | Mapping[str, float] | None) -> dict[str, float] | None:
    if weights is None:
        return None
    if isinstance(weights, RewardWeights):
        return weights.as_dict()
    return RewardWeights(**weights).as_dict()


_EPISODE_FIELDS: tuple[str, ...] = S.EPISODE_COLUMNS
# Columns the record derives rather than takes.
_STEP_DERIVED = {f"r_{c}" for c in S.REWARD_COMPONENTS} | {"prompt_hash", "state_hash_version", "reward_weights"}
_STEP_PLAIN: tuple[str, ...] = tuple(
    c for c in S.STEPS.column_names if c not in S.EPISODE_COLUMNS and c not in _STEP_DERIVED
)
_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord))
_STEP_CHECKED: tuple[str, ...] = tuple(c for c in _STEP_PLAIN if c not in ("step_idx", "extra"))


def _check_in_sync() -> None:
    """The records and ``schema.STEPS`` name the same columns; a column added to one but not the other fails at import."""
    episode = {f.name for f in dataclasses.fields(EpisodeRecord)}
    step = {f.name for f in dataclasses.fields(StepRecord)} - {"rewards", "weights"}
    if episode != set(S.EPISODE_COLUMNS):
        raise RuntimeError(f"EpisodeRecord and schema.STEPS differ: {sorted(episode ^ set(S.EPISODE_COLUMNS))}")
    columns = set(S.STEPS.column_names) - set(S.EPISODE_COLUMNS) - _STEP_DERIVED
    if step != columns:
        raise RuntimeError(f"StepRecord and schema.STEPS differ: {sorted(step ^ columns)}")


_check_in_sync()
