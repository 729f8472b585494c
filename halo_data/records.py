"""The one step record: how every producer builds the rows of ``steps``.

    episode = EpisodeRecord(run_id="r1", env="miniwob", task_id="miniwob.click-button", task_seed=3, attempt_idx=0)
    step = StepRecord(step_idx=0, url=url, observation=axtree, prompt=prompt, action="click('12')",
                      rewards={"progress": 0.2, "validity": 1.0}, weights=RewardWeights())
    writer.write_episode(episode, [step])

Environments, importers, synthetic data, search and the orchestrator all build
steps here, so the derived columns are filled the same way everywhere:

- ``r_progress`` … ``r_task_progress`` from ``rewards`` (a mapping by component name;
  a component left out is 0, except ``task_progress``, which only an environment that
  measures it gives: left out it is NULL; one given as ``None`` is unknown and stored NULL);
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
import inspect
import json
import operator
from typing import Any, Mapping, Sequence

from halo_data import ids, prompts
from halo_data import schema as S
from halo_data.config import RewardWeights
from halo_data.lake import LakeError


class RecordError(LakeError, TypeError, ValueError):
    """A step or episode record with a missing, unknown, mistyped or invalid field.

    A TypeError for the fields of the wrong type, a ValueError for the invalid ones
    (a run id that cannot be a folder name), a LakeError for the CLIs.
    """


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


_PY_TYPES: dict[str, tuple[type, ...]] = {c.name: _python_types(c.type) for c in S.STEPS.columns}


def _check(kind: str, name: str, value: Any, label: str | None = None) -> Any:
    """``value`` as stored in column ``name``, or a RecordError naming the field (``label``, else ``name``)."""
    if value is None:
        return None
    label = label or repr(name)
    types = _PY_TYPES[name]
    if isinstance(value, bool) and bool not in types:
        raise RecordError(f"{kind} field {label} must be {types[-1].__name__}, got bool {value!r}")
    if not isinstance(value, types):
        raise RecordError(f"{kind} field {label} must be {types[-1].__name__}, got {type(value).__name__} {value!r:.80}")
    if types == (int, float):
        value = float(value)
        if value != value:
            raise RecordError(f"{kind} field {label} is NaN")
    elif name == "logprobs":
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise RecordError(f"{kind} field 'logprobs' must be a list of numbers")
        value = [float(v) for v in value]
    elif name == "completion_token_ids":
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise RecordError(f"{kind} field 'completion_token_ids' must be a list of token ids (ints >= 0)")
        value = list(value)
    elif name == "choices":
        if not all(isinstance(v, str) for v in value):
            raise RecordError(f"{kind} field 'choices' must be a list of strings")
        value = list(value)
    elif isinstance(value, dt.datetime) and value.tzinfo is None:
        raise RecordError(f"{kind} field {label} must be timezone-aware (UTC)")
    return value


def _fast_types(names: Sequence[str]) -> tuple[tuple[str, type | None], ...]:
    """(field, the one type a value may have to skip ``_check``): most values are already of it."""
    exact = {(str,): str, (bool,): bool, (int,): int, (int, float): float, (dt.datetime,): dt.datetime}
    return tuple((name, exact.get(_PY_TYPES[name])) for name in names)


def _check_fields(kind: str, record: Any, fields: tuple[tuple[str, type | None], ...]) -> None:
    """Check (and convert, e.g. int to float) each field; the common exact-type case costs one comparison."""
    values = record.__dict__  # a frozen dataclass: converted values are stored past its __setattr__
    for name, exact in fields:
        value = values[name]
        if value is None:
            continue
        if type(value) is exact:
            if exact is float:
                if value == value:  # NaN goes on to _check, which names it
                    continue
            elif exact is dt.datetime:
                if value.tzinfo is not None:
                    continue
            else:
                continue
        values[name] = _check(kind, name, value)


def _keyword_fields(kind: str):
    """Give the dataclass an ``__init__`` that refuses an unknown or missing field with a RecordError naming it.

    The generated ``__init__`` would raise a bare TypeError ("unexpected keyword argument")
    that says nothing of which record or column is meant, and a frozen dataclass sets each
    field through ``object.__setattr__``: filling ``__dict__`` at once is about twice as fast,
    which counts for producers that build a million steps.
    """

    def wrap(cls):
        fields = dataclasses.fields(cls)
        names = frozenset(f.name for f in fields)
        required = tuple(f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        factories = tuple((f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING)
        post_init = cls.__post_init__

        def __init__(self, *args: Any, **values: Any) -> None:
            if args:
                raise RecordError(f"{kind} fields are keyword-only: {cls.__name__}(name=value, ...)")
            if not names.issuperset(values):
                raise RecordError(f"unknown {kind} field(s): {', '.join(sorted(set(values) - names))}")
            for name in required:
                if name not in values:
                    raise RecordError(f"{kind} field {name!r} is required")
            state = self.__dict__
            state.update(defaults)
            for name, factory in factories:
                if name not in values:
                    state[name] = factory()
            state.update(values)
            post_init(self)

        __init__.__doc__ = cls.__init__.__doc__
        __init__.__signature__ = inspect.signature(cls.__init__)
        cls.__init__ = __init__
        return cls

    return wrap


# ------------------------------------------------------------------------------------- episode
@_keyword_fields("episode")
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
        for name in ("task_seed", "attempt_idx"):
            if getattr(self, name) is None:
                raise RecordError(f"episode field {name!r} is required (it is part of the episode id)")
        _check_fields("episode", self, _EPISODE_CHECKED)
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
        return dict(zip(_EPISODE_FIELDS, _episode_values(self.__dict__)))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "EpisodeRecord":
        return cls(**row)

    def replace(self, **changes: Any) -> "EpisodeRecord":
        """A copy with ``changes``; the episode id is derived again when a field it comes from changes."""
        if "episode_id" not in changes and not _EPISODE_ID_FROM.isdisjoint(changes):
            changes["episode_id"] = None
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------- step
@_keyword_fields("step")
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
    macro: str | None = None  # the macro an action_source 'macro' step came from
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
    call_model: str | None = None  # the model called for this row (worker or manager)
    cost_usd: float | None = None
    logprobs: Sequence[float] | None = None
    logprob_sum: float | None = None
    completion_token_ids: Sequence[int] | None = None  # the engine's tokens; logprobs has one per token
    logprobs_mode: str | None = None  # schema.LOGPROBS_MODES
    draw: str | None = None  # schema.DRAWS
    choices: Sequence[str] | None = None  # a guided choice's allowed answers
    is_last: bool | None = None  # derived by the writer from the step's position
    extra: Mapping[str, Any] | str | None = None

    def __post_init__(self) -> None:
        values = self.__dict__
        step_idx = values["step_idx"]
        if type(step_idx) is not int or step_idx < 0:
            raise RecordError(f"step field 'step_idx' must be an int >= 0, got {step_idx!r}")
        _check_fields("step", self, _STEP_CHECKED)
        rewards = values["rewards"]
        if not isinstance(rewards, Mapping):
            raise RecordError(f"step field 'rewards' must be a mapping of component to number, got {type(rewards).__name__}")
        values["rewards"] = rewards = dict(rewards)  # the record keeps its own copy: no change behind its back
        if not _COMPONENTS.issuperset(rewards):
            unknown = ", ".join(sorted(set(rewards) - _COMPONENTS))
            raise RecordError(f"step field 'rewards' has unknown component(s) {unknown}; components are {', '.join(S.REWARD_COMPONENTS)}")
        for name, value in rewards.items():
            if value is not None and (type(value) is not float or value != value):
                _check("step", _REWARD_COLUMN[name], value, f"'rewards' component {name!r}")
        _check_weights(values["weights"])
        extra = values["extra"]
        if extra is not None and not isinstance(extra, (str, Mapping)):
            raise RecordError(f"step field 'extra' must be a mapping or a JSON string, got {type(extra).__name__}")
        check_token_fields("step", values)

    def components(self) -> dict[str, float | None]:
        """Every reward component: a left-out one is 0 (task_progress: None, not measured), an unknown (None) one stays None."""
        rewards = self.rewards
        return {c: (None if (v := rewards.get(c, _LEFT_OUT[c])) is None else float(v)) for c in S.REWARD_COMPONENTS}

    def weighted_reward(self) -> float | None:
        """``reward`` as given, else the components' weighted sum under ``weights`` (None without weights)."""
        weights = _weights(self.weights)
        return _reward(self.reward, self.components(), weights[0] if weights else None)

    def row(self) -> dict[str, Any]:
        """Every step column of ``steps`` (those of the episode aside), derived ones included."""
        values = self.__dict__
        row = dict(zip(_STEP_PLAIN, _step_values(values)))
        components = self.components()
        for c, v in components.items():
            row[_REWARD_COLUMN[c]] = v
        weights = _weights(values["weights"])
        if weights is None:
            row["reward_weights"] = None
        else:
            row["reward_weights"] = weights[1]
            row["reward"] = _reward(values["reward"], components, weights[0])
        prompt = values["prompt"]
        if prompt is None:
            row["prompt_hash"] = None
        else:
            row["prompt_hash"] = ids.sha256_hex(prompt)
            row["prompt_version"] = values["prompt_version"] or prompts.PROMPT_VERSION
        row["state_hash_version"] = S.STATE_HASH_VERSION
        extra = values["extra"]
        if extra is not None and not isinstance(extra, str):
            row["extra"] = json.dumps(extra, sort_keys=True, default=str)
        for name in ("logprobs", "completion_token_ids", "choices"):
            if values[name] is not None:
                row[name] = list(values[name])
        return row

    def replace(self, **changes: Any) -> "StepRecord":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "StepRecord":
        """A record from a row of ``steps`` (``r_*`` columns, ``reward_weights`` JSON); derived columns are recomputed."""
        fields = {k: v for k, v in row.items() if k not in _STEP_DERIVED}
        fields.setdefault("rewards", {c: row[col] for c, col in _REWARD_COLUMN.items() if col in row})
        if row.get("reward_weights") and fields.get("weights") is None:
            fields["weights"] = json.loads(row["reward_weights"])
        return cls(**fields)


