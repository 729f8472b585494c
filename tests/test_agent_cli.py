"""``halo-agent`` commands against real MiniWoB++ tasks and a real lake."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from halo_agent.cli import main
from halo_data.lake import Lake


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_tasks_lists_miniwob():
    result = invoke("tasks", "--env", "miniwob")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) >= 100
    assert "miniwob.click-button\tminiwob\tall" in lines


def test_tasks_subset_json_and_snapshot(tmp_path):
    result = invoke("tasks", "--subset", "smoke", "--json")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"miniwob.click-test", "miniwob.enter-text"} <= {r["task_id"] for r in rows}
    snapshot = tmp_path / "tasks.json"
    result = invoke("tasks", "--env", "miniwob", "--snapshot", snapshot)
    assert result.exit_code == 0
    data = json.loads(snapshot.read_text())
    assert data["env"] == "miniwob" and len(data["tasks"]) >= 100


def test_bad_task_id_is_one_error_line_and_writes_nothing(tmp_path):
    lake = tmp_path / "lake"
    result = invoke("rollout", "--tasks", "click-button,no-such-task", "--lake", lake)
    assert result.exit_code == 1
    assert result.stderr == "Error: unknown miniwob task 'no-such-task': list them with `halo-agent tasks --env miniwob`\n"
    assert not lake.exists()


def test_bad_options_are_one_error_line(tmp_path):
    result = invoke("rollout", "--rollouts-per-task", "0", "--lake", tmp_path / "lake")
    assert (result.exit_code, result.stderr) == (1, "Error: --rollouts-per-task must be at least 1\n")
    result = invoke("eval", "--modes", "nope", "--tasks", "click-test", "--lake", tmp_path / "lake")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: unknown mode(s) nope: known modes are ")
    assert len(result.stderr.splitlines()) == 1


def test_a_plain_file_as_lake_is_one_error_line(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("not a lake")
    for command in (["rollout"], ["eval", "--modes", "random"]):
        result = invoke(*command, "--tasks", "click-test", "--lake", plain)
        assert (result.exit_code, result.stdout, result.stderr) == (
            1, "", f"Error: {plain} is a file, not a lake: a lake is a folder (`halo-data init PATH` creates one)\n")
    assert plain.read_text() == "not a lake"


def test_the_quickstart_moved_to_halo_train():
    from halo_data.cli_support import script_command

    result = invoke("quickstart", "--lake", "lake", "--train-steps", 1)
    assert (result.exit_code, result.stderr) == (
        1, f"Error: the quickstart is a halo-train command now: {script_command('halo-train', 'quickstart')}\n")


def test_list_modes_and_user_modes_file(tmp_path):
    result = invoke("eval", "--list-modes")
    names = {line.split("\t")[0] for line in result.stdout.splitlines()}
    assert {"random", "gpt4o_baseline", "qwen_worker_zero", "qwen_worker_bc", "qwen_worker_dpo", "qwen3vl_base", "qwen3vl_grpo"} <= names
    extra = tmp_path / "modes.yaml"
    extra.write_text("modes:\n  greedy_random:\n    policy: random\n    temperature: 0\n    description: first action\n")
    result = invoke("eval", "--list-modes", "--modes-file", extra)
    assert "greedy_random\trandom\t\t\tfirst action" in result.stdout.splitlines()


@pytest.mark.browser
@pytest.mark.slow
def test_rollout_then_eval_into_one_lake(tmp_path):
    lake = tmp_path / "lake"
    result = invoke("rollout", "--tasks", "click-test", "--rollouts-per-task", 2, "--max-steps", 3, "--lake", lake,
                    "--run-id", "cli-r", "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["status"], summary["episodes_written"]) == ("finished", 2)

    again = invoke("rollout", "--tasks", "click-test", "--lake", lake, "--run-id", "cli-r", "--no-progress")
    assert again.exit_code == 1
    assert again.stderr == f"Error: run 'cli-r' already exists in {lake}: pass --resume to complete it, or choose another --run-id\n"
    changed = invoke("rollout", "--tasks", "click-button", "--rollouts-per-task", 2, "--lake", lake, "--run-id", "cli-r", "--resume")
    assert changed.exit_code == 1 and "different tasks" in changed.stderr

    result = invoke("eval", "--modes", "random", "--tasks", "click-test", "--rollouts-per-task", 2, "--max-steps", 3,
                    "--lake", lake, "--run-id", "cli-e", "--no-progress")
    assert result.exit_code == 0, result.output
    l = Lake.open(lake)
    run = l.query_arrow("select kind, mode, status, split from runs where run_id = 'cli-e-random'").to_pylist()
    assert run == [{"kind": "eval", "mode": "random", "status": "finished", "split": "all"}]
    matrix = l.query_arrow("select * from eval_matrix").to_pylist()
    assert any(r.get("mode") == "random" and r.get("site") == "miniwob" for r in matrix)


@pytest.mark.browser
def test_verify_exploration_reports_a_difference():
    result = invoke("verify-exploration", "--task", "click-checkboxes", "--temperature-a", 0, "--temperature-b", 0.7,
                    "--compare-steps", 4, "--task-seed", 2, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["differ"] is True
    assert report["actions_a"] != report["actions_b"]
    # temperature 0 is greedy: the same first action whatever the seed
    again = json.loads(invoke("verify-exploration", "--task", "click-checkboxes", "--temperature-a", 0, "--temperature-b", 0,
                              "--compare-steps", 4, "--task-seed", 2, "--seed", 9, "--json").stdout)
    assert again["differ"] is False and again["actions_a"] == report["actions_a"]
