"""Rollouts on real MiniWoB++ tasks in headless Chromium, into a real lake under tmp_path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo_data import ids, prompts
from halo_data.lake import Lake

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASKS = ["click-button", "click-checkboxes"]
ATTEMPTS = 4


def _config(lake: Path, run_id: str, **overrides):
    from halo_agent.rollout import RolloutConfig

    options = dict(
        env="miniwob", tasks=TASKS, rollouts_per_task=ATTEMPTS, policy="random", seed=3, task_seed=7,
        max_steps=5, lake=str(lake), run_id=run_id, progress=False,
    )
    options.update(overrides)
    return RolloutConfig(**options)


def _rows(lake: Path, sql: str, **params):
    return Lake.open(lake).query_arrow(sql, params).to_pylist()


@pytest.fixture(scope="module")
def rollout_lake(tmp_path_factory):
    """One in-process rollout: 2 tasks x 4 attempts."""
    from halo_agent.rollout import run_rollouts

    lake = tmp_path_factory.mktemp("rollout") / "lake"
    cfg = _config(lake, "r-one", policy_options={"api_key": "sk-verysecretvalue123"},
                  command="halo-agent rollout --api-key sk-verysecretvalue123 --tasks click-button")
    summary = run_rollouts(cfg)
    return lake, summary


def test_rollout_writes_exact_episodes_and_run_row(rollout_lake):
    lake, summary = rollout_lake
    assert (summary.status, summary.planned_episodes, summary.episodes_written, summary.env_errors) == ("finished", 8, 8, 0)
    episodes = _rows(lake, "select * from episodes where run_id = 'r-one' order by task_id, attempt_idx")
    assert [(e["task_id"], e["attempt_idx"]) for e in episodes] == [
        (f"miniwob.{t}", a) for t in sorted(TASKS) for a in range(ATTEMPTS)
    ]
    for e in episodes:
        assert e["episode_id"] == ids.episode_id("r-one", e["task_id"], 7, e["attempt_idx"])
        assert (e["env"], e["site"], e["policy"], e["mode"], e["seed"], e["task_seed"]) == ("miniwob", "miniwob", "random", "random", 3, 7)
        assert e["policy_version"] == "random-v1" and e["error"] is None
        assert 1 <= e["n_steps"] <= 5
        assert e["terminated"] or e["truncated"]
        assert e["success"] == (e["task_reward"] > 0)
    assert summary.successes == sum(e["success"] for e in episodes)

    run = _rows(lake, "select * from runs where run_id = 'r-one'")[0]
    assert (run["kind"], run["status"], run["planned_episodes"], run["env"]) == ("rollout", "finished", 8, "miniwob")
    assert run["ended_at"] is not None
    assert "sk-verysecretvalue123" not in run["command"] + run["config"] + run["provenance"]
    assert "--api-key [REDACTED]" in run["command"]
    provenance = json.loads(run["provenance"])
    assert "agisdk" in provenance["packages"] and "git_sha" in provenance
    assert json.loads(run["config"])["tasks"] == TASKS


def test_every_step_is_a_complete_record(rollout_lake):
    lake, _ = rollout_lake
    steps = _rows(lake, "select * from steps where run_id = 'r-one' order by episode_id, step_idx")
    shots = {r["hash"] for r in _rows(lake, "select hash from screenshots")}
    by_episode: dict[str, list[dict]] = {}
    for s in steps:
        by_episode.setdefault(s["episode_id"], []).append(s)
    for eid, rows in by_episode.items():
        assert [r["step_idx"] for r in rows] == list(range(len(rows)))
        assert rows[-1]["is_last"] and not any(r["is_last"] for r in rows[:-1])
        for i, r in enumerate(rows):
            assert r["prompt_hash"] == ids.sha256_hex(r["prompt"])
            assert r["prompt_version"] == prompts.PROMPT_VERSION
            messages = prompts.loads(r["prompt"])
            assert r["goal"] in messages[1]["content"] and r["url"] in messages[1]["content"]
            assert r["state_hash"] == ids.state_hash(r["url"], r["observation"])
            assert r["model_output"] == r["action"] and r["action_source"] == "random"
            assert r["screenshot_hash"] in shots and r["screenshot_after_hash"] in shots
            if i + 1 < len(rows):
                assert r["screenshot_after_hash"] == rows[i + 1]["screenshot_hash"]
            weights = json.loads(r["reward_weights"])
            shaped = sum((r[f"r_{k}"] or 0.0) * w for k, w in weights.items())  # NULL (not measured) counts 0
            assert r["reward"] == pytest.approx(shaped)
            assert r["env_ms"] > 0 and r["latency_ms"] >= 0
        assert rows[-1]["r_success"] == (1.0 if rows[0]["success"] else 0.0)


def test_views_build_training_data_from_the_rollout(rollout_lake):
    lake, _ = rollout_lake
    groups = _rows(lake, "select level, group_key, group_size from grpo_groups where run_id = 'r-one'")
    assert groups and {g["group_size"] for g in groups if g["level"] == "episode"} == {ATTEMPTS}
    pairs = _rows(lake, "select * from dpo_pairs where run_id = 'r-one'")
    assert pairs
    for p in pairs:
        assert p["chosen"] != p["rejected"]


def test_same_seeds_same_actions_with_two_workers(rollout_lake, tmp_path):
    """Two spawned workers, each with its own browser: same episodes, same actions as one worker."""
    from halo_agent.rollout import run_rollouts

    lake, _ = rollout_lake
    summary = run_rollouts(_config(lake, "r-two", workers=2))
    assert (summary.status, summary.episodes_written, summary.workers) == ("finished", 8, 2)

    def actions(run_id):
        rows = _rows(lake, "select task_id, attempt_idx, list(action order by step_idx) as actions, "
                           "list(state_hash order by step_idx) as states from steps "
                           "where run_id = $r group by all order by all", r=run_id)
        return [(r["task_id"], r["attempt_idx"], r["actions"], r["states"]) for r in rows]

    assert actions("r-two") == actions("r-one")


def test_a_rollout_that_writes_nothing_reports_no_lake_share(rollout_lake):
    """Resuming a complete run writes nothing: the summary says so, and gives no share of time to the lake."""
    from click.testing import CliRunner

    from halo_agent.cli import main

    lake, _ = rollout_lake
    args = ["rollout", "--env", "miniwob", "--tasks", ",".join(TASKS), "--rollouts-per-task", str(ATTEMPTS), "--seed", "3",
            "--task-seed", "7", "--max-steps", "5", "--lake", str(lake), "--run-id", "r-one", "--resume", "--no-progress"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert text.stdout.strip().splitlines()[-1] == (
        "r-one: finished, 0 episodes written (8 already in the lake, 8 planned), 0 successes, 0 env errors, 0 steps at 0.0 steps/s"
    )
    as_json = CliRunner().invoke(main, [*args, "--json"])
    summary = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert (summary["episodes_written"], summary["lake_share"]) == (0, None)
    assert _rows(lake, "select count(*) as n from episodes where run_id = 'r-one'")[0]["n"] == 8


def test_resuming_a_complete_run_builds_no_policy_and_keeps_its_record(rollout_lake, monkeypatch):
    """A finished run with every episode in the lake, resumed: nothing runs, no policy is built, and its runs row
    stays as it was. Changed plan options still stop the resume with the line that names them."""
    import importlib

    from halo_agent.rollout import RolloutError, run_rollouts

    lake, _ = rollout_lake
    before = _rows(lake, "select * from runs where run_id = 'r-one'")
    with monkeypatch.context() as m:
        def no_policy(config):
            raise AssertionError("a complete run builds no policy")

        m.setattr(importlib.import_module("halo_agent.rollout.run"), "policy_for", no_policy)
        summary = run_rollouts(_config(lake, "r-one", resume=True))
    assert (summary.status, summary.planned_episodes, summary.skipped_episodes, summary.episodes_written) == ("finished", 8, 8, 0)
    assert _rows(lake, "select * from runs where run_id = 'r-one'") == before
    with pytest.raises(RolloutError, match="with different rollouts_per_task than the run had"):
        run_rollouts(_config(lake, "r-one", resume=True, rollouts_per_task=ATTEMPTS + 1))
    assert _rows(lake, "select count(*) as n from episodes where run_id = 'r-one'")[0]["n"] == 8


class CrashingPolicy:
    """Random actions, except that the second episode crashes the page's renderer."""

    name = "random"
    model = None
    adapter = None
    policy_version = "crash-test"
    uses_screenshot = False

    def __init__(self, **options):
        from halo_agent.policies.random_policy import RandomPolicy

        self.inner = RandomPolicy(**options)
        self.episodes = 0

    def reset(self, seed):
        self.episodes += 1
        self.inner.reset(seed)

    def act(self, obs):
        from halo_agent.types import PolicyOutput

        if self.episodes == 2:
            return PolicyOutput(model_output="goto('chrome://crash')", action="goto('chrome://crash')", action_source="random")
        return self.inner.act(obs)

    def close(self):
        pass


