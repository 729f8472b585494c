"""``halo-data import``: agisdk result folders (written by agisdk's own code) and per-episode JSONL files."""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from halo_data import ids, prompts
from halo_data.cli import main
from halo_data.importers import import_sources, load_pickle
from halo_data.lake import Lake


def png(width: int, height: int, shade: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.fixture()
def lake(tmp_path):
    return Lake.init(tmp_path / "lake")


# ---------------------------------------------------------------------- agisdk folders
@pytest.fixture(scope="module")
def agisdk_loop():
    return pytest.importorskip("agisdk.REAL.browsergym.experiments.loop")


AXTREE = ["RootWebArea 'Omnizon'\n\t[12] searchbox 'Search'\n\t[13] button 'Go'",
          "RootWebArea 'Results'\n\t[40] link 'Laptop'",
          "RootWebArea 'Laptop'\n\t[51] button 'Buy'"]
URLS = ["http://omnizon.local/", "http://omnizon.local/search?q=laptop", "http://omnizon.local/item/1"]
ACTIONS = ["fill('12', 'laptop')", "click('40')", None]


def write_agisdk_result(loop, results: Path, task_name: str, seed: int, *, success: bool, pickles: bool = True,
                        error: str | None = None, same_page_shot: bool = False) -> Path:
    """One experiment folder exactly as agisdk's ExpArgs.run leaves it, written by agisdk's own functions."""
    import numpy as np

    from agisdk.REAL.browsergym.experiments.agent import AgentInfo

    folder = results / f"2025-01-02_03-04-05_DemoAgentArgs_on_{task_name}_{seed}_{'ab' * 16}"
    folder.mkdir(parents=True)
    (folder / "summary_info.json").write_text(json.dumps({  # what the harness writes before the run
        "task_name": task_name, "agent_type": "DemoAgentArgs", "model_name": "gpt-4o", "max_steps": 25,
        "cache_key": f"{task_name}_DemoAgentArgs_gpt-4o_25", "experiment_status": "started", "run_uuid": "run-0001",
    }, indent=4))
    episode_info = []
    for n in range(3):
        info = loop.StepInfo(step=n)
        info.obs = {
            "chat_messages": [{"role": "user", "message": "Buy a laptop"}],
            "goal_object": [{"type": "text", "text": "Buy a laptop"}],
            "last_action": ACTIONS[n - 1] if n else "",
            "last_action_error": "element 40 is not visible" if n == 2 else "",
            "axtree_txt": AXTREE[n],
            "pruned_html": "<html></html>",
            "open_pages_urls": URLS[: n + 1],
            "active_page_index": np.array([n]),
            "screenshot": np.full((4, 6, 3), 30 if same_page_shot else 10 * n, dtype=np.uint8),
        }
        info.action = ACTIONS[n]
        info.reward = 1.0 if (n == 2 and success) else 0.0
        info.raw_reward = info.reward
        info.terminated = n == 2
        info.truncated = False
        info.agent_info = AgentInfo(think="I should search", chat_messages=[
            {"role": "assistant", "message": f"```{ACTIONS[n]}```"}]) if ACTIONS[n] else {}
        info.profiling = loop.StepTimestamps(env_start=100.0 + n, env_stop=100.5 + n, agent_start=101.0 + n,
                                             agent_stop=101.25 + n)
        if n == 2:
            info.task_info = {"env_state": {"cart": ["laptop"] if success else []}, "local_reward": info.reward}
        info.save_step_info(folder, save_screenshot=True, save_pkl=pickles)
        episode_info.append(info)
    loop._save_summary_info(episode_info, folder, error, "Traceback ..." if error else None)
    return folder


def test_agisdk_folder_with_step_pickles_and_screenshots(agisdk_loop, lake, tmp_path):
    results = tmp_path / "results"
    folder = write_agisdk_result(agisdk_loop, results, "v2.omnizon-1", 42, success=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        "finish_state.json", "goal_object.pkl.gz", "screenshot_step_0.png", "screenshot_step_1.png",
        "screenshot_step_2.png", "step_0.pkl.gz", "step_1.pkl.gz", "step_2.pkl.gz", "summary_info.json"]
    report = import_sources(lake, [results])
    assert (report.episodes, report.steps, report.screenshots, report.failures) == (1, 2, 3, [])
    assert report.run_ids == ["agisdk-run-0001"]
    eid = ids.episode_id("agisdk-run-0001", "v2.omnizon-1", 42, 0)
    got = lake.query_arrow("select * from steps order by step_idx").to_pylist()
    assert [(r["episode_id"], r["step_idx"], r["url"], r["action"], r["model_output"], r["action_valid"],
             r["action_error"], r["r_success"], r["latency_ms"], r["env_ms"]) for r in got] == [
        (eid, 0, URLS[0], ACTIONS[0], f"```{ACTIONS[0]}```", True, None, 0.0, 250.0, 500.0),
        (eid, 1, URLS[1], ACTIONS[1], f"```{ACTIONS[1]}```", False, "element 40 is not visible", 1.0, 250.0, 500.0),
    ]
    first = got[0]
    assert (first["run_id"], first["env"], first["task_id"], first["site"], first["task_version"], first["task_seed"],
            first["model"], first["success"], first["task_reward"], first["n_steps"], first["terminated"]) == (
        "agisdk-run-0001", "real", "v2.omnizon-1", "omnizon", "v2", 42, "gpt-4o", True, 1.0, 2, True)
    assert first["goal"] == "Buy a laptop" and first["observation"] == AXTREE[0]
    assert first["state_hash"] == ids.state_hash(URLS[0], AXTREE[0])
    assert first["prompt"] == prompts.dumps(prompts.render_messages("Buy a laptop", URLS[0], AXTREE[0],
                                                                    screenshot_hash=first["screenshot_hash"]))
    assert json.loads(got[1]["prompt"])[1]["content"].count(f"- {ACTIONS[0]}") == 1   # history
    assert got[0]["screenshot_after_hash"] == got[1]["screenshot_hash"]
    extra = json.loads(got[1]["extra"])["agisdk"]
    assert extra["finish_state"] == {"env_state": {"cart": ["laptop"]}, "local_reward": 1.0}
    shots = lake.query_arrow("select width, height, format from screenshots").to_pylist()
    assert shots == [{"width": 6, "height": 4, "format": "png"}] * 3
    runs = lake.query_arrow("select run_id, kind, mode, status from runs").to_pylist()
    assert runs == [{"run_id": "agisdk-run-0001", "kind": "rollout", "mode": "agisdk", "status": "finished"}]
    # importing again adds nothing: the ids are deterministic
    again = import_sources(lake, [results])
    assert (again.episodes, again.skipped) == (0, 1)
    assert lake.query_arrow("select count(*) from steps").column(0)[0].as_py() == 2


def test_agisdk_folders_without_pickles_attempts_and_errors(agisdk_loop, lake, tmp_path):
    results = tmp_path / "results"
    write_agisdk_result(agisdk_loop, results / "a", "v2.gomail-3", 7, success=False, pickles=False,
                        error="Exception uncaught by agent or environment in task v2.gomail-3.\nTimeoutError:\nslow")
    write_agisdk_result(agisdk_loop, results / "b", "v2.gomail-3", 7, success=True, pickles=False)
    report = import_sources(lake, [results], run_id="old-agisdk")
    assert (report.episodes, report.steps, report.failures) == (2, 2, [])
    got = lake.query_arrow("select attempt_idx, n_steps, success, error, error_kind, r_success, action, prompt is not null "
                           "as has_prompt from steps order by attempt_idx").to_pylist()
    assert got == [
        {"attempt_idx": 0, "n_steps": 1, "success": False, "error": "slow", "error_kind": "env", "r_success": 0.0,
         "action": None, "has_prompt": True},
        {"attempt_idx": 1, "n_steps": 1, "success": True, "error": None, "error_kind": None, "r_success": 1.0,
         "action": None, "has_prompt": True},
    ]


def test_agisdk_malformed_summary_is_reported_and_the_rest_imports(agisdk_loop, lake, tmp_path):
    results = tmp_path / "results"
    good = write_agisdk_result(agisdk_loop, results, "v2.omnizon-1", 1, success=True)
    bad = write_agisdk_result(agisdk_loop, results / "x", "v2.omnizon-2", 2, success=True)
    (bad / "summary_info.json").write_text('{\n  "task_name": "v2.omnizon-2",\n  "success": tru\n}')
    broken = write_agisdk_result(agisdk_loop, results / "y", "v2.omnizon-3", 3, success=True)
    (broken / "step_1.pkl.gz").write_bytes((broken / "step_1.pkl.gz").read_bytes()[:40])
    mistyped = write_agisdk_result(agisdk_loop, results / "z", "v2.omnizon-4", 4, success=True)
    summary = json.loads((mistyped / "summary_info.json").read_text())
    (mistyped / "summary_info.json").write_text(json.dumps({**summary, "terminated": "yes"}))
    report = import_sources(lake, [results])
    assert report.episodes == 1
    assert report.failures[0] == f"{bad}/summary_info.json:3: invalid JSON: Expecting value"
    assert report.failures[1].startswith(f"{broken}/step_1.pkl.gz: cannot read pickle: ")
    # a field the step record refuses is reported where it was read, like any malformed source
    assert report.failures[2] == f"{mistyped}/summary_info.json: episode field 'terminated' must be bool, got str 'yes'"
    assert len(report.failures) == 3
    assert lake.query_arrow("select distinct task_id from steps").to_pylist() == [{"task_id": "v2.omnizon-1"}]
    assert good.exists()


def test_restricted_unpickler_runs_no_code(tmp_path):
    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    path = tmp_path / "step_0.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump({"obs": Evil()}, f)
    loaded = load_pickle(path)
    assert not (tmp_path / "pwned").exists()
    assert type(loaded["obs"]).__name__ == "system"


# ---------------------------------------------------------------------- JSONL trajectories
def jsonl_episode(path: Path, task_id="miniwob.click-button", seed=3, success=True, temperature=0.7, run="old-run",
                  n_steps=2) -> Path:
    shot = base64.b64encode(png(5, 3, 99)).decode()
    records = [{"type": "episode_start", "task_id": task_id, "task_seed": seed, "worker_temperature": temperature,
                "model": "qwen-0.5b", "run": run, "policy": "hf", "host": "node-7"}]
    for i in range(n_steps):
        last = i == n_steps - 1
        records.append({"type": "step", "step": i, "url": "http://localhost/click-button.html", "goal": "Click OK",
                        "axtree": f"RootWebArea\n\t[{i + 4}] button 'OK'", "model_output": f"I click\nclick('{i + 4}')",
                        "action": f"click('{i + 4}')", "reward": 1.0 if (last and success) else 0.0,
                        "progress": 1.0 if last and success else 0.5, "screenshot": shot, "done": last,
                        "success": success if last else False, "latency_ms": 12.5, "tab": i})
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_jsonl_episode(lake, tmp_path):
    src = tmp_path / "old"
    src.mkdir()
    jsonl_episode(src / "ep1.jsonl")
    jsonl_episode(src / "ep2.jsonl", success=False)
    report = import_sources(lake, [src])
    assert (report.episodes, report.steps, report.screenshots, report.failures) == (2, 4, 1, [])
    got = lake.query_arrow("select * from steps order by attempt_idx, step_idx").to_pylist()
    assert [(r["run_id"], r["attempt_idx"], r["step_idx"], r["success"], r["temperature"], r["model"], r["policy"],
             r["task_seed"], r["env"], r["site"], r["r_progress"], r["r_success"], r["cumulative_progress"])
            for r in got] == [
        ("old-run", 0, 0, True, 0.7, "qwen-0.5b", "hf", 3, "miniwob", "miniwob", 0.5, 0.0, 0.5),
        ("old-run", 0, 1, True, 0.7, "qwen-0.5b", "hf", 3, "miniwob", "miniwob", 0.5, 1.0, 1.0),
        ("old-run", 1, 0, False, 0.7, "qwen-0.5b", "hf", 3, "miniwob", "miniwob", 0.5, 0.0, 0.5),
        ("old-run", 1, 1, False, 0.7, "qwen-0.5b", "hf", 3, "miniwob", "miniwob", 0.0, 0.0, 0.5),
    ]
    step = got[0]
    obs = "RootWebArea\n\t[4] button 'OK'"
    assert step["observation"] == obs and step["model_output"] == "I click\nclick('4')"
    assert step["state_hash"] == ids.state_hash("http://localhost/click-button.html", obs)
    assert step["state_hash"] == got[1]["state_hash"]   # only the element id differs
    assert step["prompt"] == prompts.dumps(prompts.render_messages("Click OK", "http://localhost/click-button.html", obs,
                                                                   screenshot_hash=ids.image_hash(png(5, 3, 99))))
    assert json.loads(step["extra"]) == {"tab": 0, "episode_start": {"host": "node-7"}}
    assert lake.query_arrow("select count(*) from screenshots_all").column(0)[0].as_py() == 1


@pytest.mark.parametrize("lines, message", [
    (['{"type": "step", "step": 0}'], ':1: the first record must be {"type": "episode_start", ...}'),
    (['{"type": "episode_start", "task_id": "t"}', '{"step": 0, "action": "noop()"', ],
     ":2: invalid JSON: Expecting ',' delimiter"),
    (['{"type": "episode_start", "task_id": "t"}', '{"step": 1}'], ":2: step 1 out of order, expected step 0"),
    (['{"type": "episode_start", "task_id": "t"}', '{"step": 0, "reward": "high"}'],
     ":2: reward must be a number, got 'high'"),
    (['{"type": "episode_start", "task_id": "t"}', '{"step": 0}', '{"step": 1, "screenshot": "@@@"}'],
     ":3: screenshot is not valid base64"),
    (['{"type": "episode_start", "task_id": "t"}'], ":1: no step records"),
    (['{"type": "episode_start"}'], ":1: episode_start needs a task_id string"),
    (['{"type": "episode_start", "task_id": "t"}', '{"type": "stop", "step": 0}'],
     ":2: unknown record type 'stop' (episode_start, step or episode_end)"),
    (['[1, 2]'], ":1: expected a JSON object, got list"),
])
def test_malformed_jsonl_reports_file_and_line_and_imports_nothing_of_it(lake, tmp_path, lines, message):
    src = tmp_path / "old"
    src.mkdir()
    good = jsonl_episode(src / "a_good.jsonl")
    bad = src / "b_bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    report = import_sources(lake, [good, bad])
    assert report.failures == [f"{bad}{message}"]
    assert report.episodes == 1
    assert lake.query_arrow("select count(distinct episode_id) from steps").column(0)[0].as_py() == 1


def test_cli_import_exit_codes_and_messages(lake, tmp_path):
    src = tmp_path / "old"
    src.mkdir()
    jsonl_episode(src / "a.jsonl")
    (src / "b.jsonl").write_text('{"type": "episode_start", "task_id": "t"}\n{"step": 0, "reward": }\n')
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(src), "--lake", lake.root])
    assert result.exit_code == 1
    assert result.stdout == f"imported 1 episodes (2 steps) into {lake.root}\n"
    assert result.stderr == f"Error: {src}/b.jsonl:2: invalid JSON: Expecting value\n"
    (src / "b.jsonl").unlink()
    again = runner.invoke(main, ["import", str(src), "--lake", lake.root, "--run-id", "other"])
    assert (again.exit_code, again.stdout) == (0, f"imported 1 episodes (2 steps) into {lake.root}\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = runner.invoke(main, ["import", str(empty), "--lake", lake.root])
    assert nothing.exit_code == 1
    assert nothing.stderr == (f"Error: nothing to import in {empty}: expected agisdk result folders "
                              "(summary_info.json) or per-episode .jsonl files\n")
    bad_run = runner.invoke(main, ["import", str(src), "--lake", lake.root, "--run-id", "a b"])
    assert bad_run.exit_code == 1
    assert bad_run.stderr.startswith("Error: invalid run id 'a b': use letters")
