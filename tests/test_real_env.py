"""The REAL path offline: agisdk's environment, registry and evaluators against a local GoMail clone.

The hosted REAL sites are unreachable here, so ``halo_agent.sites`` serves a GoMail
clone speaking the same ``/config`` + ``/finish`` contract. Episodes are scripted;
agisdk scores them: its JMESPath evals for HALO's local tasks, and for
``v2.gomail-18`` the Python eval script shipped in the agisdk package.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agisdk")

from halo_agent import registry  # noqa: E402
from halo_agent.envs.base import TaskSpec, UnknownTaskError  # noqa: E402
from halo_agent.envs.real import ChatLog, RealEnv, parse_site_urls  # noqa: E402
from halo_agent.sites import LOCAL_TASK_VERSION, LocalSite  # noqa: E402


@pytest.fixture
def restore_registry(tmp_path, monkeypatch):
    """Snapshots repoint agisdk's process-wide registry; put it back after each test."""
    from agisdk.REAL.browsergym.webclones import task_config

    monkeypatch.setenv("HALO_CACHE_DIR", str(tmp_path / "cache"))
    saved_dirs = dict(task_config.VERSION_DIRS)
    yield task_config
    for version in list(task_config.VERSION_DIRS):
        if version not in saved_dirs:
            del task_config.VERSION_DIRS[version]
    for version, path in saved_dirs.items():
        if task_config.VERSION_DIRS.get(version) != path:
            registry.register_task_version(version, path)


@pytest.fixture(scope="module")
def gomail_site():
    with LocalSite("gomail") as site:
        yield site


def _bid(page, name: str, kind: str | None = None) -> str:
    for element in page.elements:
        if element.name == name and (kind is None or element.kind == kind):
            return element.bid
    raise AssertionError(f"no element {name!r} on {page.url}: {[e.name for e in page.elements]}")


def _send_email(env: RealEnv, page, to: str, subject: str, body: str):
    outcomes = []
    for name, make in (
        ("Compose", lambda b: f"click('{b}')"),
        ("To", lambda b: f"fill('{b}', {to!r})"),
        ("Subject", lambda b: f"fill('{b}', {subject!r})"),
        ("Message Body", lambda b: f"fill('{b}', {body!r})"),
        ("Send", lambda b: f"click('{b}')"),
    ):
        outcome = env.step(make(_bid(page, name)))
        assert outcome.action_error is None, outcome.action_error
        assert not outcome.terminated and outcome.reward == 0.0
        page = outcome.page
        outcomes.append(outcome)
    return page, outcomes


# ----------------------------------------------------------------------------- episodes (real Chromium)


@pytest.mark.browser
@pytest.mark.slow
def test_v2_eval_script_scores_correct_1_and_wrong_0(gomail_site):
    """agisdk's own v2.gomail-18 ("Email Brian King ... meeting notes"), scored by eval_gomail_18.py."""
    env = RealEnv(site_urls={"gomail": gomail_site.url})
    try:
        task = registry.resolve_tasks(["v2.gomail-18"], RealEnv.list_tasks(task_version="v2"))[0]
        assert task.extra["evals"][0]["script"] == "eval_gomail_18.py" and task.site == "gomail"

        page = env.reset(task, task_seed=0)
        assert page.goal == task.goal and page.url.startswith(gomail_site.url)
        assert "button 'Compose'" in page.axtree and page.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
        assert page.extra["viewport"] == (1280, 720)
        page, _ = _send_email(env, page, "brian.king@example.com", "Meeting notes",
                              "Hi Brian, could you please send me the notes from our meeting?")
        assert "Message sent" in page.axtree
        final = env.step("send_msg_to_user('I emailed Brian King asking for the meeting notes.')")
        assert final.terminated and final.reward == 1.0 and final.raw_reward == 1.0
        # Headless, the chat is a message log (no second Chromium for a chat window): the answer scored is in it.
        assert isinstance(env._env.chat, ChatLog)
        answers = [m["message"] for m in env._env.chat.messages if m["role"] == "assistant"]
        assert answers[-1] == "I emailed Brian King asking for the meeting notes."
        added = final.info["env_state"]["differences"]["emails"]["added"]
        assert [e["to"] for e in added] == [["brian.king@example.com"]]

        # The same email to the wrong person: the script says FAILURE.
        page = env.reset(task, task_seed=0)
        assert "Message sent" not in page.axtree  # a fresh mailbox: /config reset the site
        page, _ = _send_email(env, page, "alice.chen@example.com", "Meeting notes",
                              "Hi Brian, could you please send me the notes from our meeting?")
        final = env.step("send_msg_to_user('Done.')")
        assert final.terminated and final.reward == 0.0
    finally:
        env.close()