def check_token_fields(kind: str, values: Mapping[str, Any]) -> None:
    """A token-exact completion's fields agree: one logprob per token id, a known mode and draw (RecordError if not)."""
    mode, draw = values.get("logprobs_mode"), values.get("draw")
    if mode is not None and mode not in S.LOGPROBS_MODES:
        raise RecordError(f"{kind} field 'logprobs_mode' must be one of {', '.join(S.LOGPROBS_MODES)}, got {mode!r}")
    if draw is not None and draw not in S.DRAWS:
        raise RecordError(f"{kind} field 'draw' must be one of {', '.join(S.DRAWS)}, got {draw!r}")
    token_ids, logprobs = values.get("completion_token_ids"), values.get("logprobs")
    if token_ids is not None and logprobs is not None and len(token_ids) != len(logprobs):
        raise RecordError(
            f"{kind} fields 'completion_token_ids' ({len(token_ids)}) and 'logprobs' ({len(logprobs)}) must have "
            "one logprob per token"
        )


# ------------------------------------------------------------------------------- derived columns
def _reward(given: float | None, components: Mapping[str, float | None], weights: Mapping[str, float] | None) -> float | None:
    if given is not None or weights is None:
        return given
    return sum((v or 0.0) * weights[c] for c, v in components.items())