def test_env_error_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    from halo_agent import policies
    from halo_agent.rollout import run_rollouts

    monkeypatch.setitem(policies.POLICIES, "crashing", (__name__, "CrashingPolicy"))
    lake = tmp_path / "lake"
    summary = run_rollouts(_config(lake, "r-crash", tasks=["click-button"], rollouts_per_task=3, policy="crashing"))
    assert (summary.status, summary.episodes_written, summary.env_errors) == ("finished", 3, 1)
    episodes = _rows(lake, "select attempt_idx, error, error_kind, n_steps, success from episodes order by attempt_idx")
    crashed = episodes[1]
    assert crashed["error_kind"] == "env" and "crash" in crashed["error"].lower()
    assert episodes[0]["error"] is None and episodes[2]["error"] is None
    assert episodes[2]["n_steps"] >= 1
    # the episode after the crash ran in a working browser: its page was read and acted on
    after = _rows(lake, "select action_valid from steps where attempt_idx = 2 order by step_idx")
    assert after and after[0]["action_valid"]


def _wait_for_episodes(lake: Path, run_id: str, at_least: int, proc: subprocess.Popen, timeout: float = 90.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the rollout exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        if (lake / "meta" / "info.json").exists():
            n = len(Lake.open(lake).episode_ids(run_id))
            if n >= at_least:
                return n
        time.sleep(0.2)
    raise AssertionError(f"no {at_least} episodes in {timeout}s")


def test_resume_after_sigkill_completes_exactly_the_missing_episodes(tmp_path):
    from click.testing import CliRunner

    from halo_agent.cli import main

    lake = tmp_path / "lake"
    args = ["rollout", "--env", "miniwob", "--tasks", "click-button,click-checkboxes,enter-text", "--rollouts-per-task", "3",
            "--max-steps", "4", "--seed", "1", "--lake", str(lake), "--run-id", "r-kill", "--flush-episodes", "1", "--no-progress"]
    cli = [sys.executable, "-m", "halo_agent.cli", *args]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        before = _wait_for_episodes(lake, "r-kill", 2, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    killed = _rows(lake, "select status, planned_episodes from runs where run_id = 'r-kill'")[0]
    assert killed == {"status": "running", "planned_episodes": 9}
    written_before = len(Lake.open(lake).episode_ids("r-kill"))
    assert before <= written_before < 9

    result = CliRunner().invoke(main, [*args, "--resume", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["skipped_episodes"] == written_before
    assert summary["episodes_written"] == 9 - written_before

    counts = _rows(lake, "select count(*) as episodes, count(distinct episode_id) as distinct_ids, sum(n_steps) as steps "
                         "from episodes where run_id = 'r-kill'")[0]
    assert counts["episodes"] == counts["distinct_ids"] == 9
    assert _rows(lake, "select count(*) as n from steps where run_id = 'r-kill'")[0]["n"] == counts["steps"]
    assert _rows(lake, "select status from runs where run_id = 'r-kill'")[0]["status"] == "finished"


from halo_agent.envs.miniwob import MiniWoBEnv  # noqa: E402


class FlakyMiniWoB(MiniWoBEnv):
    """MiniWoB++ whose first ``failures`` resets fail as a dead browser's do (an outage of the environment)."""

    failures = 0
    failed = 0

    def reset(self, task, task_seed):
        from halo_agent.envs.base import EnvError

        if FlakyMiniWoB.failed < FlakyMiniWoB.failures:
            FlakyMiniWoB.failed += 1
            raise EnvError(f"reset of {task.task_id} failed: Playwright connection closed")
        return super().reset(task, task_seed)


def test_a_reset_that_fails_is_retried_and_an_environment_that_cannot_start_stops_the_run(tmp_path, monkeypatch):
    """A failed reset is no attempt of the policy: retried in a fresh page, and when the environment cannot start
    the episode at all the run stops with one error, writes nothing for it, and --resume completes it."""
    from halo_agent import envs
    from halo_agent.rollout import run_rollouts
    from halo_agent.rollout.episode import RESET_ATTEMPTS, ResetFailedError

    monkeypatch.setitem(envs.ENVIRONMENTS, "miniwob", (__name__, "FlakyMiniWoB"))
    lake = tmp_path / "lake"
    monkeypatch.setattr(FlakyMiniWoB, "failures", RESET_ATTEMPTS - 1)
    monkeypatch.setattr(FlakyMiniWoB, "failed", 0)
    summary = run_rollouts(_config(lake, "r-flaky", tasks=["click-button"], rollouts_per_task=2))
    assert (summary.status, summary.episodes_written, summary.env_errors) == ("finished", 2, 0)
    assert FlakyMiniWoB.failed == RESET_ATTEMPTS - 1

    monkeypatch.setattr(FlakyMiniWoB, "failures", 10 * RESET_ATTEMPTS)
    monkeypatch.setattr(FlakyMiniWoB, "failed", 0)
    with pytest.raises(ResetFailedError, match=f"could not start miniwob.click-button .* in {RESET_ATTEMPTS} attempts"):
        run_rollouts(_config(lake, "r-down", tasks=["click-button"], rollouts_per_task=2))
    assert _rows(lake, "select count(*) as n from episodes where run_id = 'r-down'") == [{"n": 0}]
    assert _rows(lake, "select status from runs where run_id = 'r-down'") == [{"status": "failed"}]

    monkeypatch.setattr(FlakyMiniWoB, "failures", 0)
    resumed = run_rollouts(_config(lake, "r-down", tasks=["click-button"], rollouts_per_task=2, resume=True))
    assert (resumed.status, resumed.episodes_written, resumed.env_errors) == ("finished", 2, 0)
    assert _rows(lake, "select count(*) as n, count(error) as errors from episodes where run_id = 'r-down'") == [
        {"n": 2, "errors": 0}]