@pytest.mark.browser
@pytest.mark.slow
def test_local_task_from_a_snapshot_jmespath_evals(gomail_site, tmp_path, restore_registry):
    """HALO's own registered task (version halo-local), run from a registry snapshot, scored by JMESPath evals."""
    snapshot_file = tmp_path / "local.json"
    registry.write_snapshot(snapshot_file, task_version=LOCAL_TASK_VERSION)
    env = RealEnv(site_urls=f"gomail={gomail_site.url}", task_registry=snapshot_file, max_steps=8)
    try:
        page = env.reset("gomail-local-1", task_seed=3)
        assert "Alice Chen" in page.goal
        page, _ = _send_email(env, page, "alice.chen@example.com", "Falcon kickoff", "Could we move the kickoff to Tuesday?")
        final = env.step("send_msg_to_user('Sent.')")
        assert final.terminated and final.reward == 1.0

        # Wrong: the Amazon email deleted instead of Uber's.
        page = env.reset("halo-local.gomail-local-2", task_seed=3)
        outcome = env.step(f"click('{_bid(page, 'Delete Your order has shipped')}')")
        assert outcome.action_error is None and "Conversation moved to Trash" in outcome.page.axtree
        final = env.step("send_msg_to_user('Deleted.')")
        assert final.terminated and final.reward == 0.0
        updated = final.info["env_state"]["differences"]["emails"]["updated"]
        assert [(e["id"], e["trash"]) for e in updated] == [("e4", True)]

        # A refused action is the action's error, not the environment's, and the episode goes on.
        page = env.reset("halo-local.gomail-local-2", task_seed=3)
        refused = env.step("click('99999')")
        assert "99999" in refused.action_error and not refused.terminated and refused.reward == 0.0
        env.step(f"click('{_bid(page, 'Delete Your Friday evening trip with Uber')}')")
        final = env.step("send_msg_to_user('Deleted the Uber receipt.')")
        assert final.terminated and final.reward == 1.0
    finally:
        env.close()


# ----------------------------------------------------------------------------- registry and snapshots


def test_v2_registry_lists_tasks_with_sites_goals_evals_and_a_split():
    tasks = registry.list_real_tasks("v2")
    assert len(tasks) >= 100
    assert all(t.env == "real" and t.task_version == "v2" and t.task_id.startswith("v2.") for t in tasks)
    assert all(t.goal and t.site and t.extra["evals"] and t.extra["url"].startswith("https://") for t in tasks)
    by_site: dict[str, set[str]] = {}
    for t in tasks:
        by_site.setdefault(t.site, set()).add(t.split)
    assert {"gomail", "omnizon", "gocalendar"} <= set(by_site)
    assert all(splits == {"train", "eval"} for site, splits in by_site.items() if sum(t.site == site for t in tasks) >= 2)
    n_eval = sum(t.split == "eval" for t in tasks)
    assert 0.15 * len(tasks) <= n_eval <= 0.3 * len(tasks)
    assert [t.split for t in registry.list_real_tasks("v2")] == [t.split for t in tasks]  # deterministic