def _check_weights(weights: Any) -> None:
    if weights is None or isinstance(weights, RewardWeights):
        return
    if not isinstance(weights, Mapping):
        raise RecordError(f"step field 'weights' must be RewardWeights or a mapping of component to number, got {type(weights).__name__}")
    if not _COMPONENTS.issuperset(weights):
        raise RecordError(f"step field 'weights' has unknown component(s) {', '.join(sorted(set(weights) - _COMPONENTS))}")
    for name, value in weights.items():
        label = f"'weights' component {name!r}"
        if value is None:
            raise RecordError(f"step field {label} must be float, got NoneType")
        _check("step", _REWARD_COLUMN[name], value, label)


_WEIGHTS_JSON: dict[tuple[float, ...], str] = {}


def _weights(weights: RewardWeights | Mapping[str, float] | None) -> tuple[dict[str, float], str] | None:
    """The weights by component, and their JSON (cached: producers pass the same weights for every step)."""
    if weights is None:
        return None
    by_component = (weights if isinstance(weights, RewardWeights) else RewardWeights(**weights)).as_dict()
    key = tuple(by_component.values())
    text = _WEIGHTS_JSON.get(key)
    if text is None:
        if len(_WEIGHTS_JSON) > 256:
            _WEIGHTS_JSON.clear()
        text = _WEIGHTS_JSON[key] = json.dumps(by_component, sort_keys=True)
    return by_component, text


