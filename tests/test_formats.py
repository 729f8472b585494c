"""Trajectories in and out of the lake: ATIF documents (export, import, round trip) and Hugging Face datasets.

One lake serves every test: a REAL episode (agisdk's environment on the local GoMail clone, a random policy,
screenshots stored), synthetic REAL-like episodes, and a token-exact episode of SmolLM2-135M-Instruct (token ids,
logprobs, their mode and draw, a guided choice's answers), as the hf policy writes them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from halo_data import prompts
from halo_data.atif_schema import SCHEMA, SPEC_VERSION, validate
from halo_data.cli import main
from halo_data.config import RewardWeights
from halo_data.lake import Lake, LakeError
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.writer import EpisodeWriter

TOKEN_RUN = "smollm2-tokens"
REAL_RUN = "random-real"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def error_line(result) -> str:
    """The one line an error prints (and nothing else on stderr)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


def _token_episode() -> tuple[EpisodeRecord, list[StepRecord]]:
    """Three steps as the hf policy writes SmolLM2-135M-Instruct's: the engine's token ids with one processed
    logprob each, drawn under a guided choice's mask."""
    t0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
    episode = EpisodeRecord(run_id=TOKEN_RUN, env="miniwob", task_id="miniwob.click-button", site="miniwob", split="train",
                            mode="hf", policy="hf", model="smollm2-135m-instruct", adapter="out/bc/adapter",
                            policy_version="bc-step-40", seed=3, task_seed=11, temperature=1.0, success=True,
                            task_reward=1.0, raw_reward=0.82, terminated=True, truncated=False, started_at=t0,
                            ended_at=t0 + dt.timedelta(seconds=4))
    goal = "Click the button labelled OK."
    pages = ["[3] button 'Cancel'\n[4] button 'Next'", "[5] button 'OK'\n[6] button 'Back'", "[7] StaticText 'Done'"]
    actions = ["click('4')", "click('5')", "noop()"]
    token_ids = [[28, 3624, 940, 33, 19, 2], [28, 3624, 940, 34, 19, 2], [6290, 1083, 2]]
    logprobs = [[-0.25, 0.0, 0.0, -1.5, 0.0, -0.0625], [-0.125, 0.0, 0.0, -0.5, 0.0, -0.03125], [-2.0, 0.0, -0.5]]
    steps, history = [], []
    for i, (page, action) in enumerate(zip(pages, actions)):
        prompt = prompts.dumps(prompts.render_messages(goal, "file:///miniwob/click-button.html", page, history))
        steps.append(StepRecord(
            step_idx=i, url="file:///miniwob/click-button.html", goal=goal, observation=page, prompt=prompt,
            model_output=action, action=action, action_source="model", action_valid=True,
            rewards={"progress": 0.5 * (i < 2), "novelty": 1.0, "loop": 0.0, "validity": 1.0, "success": float(i == 2),
                     "task_progress": None if i else 0.25},
            weights=RewardWeights(), cumulative_progress=min(1.0, 0.5 * (i + 1)), state_hash=f"{i:064x}",
            latency_ms=31.5, env_ms=12.0, prompt_tokens=412 + i, completion_tokens=len(token_ids[i]),
            call_model="smollm2-135m-instruct", cost_usd=0.0, logprobs=logprobs[i], logprob_sum=sum(logprobs[i]),
            completion_token_ids=token_ids[i], logprobs_mode="processed_logprobs", draw="masked_choice",
            choices=["click('4')", "click('5')", "noop()"], extra={"bids": ["3", "4", "5"]},
        ))
        history.append(action)
    return episode, steps


@pytest.fixture(scope="module")
def source_lake(tmp_path_factory):
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_agent.sites import LocalSite
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake

    root = tmp_path_factory.mktemp("formats") / "lake"
    with LocalSite("gomail") as site:
        summary = run_rollouts(RolloutConfig(env="real", tasks=["v2.gomail-18"], rollouts_per_task=1, policy="random",
                                             max_steps=2, env_options={"site_urls": {"gomail": site.url}}, lake=str(root),
                                             run_id=REAL_RUN, progress=False))
    assert summary.episodes_written == 1
    spec = SyntheticSpec(n_steps=40, attempts_per_task=2, min_steps=5, max_steps=8, screenshot_size=(48, 32), seed=7)
    lake = build_synthetic_lake(str(root), spec)
    writer = EpisodeWriter(lake)
    writer.write_episode(*_token_episode())
    writer.close()
    return lake


def _steps(lake: Lake) -> list[dict]:
    return lake.query_arrow("select * from steps order by run_id, episode_id, step_idx").to_pylist()


def _shots(lake: Lake) -> dict:
    return {r["hash"]: (r["image"], r["format"]) for r in lake.query_arrow("select hash, image, format from screenshots").to_pylist()}