def test_snapshot_round_trip_and_it_is_what_runs(tmp_path, restore_registry):
    task_config = restore_registry
    path = tmp_path / "real-v2.json"
    written = registry.write_snapshot(path, task_version="v2")
    loaded = registry.load_snapshot(path)
    assert loaded["n_tasks"] == len(loaded["tasks"]) == len(written["tasks"]) >= 100
    assert "eval_gomail_18.py" in loaded["eval_scripts"]
    assert registry.snapshot_tasks(loaded) == [TaskSpec.from_dict(t) for t in written["tasks"]]
    assert RealEnv.list_tasks(task_registry=path) == registry.snapshot_tasks(loaded)

    # Edit the snapshot: its goal and eval script, not the installed SDK's, are what runs.
    for task in loaded["tasks"]:
        if task["task_id"] == "v2.gomail-18":
            task["config"]["goal"] = "Email Brian King (snapshot edition)."
    loaded["eval_scripts"]["eval_gomail_18.py"] = "print('SUCCESS')\n"
    tasks = registry.use_snapshot(loaded)
    assert len(tasks) == loaded["n_tasks"]
    config = task_config.TaskConfig("gomail-18", "v2")
    assert config.get_goal() == "Email Brian King (snapshot edition)."
    assert (config.eval_scripts_dir and open(f"{config.eval_scripts_dir}/eval_gomail_18.py").read()) == "print('SUCCESS')\n"
    from agisdk.REAL.browsergym.webclones.evaluate import WebCloneEvaluator

    reward, *_ = WebCloneEvaluator(config).evaluate(env_state={}, model_response="")
    assert reward == 1.0


def test_local_tasks_are_registered_like_agisdk_tasks(restore_registry):
    import gymnasium as gym

    names = registry.register_local_tasks()
    assert names == ["gomail-local-1", "gomail-local-2"]
    assert "halo-local.gomail-local-1" in restore_registry.TASK_INDEX
    assert "browsergym/halo-local.gomail-local-1" in gym.registry
    local = registry.list_real_tasks(LOCAL_TASK_VERSION)
    assert {t.site for t in local} == {"gomail"} and {t.split for t in local} == {"train", "eval"}


def test_snapshot_errors_are_one_line(tmp_path):
    with pytest.raises(registry.RegistryError, match="does not exist: write one with"):
        registry.load_snapshot(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(registry.RegistryError, match="not a HALO REAL task registry snapshot"):
        registry.load_snapshot(bad)
    with pytest.raises(registry.RegistryError, match="unknown REAL task version 'v9'"):
        registry.list_real_tasks("v9")
    with pytest.raises(UnknownTaskError, match="unknown REAL task 'gomail-999'"):
        registry.resolve_tasks(["gomail-999"], registry.list_real_tasks("v2"))


def test_site_urls():
    assert parse_site_urls("gomail=http://127.0.0.1:8377/, omnizon=https://shop.example") == {
        "gomail": "http://127.0.0.1:8377",
        "omnizon": "https://shop.example",
    }
    with pytest.raises(ValueError, match="SITE=URL"):
        parse_site_urls("gomail")
    with pytest.raises(ValueError, match="http"):
        parse_site_urls({"gomail": "ftp://x"})


@pytest.mark.browser
@pytest.mark.slow
def test_the_random_policy_answers_so_every_real_episode_is_scored(gomail_site, tmp_path):
    """Random clicking on v2.gomail-18 ends with send_msg_to_user (at the latest on the last step): agisdk scores it."""
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake

    summary = run_rollouts(RolloutConfig(env="real", tasks=["v2.gomail-18"], rollouts_per_task=2, policy="random", max_steps=3,
                                         env_options={"site_urls": {"gomail": gomail_site.url}}, lake=str(tmp_path / "lake"),
                                         run_id="random-real", progress=False))
    assert summary.episodes_written == 2 and summary.env_errors == 0
    last = Lake.open(tmp_path / "lake").query_arrow(
        "select action, terminated, truncated, task_reward, extra from steps where is_last order by attempt_idx").to_pylist()
    assert [(s["action"], s["terminated"], s["truncated"]) for s in last] == [("send_msg_to_user('Done.')", True, False)] * 2
    assert all(s["task_reward"] == 0.0 and "differences" in json.loads(s["extra"])["env_info"]["env_state"] for s in last)