_EPISODE_FIELDS: tuple[str, ...] = S.EPISODE_COLUMNS
_EPISODE_CHECKED = _fast_types(_EPISODE_FIELDS)
_EPISODE_ID_FROM = frozenset({"run_id", "task_id", "task_seed", "attempt_idx"})
_episode_values = operator.itemgetter(*_EPISODE_FIELDS)
_COMPONENTS = frozenset(S.REWARD_COMPONENTS)
_REWARD_COLUMN = {c: S.reward_column(c) for c in S.REWARD_COMPONENTS}
# A component a producer leaves out: 0, but task-aware progress is only known where it was measured.
_LEFT_OUT: dict[str, float | None] = {c: (None if c == "task_progress" else 0.0) for c in S.REWARD_COMPONENTS}
# Columns the record derives rather than takes.
_STEP_DERIVED = frozenset(S.REWARD_COLUMNS) | {"prompt_hash", "state_hash_version", "reward_weights"}
_STEP_PLAIN: tuple[str, ...] = tuple(
    c for c in S.STEPS.column_names if c not in S.EPISODE_COLUMNS and c not in _STEP_DERIVED
)
_step_values = operator.itemgetter(*_STEP_PLAIN)
_STEP_CHECKED = _fast_types(tuple(c for c in _STEP_PLAIN if c not in ("step_idx", "extra")))


def check_in_sync(spec: S.TableSpec = S.STEPS, episode: type = EpisodeRecord, step: type = StepRecord) -> None:
    """Raise RecordError naming the columns where the records and ``spec`` (``schema.STEPS``) differ.

    Run at import, so a column added to the schema but not to a record (or the other way)
    fails at once rather than writing NULLs.
    """
    names = [c.name for c in spec.columns]
    episode_columns = set(names[: names.index("step_idx")]) if "step_idx" in names else set()
    episode_fields = {f.name for f in dataclasses.fields(episode)}
    step_fields = {f.name for f in dataclasses.fields(step)} - {"rewards", "weights"}
    step_columns = set(names) - episode_columns - _STEP_DERIVED
    for record, fields, columns in (("EpisodeRecord", episode_fields, episode_columns), ("StepRecord", step_fields, step_columns)):
        if fields != columns:
            drift = [f"{c} (only in the record)" for c in sorted(fields - columns)]
            drift += [f"{c} (only in {spec.name})" for c in sorted(columns - fields)]
            raise RecordError(f"{record} and schema {spec.name} differ: {', '.join(drift)}")


check_in_sync()