# ---------------------------------------------------------------------- the schema
def _rfc_example() -> dict:
    """The spec's multi-step example (section IV), as Harbor's RFC gives it."""
    return {
        "schema_version": "ATIF-v1.5", "session_id": "025B810F-B3A2-4C67-93C0-FE7A142A947A",
        "agent": {"name": "harbor-agent", "version": "1.0.0", "model_name": "gemini-2.5-flash", "extra": {}},
        "notes": "Initial test trajectory", "extra": {},
        "final_metrics": {"total_prompt_tokens": 1120, "total_completion_tokens": 124, "total_cached_tokens": 200,
                          "total_cost_usd": 0.00078, "total_steps": 3, "extra": {}},
        "steps": [
            {"step_id": 1, "timestamp": "2025-10-11T10:30:00Z", "source": "user",
             "message": "What is the current trading price of Alphabet (GOOGL)?", "extra": {}},
            {"step_id": 2, "timestamp": "2025-10-11T10:30:02Z", "source": "agent", "model_name": "gemini-2.5-flash",
             "reasoning_effort": "medium", "message": "I will search for the current trading price and volume for GOOGL.",
             "reasoning_content": "Two data points: price and volume.",
             "tool_calls": [
                 {"tool_call_id": "call_price_1", "function_name": "financial_search", "arguments": {"ticker": "GOOGL", "metric": "price"}},
                 {"tool_call_id": "call_volume_2", "function_name": "financial_search", "arguments": {"ticker": "GOOGL", "metric": "volume"}}],
             "observation": {"results": [
                 {"source_call_id": "call_price_1", "content": "GOOGL is currently trading at $185.35 (Close: 10/11/2025)"},
                 {"source_call_id": "call_volume_2", "content": "GOOGL volume: 1.5M shares traded."}]},
             "metrics": {"prompt_tokens": 520, "completion_tokens": 80, "cached_tokens": 200, "cost_usd": 0.00045}},
            {"step_id": 3, "timestamp": "2025-10-11T10:30:05Z", "source": "agent", "model_name": "gemini-2.5-flash",
             "reasoning_effort": "low", "message": "Alphabet (GOOGL) is trading at $185.35.",
             "metrics": {"prompt_tokens": 600, "completion_tokens": 4, "prompt_token_ids": [1, 2, 3],
                         "completion_token_ids": [1722, 310, 5533, 29889], "logprobs": [-0.1, -0.05, -0.02, -0.01],
                         "cost_usd": 0.00033, "extra": {"reasoning_tokens": 12}}},
        ],
    }


def test_the_schema_accepts_the_specs_example_and_names_what_is_wrong():
    assert validate(_rfc_example()) == []
    audio = _rfc_example() | {"schema_version": SPEC_VERSION}
    audio["steps"][0]["message"] = [{"type": "text", "text": "Transcribe this."},
                                    {"type": "audio", "source": {"media_type": "audio/mp3", "path": "a.mp3", "duration_sec": 2.5}}]
    assert validate(audio) == []  # v1.8: audio parts

    def broken(change) -> list[str]:
        doc = _rfc_example()
        change(doc)
        return validate(doc)

    assert broken(lambda d: d["agent"].pop("version")) == ["agent.version: required field missing"]
    assert broken(lambda d: d["steps"][2].update(step_id=4)) == ["steps[2].step_id: expected 3 (sequential from 1), got 4"]
    assert broken(lambda d: d["steps"][0].update(metrics={})) == [
        "steps[0].metrics: only applicable when source is 'agent', but source is 'user'"]
    assert broken(lambda d: d["steps"][2]["metrics"].update(logprobs="-0.1")) == ["steps[2].metrics.logprobs: expected array of number, got string"]
    assert broken(lambda d: d["steps"][2]["metrics"].update(completion_token_ids=[1.5])) == [
        "steps[2].metrics.completion_token_ids[0]: expected integer, got number"]
    assert broken(lambda d: d["steps"][1].update(source="tool")) == ["steps[1].source: must be one of system, user, agent, got 'tool'"]
    assert broken(lambda d: d["steps"][1]["observation"]["results"][0].update(source_call_id="nope")) == [
        "steps[1].observation.results[0].source_call_id: 'nope' names no tool call of this step"]
    assert broken(lambda d: d.update(schema_version="ATIF-v2.0")) == [
        "schema_version: must be one of " + ", ".join(f"ATIF-v1.{i}" for i in range(9)) + ", got 'ATIF-v2.0'"]
    assert broken(lambda d: d["steps"][0].update(message=[{"type": "image", "text": "x"}])) == [
        "steps[0].message[0].text: not allowed when type is 'image'", "steps[0].message[0].source: required when type is 'image'"]
    assert broken(lambda d: d.update(steps=[])) == ["steps: must have at least one step"]
    assert broken(lambda d: d.update(colour="red"))[0].startswith("colour: unknown field of Trajectory")
    assert validate([]) == ["expected an ATIF document (a JSON object), got array"]


