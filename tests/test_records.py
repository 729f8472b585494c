"""The one step record: derived columns, build-time errors naming the field, drift from the schema, the writer."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math

import pyarrow as pa
import pytest

from halo_data import ids, prompts
from halo_data import schema as S
from halo_data.config import RewardWeights
from halo_data.lake import Lake
from halo_data.records import EpisodeRecord, RecordError, StepRecord, check_in_sync
from halo_data.writer import EpisodeWriter

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
WEIGHTS = RewardWeights(progress=2.0, novelty=0.5, loop=0.25, validity=0.1, success=10.0)
PROMPT = prompts.dumps(prompts.render_messages("Click OK", "http://x/", "[4] button 'OK'"))


def an_episode(**changes) -> EpisodeRecord:
    fields = dict(run_id="r1", env="miniwob", task_id="miniwob.click-button", task_seed=3, attempt_idx=1,
                  success=True, started_at=T0)
    return EpisodeRecord(**{**fields, **changes})


# ------------------------------------------------------------------------------ derived columns
def test_reward_columns_from_components_left_out_is_zero_none_is_null():
    row = StepRecord(step_idx=0, rewards={"progress": 0.25, "loop": -1, "novelty": None}).row()
    assert {c: row[c] for c in S.REWARD_COLUMNS} == {
        "r_progress": 0.25, "r_novelty": None, "r_loop": -1.0, "r_validity": 0.0, "r_success": 0.0, "r_task_progress": None}
    assert type(row["r_loop"]) is float


def test_reward_is_the_weighted_sum_and_the_weights_are_stored():
    step = StepRecord(step_idx=0, rewards={"progress": 0.5, "novelty": 1.0, "loop": -1.0, "validity": 1.0, "success": 1.0,},
                      weights=WEIGHTS)
    row = step.row()
    assert row["reward"] == pytest.approx(2.0 * 0.5 + 0.5 * 1.0 + 0.25 * -1.0 + 0.1 * 1.0 + 10.0 * 1.0)
    assert step.weighted_reward() == row["reward"]
    assert json.loads(row["reward_weights"]) == WEIGHTS.as_dict()
    # a mapping of weights is completed with the defaults, as RewardWeights would be
    partial = StepRecord(step_idx=0, rewards={"progress": 0.5}, weights={"progress": 4.0}).row()
    assert partial["reward"] == 2.0
    assert json.loads(partial["reward_weights"]) == {**RewardWeights().as_dict(), "progress": 4.0}


def test_a_recorded_reward_is_kept_and_no_weights_means_no_shaped_reward():
    kept = StepRecord(step_idx=0, rewards={"success": 1.0}, weights=WEIGHTS, reward=0.75).row()
    assert (kept["reward"], json.loads(kept["reward_weights"])) == (0.75, WEIGHTS.as_dict())
    bare = StepRecord(step_idx=0, rewards={"success": 1.0}).row()
    assert (bare["reward"], bare["reward_weights"]) == (None, None)
    assert StepRecord(step_idx=0, reward=3).row()["reward"] == 3.0


def test_prompt_hash_and_prompt_version():
    row = StepRecord(step_idx=0, prompt=PROMPT).row()
    assert row["prompt_hash"] == ids.sha256_hex(PROMPT)
    assert row["prompt_version"] == prompts.PROMPT_VERSION
    assert StepRecord(step_idx=0, prompt=PROMPT, prompt_version="older-v0").row()["prompt_version"] == "older-v0"
    none = StepRecord(step_idx=0).row()
    assert (none["prompt"], none["prompt_hash"], none["prompt_version"]) == (None, None, None)


def test_state_hash_version_extra_and_logprobs():
    row = StepRecord(step_idx=2, state_hash="abc", extra={"b": 1, "a": T0}, logprobs=(-1, -0.5)).row()
    assert row["state_hash_version"] == S.STATE_HASH_VERSION
    assert row["extra"] == json.dumps({"a": str(T0), "b": 1})  # sorted keys, anything else as text
    assert row["logprobs"] == [-1.0, -0.5]
    assert StepRecord(step_idx=0, extra='{"as": "given"}').row()["extra"] == '{"as": "given"}'
    assert set(row) == set(S.STEPS.column_names) - set(S.EPISODE_COLUMNS)


def test_episode_id_is_derived_checked_and_derived_again_on_replace():
    episode = an_episode()
    assert episode.episode_id == ids.episode_id("r1", "miniwob.click-button", 3, 1)
    assert an_episode(episode_id=episode.episode_id) == episode
    with pytest.raises(RecordError, match="episode field 'episode_id' .* does not match"):
        an_episode(episode_id="made-up")
    again = episode.replace(attempt_idx=2)
    assert again.episode_id == ids.episode_id("r1", "miniwob.click-button", 3, 2)
    assert episode.replace(success=False).episode_id == episode.episode_id
    assert set(episode.row()) == set(S.EPISODE_COLUMNS)


def test_int_becomes_float_where_the_column_is_a_float():
    episode = an_episode(temperature=1, task_reward=0)
    assert (type(episode.temperature), type(episode.task_reward)) == (float, float)
    assert type(StepRecord(step_idx=0, latency_ms=5).latency_ms) is float


# ------------------------------------------------------------------------------ errors at build time
@pytest.mark.parametrize("build, message", [
    (lambda: StepRecord(step_idx=0, url=5), "step field 'url' must be str, got int 5"),
    (lambda: StepRecord(step_idx=0, action_valid="yes"), "step field 'action_valid' must be bool, got str 'yes'"),
    (lambda: StepRecord(step_idx=0, prompt_tokens=True), "step field 'prompt_tokens' must be int, got bool True"),
    (lambda: StepRecord(step_idx=0, prompt_tokens=1.5), "step field 'prompt_tokens' must be int, got float 1.5"),
    (lambda: StepRecord(step_idx=0, latency_ms=math.nan), "step field 'latency_ms' is NaN"),
    (lambda: StepRecord(step_idx=0, latency_ms="fast"), "step field 'latency_ms' must be float, got str 'fast'"),
    (lambda: StepRecord(step_idx=-1), "step field 'step_idx' must be an int >= 0, got -1"),
    (lambda: StepRecord(step_idx="0"), "step field 'step_idx' must be an int >= 0, got '0'"),
    (lambda: StepRecord(step_idx=0, logprobs=[-1.0, "x"]), "step field 'logprobs' must be a list of numbers"),
    (lambda: StepRecord(step_idx=0, rewards={"progress": "high"}),
     "step field 'rewards' component 'progress' must be float, got str 'high'"),
    (lambda: StepRecord(step_idx=0, rewards={"loop": math.nan}), "step field 'rewards' component 'loop' is NaN"),
    (lambda: StepRecord(step_idx=0, rewards=[0.5]), "step field 'rewards' must be a mapping of component to number"),
    (lambda: StepRecord(step_idx=0, weights={"progress": None}),
     "step field 'weights' component 'progress' must be float, got NoneType"),
    (lambda: StepRecord(step_idx=0, weights=[1.0]), "step field 'weights' must be RewardWeights or a mapping"),
    (lambda: StepRecord(step_idx=0, extra=3), "step field 'extra' must be a mapping or a JSON string, got int"),
    (lambda: an_episode(success="true"), "episode field 'success' must be bool, got str 'true'"),
    (lambda: an_episode(task_seed=2.0), "episode field 'task_seed' must be int, got float 2.0"),
    (lambda: an_episode(started_at="2026-01-02"), "episode field 'started_at' must be datetime, got str"),
    (lambda: an_episode(started_at=dt.datetime(2026, 1, 2)), "episode field 'started_at' must be timezone-aware"),
    (lambda: an_episode(run_id="../evil"), "episode field 'run_id': invalid run id '../evil'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_wrong_type_fails_at_build_naming_the_field(build, message):
    with pytest.raises(RecordError) as caught:
        build()
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("build, message", [
    (lambda: StepRecord(step_idx=0, colour="red"), "unknown step field(s): colour"),
    (lambda: StepRecord(step_idx=0, r_progress=0.5, reward_weights="{}"), "unknown step field(s): r_progress, reward_weights"),
    (lambda: an_episode(colour="red"), "unknown episode field(s): colour"),
    (lambda: StepRecord(step_idx=0, rewards={"speed": 1.0}),
     "step field 'rewards' has unknown component(s) speed; components are progress, novelty, loop, validity, success, task_progress"),
    (lambda: StepRecord(step_idx=0, weights={"speed": 1.0}), "step field 'weights' has unknown component(s) speed"),
    (lambda: StepRecord(step_idx=0).replace(colour="red"), "unknown step field(s): colour"),
    (lambda: StepRecord.from_row({"step_idx": 0, "colour": "red"}), "unknown step field(s): colour"),
    (lambda: EpisodeRecord.from_row({"run_id": "r", "env": "e", "task_id": "t", "colour": "red"}),
     "unknown episode field(s): colour"),
])
def test_an_unknown_field_fails_at_build_naming_it(build, message):
    with pytest.raises(RecordError) as caught:
        build()
    assert str(caught.value) == message


@pytest.mark.parametrize("build, message", [
    (lambda: StepRecord(url="http://x/"), "step field 'step_idx' is required"),
    (lambda: StepRecord(step_idx=None), "step field 'step_idx' must be an int >= 0, got None"),
    (lambda: EpisodeRecord(run_id="r", task_id="t"), "episode field 'env' is required"),
    (lambda: EpisodeRecord(run_id="r", env="", task_id="t"), "episode field 'env' is required"),
    (lambda: an_episode(task_seed=None), "episode field 'task_seed' is required (it is part of the episode id)"),
    (lambda: StepRecord(0), "step fields are keyword-only: StepRecord(name=value, ...)"),
])
def test_a_missing_field_fails_at_build_naming_it(build, message):
    with pytest.raises(RecordError) as caught:
        build()
    assert str(caught.value) == message


def test_record_errors_are_type_value_and_lake_errors():
    from halo_data.lake import LakeError

    assert issubclass(RecordError, TypeError) and issubclass(RecordError, ValueError) and issubclass(RecordError, LakeError)


# ------------------------------------------------------------------------------ drift from the schema
def test_the_records_match_schema_steps():
    check_in_sync()
    step_columns = set(StepRecord(step_idx=0).row())
    assert step_columns | set(an_episode().row()) == set(S.STEPS.column_names)


def with_columns(columns) -> S.TableSpec:
    return dataclasses.replace(S.STEPS, columns=tuple(columns))


def test_a_column_added_to_the_schema_but_not_the_record_is_caught():
    added = with_columns([*S.STEPS.columns, S.C("colour", pa.string(), "A new step column.")])
    with pytest.raises(RecordError, match=r"StepRecord and schema steps differ: colour \(only in steps\)"):
        check_in_sync(added)
    at = [c.name for c in S.STEPS.columns].index("step_idx")
    episode_column = with_columns([*S.STEPS.columns[:at], S.C("colour", pa.string(), "A new episode column."), *S.STEPS.columns[at:]])
    with pytest.raises(RecordError, match=r"EpisodeRecord and schema steps differ: colour \(only in steps\)"):
        check_in_sync(episode_column)


def test_a_column_dropped_from_the_schema_or_added_to_a_record_is_caught():
    dropped = with_columns([c for c in S.STEPS.columns if c.name != "url"])
    with pytest.raises(RecordError, match=r"StepRecord and schema steps differ: url \(only in the record\)"):
        check_in_sync(dropped)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WiderStep(StepRecord):
        colour: str | None = None

    with pytest.raises(RecordError, match=r"StepRecord and schema steps differ: colour \(only in the record\)"):
        check_in_sync(step=WiderStep)


# ------------------------------------------------------------------------------ the writer
def steps_rows(lake: Lake) -> list[dict]:
    return lake.query_arrow("select * from steps order by step_idx").to_pylist()


def test_the_writer_writes_records_and_plain_mappings_the_same_way(tmp_path):
    episode = an_episode(ended_at=T0 + dt.timedelta(seconds=9), temperature=0.7)
    steps = [
        StepRecord(step_idx=0, url="http://x/", observation="[4] button 'OK'", prompt=PROMPT, model_output="click('4')",
                   action="click('4')", action_valid=True, rewards={"progress": 0.5, "novelty": 1.0}, weights=WEIGHTS,
                   state_hash=ids.state_hash("http://x/", "[4] button 'OK'"), latency_ms=12.5, logprobs=[-0.5, -0.25],
                   extra={"tab": 0}),
        StepRecord(step_idx=1, url="http://x/done", prompt=PROMPT, model_output="noop()", action="noop()",
                   rewards={"success": 1.0, "novelty": None}, weights=WEIGHTS, reward=9.5, prompt_tokens=30),
    ]
    # the same episode as the plain rows a producer used to build by hand (step_idx left to the position)
    mappings = [{k: v for k, v in s.row().items() if k not in ("step_idx", "prompt_hash", "state_hash_version")} for s in steps]
    plain = Lake.init(tmp_path / "plain")
    typed = Lake.init(tmp_path / "typed")
    with EpisodeWriter(typed) as writer:
        assert writer.write_episode(episode, steps) == episode.episode_id
    with EpisodeWriter(plain) as writer:
        assert writer.write_episode({k: v for k, v in episode.row().items() if k != "episode_id"}, mappings) == episode.episode_id
    got, expected = steps_rows(plain), steps_rows(typed)
    assert got == expected
    assert [(r["step_idx"], r["is_last"], r["n_steps"], r["episode_id"]) for r in got] == [
        (0, False, 2, episode.episode_id), (1, True, 2, episode.episode_id)]
    first, last = got
    assert (first["r_progress"], first["r_novelty"], first["r_success"], last["r_novelty"], last["reward"]) == (0.5, 1.0, 0.0, None, 9.5)
    assert first["reward"] == pytest.approx(2.0 * 0.5 + 0.5 * 1.0)
    assert (first["prompt_hash"], first["state_hash_version"], first["logprobs"]) == (ids.sha256_hex(PROMPT), S.STATE_HASH_VERSION, [-0.5, -0.25])
    assert (first["started_at"], first["temperature"]) == (T0, 0.7)


def test_a_step_read_back_from_the_lake_rebuilds_the_same_row(lake):
    step = StepRecord(step_idx=0, prompt=PROMPT, rewards={"progress": 0.5, "loop": None}, weights=WEIGHTS, extra={"k": 1})
    with EpisodeWriter(lake) as writer:
        writer.write_episode(an_episode(), [step])
    (stored,) = steps_rows(lake)
    rebuilt = StepRecord.from_row({k: v for k, v in stored.items() if k not in S.EPISODE_COLUMNS})
    assert rebuilt.row() == step.row() | {"is_last": True}


def test_the_writer_refuses_a_mapping_the_record_refuses(lake):
    writer = EpisodeWriter(lake)
    with pytest.raises(RecordError, match="step field 'latency_ms' must be float, got str 'slow'"):
        writer.write_episode(an_episode(), [{"step_idx": 0, "latency_ms": "slow"}])
    with pytest.raises(RecordError, match="unknown step field\\(s\\): colour"):
        writer.write_episode(an_episode(), [{"colour": "red"}])
    assert writer.pending_episodes == []