# ---------------------------------------------------------------------- ATIF out, ATIF in
def _required_present(doc: dict) -> None:
    """Every field the spec requires, present and of its type, on every object of ``doc`` (read off the schema)."""
    def walk(obj, name):
        for key, (kinds, required) in SCHEMA[name].items():
            if required:
                assert obj.get(key) is not None, f"{name}.{key} missing"
            value = obj.get(key)
            for kind in kinds:
                if kind.startswith("#") and isinstance(value, dict):
                    walk(value, kind[1:])
                elif kind.startswith("array:#") and isinstance(value, list):
                    for v in value:
                        if isinstance(v, dict) and kind[7:] in SCHEMA:
                            walk(v, kind[7:])
    walk(doc, "Trajectory")


@pytest.fixture(scope="module")
def atif_export(source_lake, tmp_path_factory):
    out = tmp_path_factory.mktemp("atif") / "docs"
    result = cli("export", "--format", "atif", str(out), "--lake", source_lake.root)
    assert result.exit_code == 0, result.output
    return out


def test_atif_export_is_valid_at_the_spec_version_with_token_ids_and_screenshots(source_lake, atif_export):
    n_episodes = source_lake.query_arrow("select count(distinct episode_id) n from steps").to_pylist()[0]["n"]
    docs = {p.stem: json.loads(p.read_text()) for p in atif_export.glob("*.json")}
    assert len(docs) == n_episodes
    for doc in docs.values():
        assert validate(doc) == [] and doc["schema_version"] == SPEC_VERSION == "ATIF-v1.8"
        _required_present(doc)
        assert doc["final_metrics"]["total_steps"] == len(doc["steps"])
    token_doc = next(d for d in docs.values() if d["session_id"] == TOKEN_RUN)
    assert token_doc["agent"] == {"name": "halo", "version": "0.1.0", "model_name": "smollm2-135m-instruct",
                                  "extra": {"policy": "hf", "adapter": "out/bc/adapter", "policy_version": "bc-step-40", "mode": "hf"}}
    agent_steps = [s for s in token_doc["steps"] if s["source"] == "agent"]
    assert [s["metrics"]["completion_token_ids"] for s in agent_steps] == [s.completion_token_ids for s in _token_episode()[1]]
    assert agent_steps[0]["metrics"]["logprobs"] == [-0.25, 0.0, 0.0, -1.5, 0.0, -0.0625]
    assert agent_steps[0]["metrics"]["extra"]["draw"] == "masked_choice"
    assert agent_steps[0]["tool_calls"] == [{"tool_call_id": "call_0", "function_name": "browser_action", "arguments": {"action": "click('4')"}}]
    assert agent_steps[-1]["extra"]["success"] is True and agent_steps[-1]["extra"]["rewards"]["success"] == 1.0
    assert agent_steps[0]["extra"]["rewards"]["task_progress"] == 0.25 and agent_steps[1]["extra"]["rewards"]["task_progress"] is None
    assert token_doc["final_metrics"]["extra"]["success"] is True and token_doc["final_metrics"]["total_completion_tokens"] == 15
    real_doc = next(d for d in docs.values() if d["session_id"] == REAL_RUN)
    images = [p["source"]["path"] for s in real_doc["steps"] for r in (s.get("observation") or {}).get("results", [])
              if isinstance(r.get("content"), list) for p in r["content"] if p["type"] == "image"]
    assert len(images) >= 2 and all(re.fullmatch(r"images/[0-9a-f]{64}\.png", p) and (atif_export / p).is_file() for p in images)
    assert real_doc["extra"]["halo"]["env"] == "real" and real_doc["extra"]["halo"]["task_id"] == "v2.gomail-18"


def test_atif_round_trip_gives_the_same_steps_and_screenshots_and_twice_adds_nothing(source_lake, atif_export, tmp_path):
    target = tmp_path / "copy"
    result = cli("import", str(atif_export), "--lake", str(target))
    assert result.exit_code == 0, result.output
    copy = Lake.open(target)
    assert _steps(copy) == _steps(source_lake)  # every column: prompt, tokens, logprobs, rewards, hashes, episode fields
    assert _shots(copy) == _shots(source_lake)
    token_rows = [r for r in _steps(copy) if r["run_id"] == TOKEN_RUN]
    assert [r["completion_token_ids"] for r in token_rows] == [s.completion_token_ids for s in _token_episode()[1]]
    versions = copy.versions()
    again = cli("import", str(atif_export), "--lake", str(target))
    assert again.exit_code == 0 and "imported 0 episodes" in again.output
    assert copy.versions() == versions  # not one commit


def test_atif_jsonl_export_of_chosen_episodes_round_trips(source_lake, tmp_path):
    out = tmp_path / "atif" / "tokens.jsonl"
    result = cli("export", "episodes", str(out), "--format", "atif", "--where", f"run_id = '{TOKEN_RUN}' or run_id = '{REAL_RUN}'",
                 "--lake", source_lake.root)
    assert result.exit_code == 0 and result.output.startswith("2 episodes written as ATIF"), result.output
    assert len(out.read_text().splitlines()) == 2
    target = Lake.init(tmp_path / "copy")
    assert cli("import", str(out), "--lake", target.root).exit_code == 0
    want = [r for r in _steps(source_lake) if r["run_id"] in (TOKEN_RUN, REAL_RUN)]
    assert _steps(target) == want


def test_a_document_of_another_producer_lands_and_a_malformed_one_lands_nothing(tmp_path):
    good = _rfc_example()
    good["steps"].append({"step_id": 4, "source": "user", "message": "And Microsoft?"})
    good["steps"].append({"step_id": 5, "source": "agent", "message": "MSFT is at $410.", "llm_call_count": 1})
    good["steps"].append({"step_id": 6, "source": "agent", "message": "", "llm_call_count": 0,
                          "tool_calls": [{"tool_call_id": "t6", "function_name": "save", "arguments": {}}]})
    good["steps"].append({"step_id": 7, "source": "agent", "message": "Earlier answer.", "is_copied_context": True})
    # extras mean what their producer means: none of HALO's fields is read from them
    good["agent"]["extra"] = {"mode": 3, "policy": ["x"]}
    good["final_metrics"]["extra"] = {"terminated": "yes", "success": True}
    good["steps"][2]["metrics"].update(logprobs=[-0.1, -0.05, 0, -0.01], extra={"draw": "weird"})
    bad = _rfc_example()
    bad["steps"][2]["step_id"] = 7
    source = tmp_path / "harbor.jsonl"
    source.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    lake = Lake.init(tmp_path / "lake")
    result = cli("import", str(source), "--lake", lake.root)
    assert result.exit_code == 1
    assert error_line(result) == (f"Error: {source}:2: not a valid ATIF document: steps[2].step_id: expected 3 "
                                  "(sequential from 1), got 7")
    rows = _steps(lake)
    assert [(r["env"], r["run_id"], r["policy"], r["policy_version"], r["model"]) for r in rows] == [
        ("atif", "025B810F-B3A2-4C67-93C0-FE7A142A947A", "harbor-agent", "1.0.0", "gemini-2.5-flash")] * 4
    first, second, third, fourth = rows  # the copied-context step is no step of this episode
    assert (third["observation"], third["model_output"], third["action"]) == ("And Microsoft?", "MSFT is at $410.", None)
    assert (fourth["model_output"], fourth["action"]) == (None, "save({})")  # no model ran: nothing to imitate
    assert first["action"] == ('financial_search({"metric": "price", "ticker": "GOOGL"})\n'
                               'financial_search({"metric": "volume", "ticker": "GOOGL"})')
    assert first["goal"] == "What is the current trading price of Alphabet (GOOGL)?" and first["prompt_tokens"] == 520
    assert second["observation"] == "GOOGL is currently trading at $185.35 (Close: 10/11/2025)\nGOOGL volume: 1.5M shares traded."
    assert second["completion_token_ids"] == [1722, 310, 5533, 29889] and second["logprobs"] == [-0.1, -0.05, 0.0, -0.01]
    assert (second["success"], second["terminated"], second["mode"], second["draw"]) == (True, None, "imported", None)
    assert json.loads(second["extra"])["prompt_token_ids"] == [1, 2, 3]
    assert json.loads(second["prompt"])[-1]["content"].startswith("Goal: What is the current")
    assert second["state_hash"] and fourth["is_last"] and first["r_success"] is None  # no reward given: unknown
    assert cli("import", str(source), "--lake", lake.root).exit_code == 1 and len(_steps(lake)) == 4


def test_bad_input_is_one_line_and_leaves_the_lake_as_it_was(source_lake, tmp_path):
    versions = source_lake.versions()
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": "ATIF-v1.8", "agent": {"name": "x"}, "steps": [')
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"schema_version": "ATIF-v1.8", "agent": {"name": "x"},
                                   "steps": [{"step_id": 1, "source": "agent", "message": "hi"}]}))
    image = tmp_path / "image.json"
    doc = _rfc_example()
    doc["steps"][1]["observation"]["results"][0]["content"] = [{"type": "image", "source": {"media_type": "image/png", "path": "images/gone.png"}}]
    image.write_text(json.dumps(doc))
    for path, message in ((broken, f"{broken}:1: invalid JSON: Expecting value"),
                          (missing, f"{missing}: not a valid ATIF document: agent.version: required field missing"),
                          (image, f"{image}: steps[1]: image images/gone.png not found (looked in {tmp_path / 'images/gone.png'})")):
        result = cli("import", str(path), "--lake", source_lake.root)
        assert result.exit_code == 1 and error_line(result) == f"Error: {message}"
    result = cli("import", str(missing), "--format", "atiff", "--lake", source_lake.root)
    assert result.exit_code == 1 and error_line(result) == "Error: unknown import format 'atiff': use auto, agisdk, jsonl, atif, art"
    result = cli("export", "bc_rows", str(tmp_path / "x"), "--format", "arrow", "--lake", source_lake.root)
    assert result.exit_code == 1 and error_line(result) == "Error: unknown export format 'arrow': use jsonl, parquet, atif, hf, otel"
    result = cli("export", "mcts_pairs", str(tmp_path / "empty"), "--format", "hf", "--lake", source_lake.root)
    assert result.exit_code == 1 and error_line(result) == "Error: view mcts_pairs has no rows: nothing to export"
    result = cli("export", "--format", "atif", str(tmp_path / "none"), "--where", "task_id = 'nope'", "--lake", source_lake.root)
    assert result.exit_code == 1 and error_line(result) == "Error: no episodes to export: steps where task_id = 'nope' has no rows"
    assert not (tmp_path / "empty").exists() and not (tmp_path / "none").exists()
    assert source_lake.versions() == versions


# ---------------------------------------------------------------------- Hugging Face datasets
@pytest.fixture(scope="module")
def hf_exports(source_lake, tmp_path_factory):
    """Every view's export (and the steps table's), by name; an empty view's error instead of a folder."""
    from halo_data.hf_dataset import export_hf
    from halo_data.views import view_names

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in [*view_names(), "steps"]:
        try:
            out[name] = export_hf(source_lake, name, root / name)
        except LakeError as e:
            out[name] = str(e)
    return out


def test_every_view_exports_and_loads_with_its_features(hf_exports, source_lake, tmp_path):
    from datasets import Image, List, Value, load_dataset

    loaded = 0
    for name, export in hf_exports.items():
        if isinstance(export, str):
            assert export == f"view {name} has no rows: nothing to export"
            assert source_lake.query_arrow(f'select count(*) n from "{name}"').to_pylist()[0]["n"] == 0
            continue
        ds = load_dataset(str(export.output), cache_dir=str(tmp_path / "cache"))
        assert list(ds) == ["train"] and ds["train"].num_rows == export.total > 0
        assert ds["train"].features.to_dict() == export.features
        loaded += 1
    assert {"bc_rows", "dpo_pairs", "episodes", "screenshots", "steps"} <= {n for n, e in hf_exports.items() if not isinstance(e, str)}
    assert loaded >= 8
    steps = load_dataset(str(hf_exports["steps"].output), cache_dir=str(tmp_path / "cache"))["train"]
    features = steps.features
    assert features["completion_token_ids"] == List(Value("int64")) and features["logprobs"] == List(Value("float64"))
    assert features["screenshot"] == Image() and features["screenshot_after"] == Image()
    token_rows = steps.filter(lambda r: r["run_id"] == TOKEN_RUN).sort("step_idx")
    assert token_rows["completion_token_ids"][0] == [28, 3624, 940, 33, 19, 2] and token_rows["logprobs"][2] == [-2.0, 0.0, -0.5]
    real = steps.filter(lambda r: r["run_id"] == REAL_RUN)
    assert real[0]["screenshot"].size[0] > 100  # a PIL image of the page
    shots = load_dataset(str(hf_exports["screenshots"].output), cache_dir=str(tmp_path / "cache"))["train"]
    assert shots.features["image"] == Image() and shots[0]["image"].size == (shots[0]["width"], shots[0]["height"])


def test_the_card_states_lake_view_params_runs_rows_and_schema_and_splits_by_a_column(source_lake, tmp_path):
    out = tmp_path / "bc"
    result = cli("export", "bc_rows", str(out), "--format", "hf", "--split-by", "task_id", "--set", "top_percent=100",
                 "--lake", source_lake.root)
    assert result.exit_code == 0, result.output
    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    import yaml

    meta = yaml.safe_load(front)
    splits = {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]}
    rows = source_lake.query_arrow("select task_id, count(*) n from bc_rows group by 1", params={"top_percent": 100.0}).to_pylist()
    assert splits == {re.sub(r"[^A-Za-z0-9_]+", "_", r["task_id"]): r["n"] for r in rows}
    assert [c["path"] for c in meta["configs"][0]["data_files"]] == [f"data/{s}-*.parquet" for s in splits]
    for text in (f"| lake | `{source_lake.root}` |", "| view | `bc_rows` |", "| view parameters | top_percent=100.0 |",
                 "| split by | `task_id` |", f"| rows | {sum(splits.values())} (", "| `prompt` | `list<{role: string, content: string}>` |",
                 "| `success` | `bool` |"):
        assert text in card, text
    assert "| synthetic | rollout |" in card  # the runs, from the runs table
    from datasets import load_dataset

    ds = load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    assert {s: ds[s].num_rows for s in ds} == splits
    again = cli("export", "bc_rows", str(out), "--format", "hf", "--lake", source_lake.root)  # over an earlier export
    assert again.exit_code == 0 and sorted(p.name for p in (out / "data").iterdir()) == ["train-00000-of-00001.parquet"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    result = cli("export", "bc_rows", str(tmp_path / "other"), "--format", "hf", "--lake", source_lake.root)
    assert error_line(result) == f"Error: {tmp_path / 'other'} exists and is not a dataset folder halo-data wrote: choose a new OUTPUT"


def test_push_to_hub_without_a_token_is_one_line(source_lake, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hub, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hub, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    out = tmp_path / "dpo"
    result = cli("export", "dpo_pairs", str(out), "--format", "hf", "--push-to-hub", "someone/halo-dpo", "--lake", source_lake.root)
    assert result.exit_code == 1
    assert error_line(result) == ("Error: --push-to-hub someone/halo-dpo needs a Hugging Face token (set HF_TOKEN or run "
                                  f"`hf auth login`); the dataset is written at {out}")
    assert (out / "README.md").is_file()


def test_the_export_streams_batch_by_batch_into_the_same_dataset_and_fails_whole(tmp_path, monkeypatch):
    """Read three rows at a time, with shards of four: the same rows, features and images as one batch of all; a
    prompt that shows a screenshot only in a late batch still gives every row an ``images`` column; a failure midway
    leaves the earlier export as it was."""
    import dataclasses

    from datasets import Image, List, load_dataset

    from halo_data import hf_dataset
    from halo_data.synthetic import synthetic_png
    from halo_data.writer import Screenshot

    lake = Lake.init(tmp_path / "lake")
    writer = EpisodeWriter(lake)
    episode, steps = _token_episode()
    writer.write_episode(episode, steps)
    shots = [Screenshot.from_bytes(synthetic_png(seed, 24, 16)) for seed in range(3)]
    shown = [dataclasses.replace(s, prompt=prompts.dumps(prompts.with_screenshot(prompts.loads(s.prompt), shot.hash)),
                                 screenshot_hash=shot.hash) for s, shot in zip(steps, shots)]
    writer.write_episode(dataclasses.replace(episode, run_id="smollm2-screenshots", episode_id=None), shown, shots)
    writer.close()
    params = {"top_percent": 100.0}
    whole = hf_dataset.export_hf(lake, "bc_rows", tmp_path / "whole", params=params)
    streamed = hf_dataset.export_hf(lake, "bc_rows", tmp_path / "streamed", params=params, batch_rows=3, max_shard_rows=4)
    assert whole.rows == streamed.rows == {"train": 6} and whole.features == streamed.features
    assert streamed.shards == [f"data/train-0000{i}-of-00002.parquet" for i in range(2)]
    assert sorted(p.name for p in (tmp_path / "streamed" / "data").iterdir()) == [Path(s).name for s in streamed.shards]
    cache = str(tmp_path / "cache")
    a = load_dataset(str(tmp_path / "whole"), split="train", cache_dir=cache).sort(["run_id", "step_idx"])
    b = load_dataset(str(tmp_path / "streamed"), split="train", cache_dir=cache).sort(["run_id", "step_idx"])
    assert a.to_dict() == b.to_dict()
    images = [len(r) for r in b.sort(["run_id", "step_idx"])["images"]]
    assert sorted(images) == [0, 0, 0, 1, 1, 1] and b.features["images"] == List(Image())
    assert all(img.size == (24, 16) for row in b["images"] for img in row)
    card = (tmp_path / "streamed" / "README.md").read_text()
    assert "| smollm2-screenshots |" in card and f"| {TOKEN_RUN} |" in card and "| rows | 6 (train: 6) |" in card

    # One read decides the images column: text rows first, a screenshot in the second batch writes everything again
    # with it (the same dataset as above); a text-only export reads the view once.
    import halo_data.query

    reads, real_batches = [], halo_data.query.query_batches

    def text_first(lake_, sql, *args, **kwargs):
        reads.append(sql)
        return real_batches(lake_, f"select * from ({sql}) order by contains(prompt, 'image_ref')", *args, **kwargs)

    monkeypatch.setattr(halo_data.query, "query_batches", text_first)
    late = hf_dataset.export_hf(lake, "bc_rows", tmp_path / "late", params=params, batch_rows=3, max_shard_rows=4)
    assert len(reads) == 2 and late.rows == {"train": 6} and late.features == whole.features
    assert sorted(p.name for p in (tmp_path / "late" / "data").iterdir()) == [Path(s).name for s in late.shards]
    c = load_dataset(str(tmp_path / "late"), split="train", cache_dir=cache).sort(["run_id", "step_idx"])
    assert c.to_dict() == a.to_dict()
    reads.clear()
    text = hf_dataset.export_hf(lake, "bc_rows", tmp_path / "text", where=f"run_id = '{TOKEN_RUN}'", params=params, batch_rows=3)
    assert len(reads) == 1 and text.rows == {"train": 3} and "images" not in text.features
    monkeypatch.setattr(halo_data.query, "query_batches", real_batches)
    shutil.rmtree(tmp_path / "late"), shutil.rmtree(tmp_path / "text")

    before = sorted(p.name for p in (tmp_path / "streamed" / "data").iterdir())
    real = hf_dataset._dataset_table
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise LakeError("the lake went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_dataset, "_dataset_table", failing)
    with pytest.raises(LakeError, match="went away"):
        hf_dataset.export_hf(lake, "bc_rows", tmp_path / "streamed", params=params, batch_rows=3, max_shard_rows=2)
    assert sorted(p.name for p in (tmp_path / "streamed" / "data").iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "lake", "streamed", "whole"]


def test_trl_prepares_the_exported_bc_rows_and_dpo_pairs(hf_exports, tmp_path):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    from halo_train.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    base = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    common = {"output_dir": str(tmp_path / "out"), "max_steps": 1, "report_to": [], "per_device_train_batch_size": 2,
              "dataset_num_proc": None, "use_cpu": True, "save_strategy": "no"}
    bc = load_dataset(str(hf_exports["bc_rows"].output), split="train", cache_dir=str(tmp_path / "cache"))
    sft = SFTTrainer(model=model, args=SFTConfig(**common, completion_only_loss=True, max_length=None), train_dataset=bc,
                     processing_class=tokenizer)
    prepared = sft.train_dataset
    assert len(prepared) == len(bc) and {"input_ids", "labels"} <= set(prepared.column_names)
    # the loss is on the completion only: the prompt's tokens are masked (-100), the completion's are not
    assert all(labels[0] == -100 and labels[-1] != -100 for labels in prepared["labels"])
    pairs = load_dataset(str(hf_exports["dpo_pairs"].output), split="train", cache_dir=str(tmp_path / "cache"))
    dpo = DPOTrainer(model=model, args=DPOConfig(**common, max_length=None), train_dataset=pairs, processing_class=tokenizer)
    prepared = dpo.train_dataset
    assert len(prepared) == len(pairs), prepared.column_names
    assert {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(prepared.column_names), prepared.column_names
    assert all(p and c and c != r for p, c, r in zip(prepared["prompt_ids"], prepared["chosen_ids"], prepared["rejected_ids"]))


def test_the_formats_page_commands_run_as_printed(source_lake, tmp_path, monkeypatch):
    """docs/formats.md's commands, in order, on a lake at lake/: each exits 0 but the push, which has no token here."""
    import huggingface_hub.constants as hub
    from test_docs_commands import argv_of, bash_lines

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lake").symlink_to(source_lake.root)
    monkeypatch.delenv("HALO_LAKE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hub, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hub, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    _art_log(tmp_path / ".art" / "mail" / "models" / "agent-001" / "trajectories" / "train" / "0007.parquet", bad_row=False)
    page = Path(__file__).resolve().parent.parent / "docs" / "formats.md"
    commands = [argv_of(line) for line in bash_lines(page.read_text())]
    assert len(commands) >= 8 and all(c[0] == "halo-data" for c in commands)
    outputs = []
    for argv in commands:
        result = CliRunner().invoke(main, list(argv[1:]), prog_name="halo-data")
        if "--push-to-hub" in argv:
            assert error_line(result).startswith("Error: --push-to-hub your-name/halo-bc needs a Hugging Face token")
        else:
            assert result.exit_code == 0, (argv, result.output)
        outputs.append(result.output)
    assert "imported 0 episodes" in outputs[3]  # the successful episodes were all in the first import
    assert _steps(Lake.open(tmp_path / "lake-copy")) == _steps(source_lake)
    assert (tmp_path / "out" / "hf-steps" / "README.md").is_file()


def test_importing_a_missing_source_is_one_line(tmp_path):
    result = cli("import", str(tmp_path / "nowhere.json"), "--lake", str(tmp_path / "lake"))
    assert result.exit_code == 1 and error_line(result) == f"Error: {tmp_path / 'nowhere.json'} does not exist"
    assert not (tmp_path / "lake").exists()


def test_otel_export_is_one_genai_trace_per_episode_in_otlp_json(source_lake, tmp_path):
    out = tmp_path / "traces.jsonl"
    result = cli("export", "--format", "otel", str(out), "--lake", source_lake.root)
    assert result.exit_code == 0, result.output
    steps = _steps(source_lake)
    requests = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(requests) == len({r["episode_id"] for r in steps})

    def attrs(span):  # OTLP JSON: typed values, 64-bit integers as strings
        out = {}
        for a in span["attributes"]:
            (kind, value), = a["value"].items()
            assert kind in ("stringValue", "boolValue", "intValue", "doubleValue")
            out[a["key"]] = int(value) if kind == "intValue" else value
        return out

    by_conversation = {}
    for req in requests:
        (resource,) = req["resourceSpans"]
        (scope,) = resource["scopeSpans"]
        spans = scope["spans"]
        root = spans[0]
        assert root["name"] == "invoke_agent halo" and "parentSpanId" not in root
        for span in spans:
            assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"]) and span["traceId"] == root["traceId"]
            assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"]) and span["kind"] in (1, 3)
            assert int(span["startTimeUnixNano"]) < int(span["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
        assert all(s["parentSpanId"] == root["spanId"] for s in spans[1:])
        by_conversation[attrs(root)["gen_ai.conversation.id"]] = spans
    token_id = next(r["episode_id"] for r in steps if r["run_id"] == TOKEN_RUN)
    spans = by_conversation[token_id]
    assert [s["name"] for s in spans] == ["invoke_agent halo"] + ["chat smollm2-135m-instruct", "execute_tool browser_action"] * 3
    chat, tool = attrs(spans[1]), attrs(spans[2])
    assert (chat["gen_ai.operation.name"], chat["gen_ai.provider.name"], chat["gen_ai.usage.output_tokens"]) == ("chat", "hf", 6)
    assert [m["role"] for m in json.loads(chat["gen_ai.input.messages"])] == ["system", "user"]
    assert json.loads(chat["gen_ai.output.messages"])[0]["parts"][0]["content"] == "click('4')"
    assert (tool["gen_ai.tool.name"], tool["gen_ai.tool.call.id"], json.loads(tool["gen_ai.tool.call.arguments"])) == (
        "browser_action", "call_0", {"action": "click('4')"})
    assert attrs(spans[0])["halo.success"] is True
    real_id = next(r["episode_id"] for r in steps if r["run_id"] == REAL_RUN)
    assert {s["name"] for s in by_conversation[real_id]} == {"invoke_agent halo", "execute_tool browser_action"}  # random: no model


def _art_log(path: Path, bad_row: bool = True) -> None:
    """A trajectory log as ART's ``write_trajectory_groups_parquet`` writes one (its schema, one row per trajectory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string()),
                         ("tool_call_id", pa.string()), ("trainable", pa.bool_())])
    schema = pa.schema([("group_index", pa.int64()), ("group_metadata", pa.string()), ("group_metrics", pa.string()),
                        ("group_logs", pa.list_(pa.string())), ("reward", pa.float64()), ("metrics", pa.string()),
                        ("metadata", pa.string()), ("tools", pa.string()), ("logs", pa.list_(pa.string())),
                        ("messages", pa.list_(message))])

    def msg(role, content, trainable=False, tool_calls=None, tool_call_id=None):
        return {"role": role, "content": content, "trainable": trainable, "tool_call_id": tool_call_id,
                "tool_calls": json.dumps(tool_calls) if tool_calls else None}

    call = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "inbox"}'}}]
    rows = [
        {"group_index": 0, "reward": 1.0, "metrics": json.dumps({"turns": 2}), "metadata": json.dumps({"task_id": "mail-3"}),
         "messages": [msg("system", "You are an agent."), msg("user", "Find the newest mail."),
                      msg("assistant", None, True, call), msg("tool", "3 mails", tool_call_id="c1"),
                      msg("assistant", "The newest is from Ada.", True)]},
        {"group_index": 0, "reward": 0.0, "metadata": json.dumps({"task_id": "mail-3"}),
         "messages": [msg("user", "Find the newest mail."), msg("assistant", "No idea.", True)]},
        {"group_index": 1, "reward": 0.5, "messages": []},
    ][: 3 if bad_row else 2]
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")


def test_art_trajectory_logs_land_as_episodes_once(tmp_path):
    log = tmp_path / ".art" / "mail" / "models" / "agent-001" / "trajectories" / "train" / "0007.parquet"
    _art_log(log)
    lake = Lake.init(tmp_path / "lake")
    result = cli("import", str(tmp_path / ".art"), "--lake", lake.root)
    assert result.exit_code == 1 and error_line(result) == f"Error: {log}:row 2: no messages"
    rows = _steps(lake)
    assert {(r["run_id"], r["env"], r["task_id"], r["policy_version"], r["model"]) for r in rows} == {
        ("art-agent-001-train", "art", "mail-3", "0007", "agent-001")}
    good = [r for r in rows if r["task_reward"] == 1.0]
    assert [(r["action"], r["observation"], r["r_success"]) for r in good] == [
        ('search({"q": "inbox"})', "Find the newest mail.", None), ("The newest is from Ada.", "3 mails", 1.0)]
    assert [m["role"] for m in json.loads(good[1]["prompt"])] == ["system", "user", "assistant", "tool"]
    assert good[0]["goal"] == "Find the newest mail." and good[1]["r_progress"] is None
    assert sorted(r["attempt_idx"] for r in rows if r["step_idx"] == 0) == [0, 1]  # one group: attempts at one task
    versions = lake.versions()
    assert "imported 0 episodes" in cli("import", str(log), "--lake", lake.root).output and lake.versions() == versions
