"""MiniWoB++ inside agisdk's BrowserGym, in real headless Chromium: seeding, observations, MiniWoB's own rewards."""

from __future__ import annotations

import re
import time

import pytest

from halo_data import ids

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def env():
    from halo_agent.envs.miniwob import MiniWoBEnv

    e = MiniWoBEnv(headless=True)
    yield e
    e.close()


def _spec(name):
    from halo_agent.envs.miniwob import MiniWoBEnv

    return MiniWoBEnv.task_spec(name)


def test_tasks_are_registered_with_agisdk():
    import gymnasium as gym
    from agisdk.REAL.browsergym.webclones import task_config

    from halo_agent.envs.miniwob import MiniWoBEnv, MiniWoBTask

    tasks = MiniWoBEnv.list_tasks()
    assert len(tasks) >= 100
    assert {"miniwob.click-button", "miniwob.enter-text", "miniwob.click-test"} <= {t.task_id for t in tasks}
    assert all(t.site == "miniwob" and t.env == "miniwob" for t in tasks)
    assert all(f"browsergym/{t.task_id}" in gym.registry for t in tasks)
    assert "miniwob" in task_config.VERSION_DIRS
    assert MiniWoBTask(seed=0, subdomain="click-test").task_id == "miniwob.click-test"
    with pytest.raises(ValueError, match="unknown MiniWoB task"):
        MiniWoBTask(seed=0, subdomain="no-such-task")


def test_same_seed_same_instance_across_resets(env):
    first = env.reset(_spec("click-button"), task_seed=11)
    env.step("noop(0)")
    second = env.reset(_spec("click-button"), task_seed=11)
    assert second.goal == first.goal
    assert second.axtree == first.axtree
    assert ids.state_hash(second.url, second.axtree) == ids.state_hash(first.url, first.axtree)
    assert second.screenshot == first.screenshot
    goals = {env.reset(_spec("click-button"), task_seed=s).goal for s in (1, 2, 3, 4)}
    assert len(goals) > 1, "different seeds should give different instances"


def test_state_hash_is_the_same_with_a_fresh_context(env):
    from halo_agent.envs.miniwob import MiniWoBEnv

    fresh = MiniWoBEnv(isolation="context")
    try:
        a = fresh.reset(_spec("enter-text"), task_seed=5)
        b = fresh.reset(_spec("enter-text"), task_seed=5)
    finally:
        fresh.close()
    c = env.reset(_spec("enter-text"), task_seed=5)
    assert ids.state_hash(a.url, a.axtree) == ids.state_hash(b.url, b.axtree) == ids.state_hash(c.url, c.axtree)


def test_observation_is_browsergym_format(env):
    page = env.reset(_spec("click-button"), task_seed=3)
    assert page.url.startswith("file://") and page.url.endswith("/click-button.html")
    assert page.goal.startswith("Click on the")
    assert re.search(r"\[\d+\] button '", page.axtree)
    assert page.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    kinds = {e.kind for e in page.elements}
    assert "click" in kinds
    for e in page.elements:
        assert f"[{e.bid}]" in page.axtree


def test_click_button_scored_by_miniwob(env):
    page = env.reset(_spec("click-button"), task_seed=3)
    wanted = re.search(r'"(.+)"', page.goal).group(1)
    right = next(e for e in page.elements if e.role == "button" and e.name == wanted)
    wrong = next(e for e in page.elements if e.role == "button" and e.name != wanted)

    out = env.step(f"click('{right.bid}')")
    assert (out.reward, out.terminated, out.raw_reward, out.action_error) == (1.0, True, 1.0, None)
    assert out.info["done"] is True

    env.reset(_spec("click-button"), task_seed=3)
    out = env.step(f"click('{wrong.bid}')")
    assert (out.reward, out.terminated, out.raw_reward) == (0.0, True, -1.0)


def test_enter_text_and_action_errors(env):
    page = env.reset(_spec("enter-text"), task_seed=2)
    word = re.search(r'"(.+)"', page.goal).group(1)
    box = next(e for e in page.elements if e.kind == "fill")
    submit = next(e for e in page.elements if e.role == "button")

    missing = env.step("click('9999')")
    assert missing.action_error and not missing.terminated and missing.reward == 0.0

    typed = env.step(f"fill('{box.bid}', '{word}')")
    assert typed.action_error is None and not typed.terminated
    assert word in typed.page.axtree
    done = env.step(f"click('{submit.bid}')")
    assert (done.reward, done.terminated, done.raw_reward) == (1.0, True, 1.0)


def test_fractional_raw_reward_is_kept(env):
    # click-checkboxes-soft pays a partial raw reward for a partly right answer.
    page = env.reset(_spec("click-checkboxes-soft"), task_seed=1)
    submit = next(e for e in page.elements if e.role == "button")
    out = env.step(f"click('{submit.bid}')")
    assert out.terminated
    assert out.reward == float(out.raw_reward > 0)
    assert -1.0 <= out.raw_reward <= 1.0


def test_submitting_an_empty_checkbox_form_succeeds_only_under_the_positive_rule(env):
    """click-checkboxes scores the share of boxes right: with fewer than half of them asked for, Submit before any
    box is a majority-right answer, a success under BrowserGym's rule (raw reward above 0) and a failure under
    success=full (every box right)."""
    import re

    from halo_agent.envs.miniwob import MiniWoBEnv

    def empty_submit(e, seed):
        page = e.reset(_spec("click-checkboxes"), task_seed=seed)
        boxes = [el for el in page.elements if el.role == "checkbox"]
        asked = re.match(r"Select (.*) and click Submit", page.goal).group(1)
        asked = [] if asked == "nothing" else asked.split(", ")
        submit = next(el for el in page.elements if el.role == "button")
        return len(asked), len(boxes), e.step(f"click('{submit.bid}')")

    full = MiniWoBEnv(success="full", screenshots=False)
    try:
        for seed in range(40):
            asked, boxes, out = empty_submit(env, seed)
            if 0 < asked < boxes / 2:
                break
        else:
            pytest.fail("no seed in 0..39 asks for fewer than half the boxes")
        assert (out.reward, out.terminated) == (1.0, True) and 0 < out.raw_reward < 1
        strict = empty_submit(full, seed)[2]
        assert (strict.reward, strict.terminated, strict.raw_reward) == (0.0, True, out.raw_reward)
    finally:
        full.close()
    with pytest.raises(ValueError, match="success must be positive"):
        MiniWoBEnv(success="strict")


def test_an_action_sequence_ends_alike_whether_the_policy_answers_at_once_or_later(env):
    """click-collapsible's header opens and closes with a 400 ms jQuery animation: the environment waits for it
    after each action, so the same clicks give the same rewards and pages however long the policy thinks. (Observed
    at once, a second click on the header landed mid-animation and was ignored while the policy answered quickly,
    and closed the section when it answered slowly: one action sequence succeeded idle and failed under load.)"""
    header, submit = "click('16')", "click('22')"  # seed 100031: the section's tab, the submit button inside it

    def play(pause_s: float):
        env.reset(_spec("click-collapsible"), task_seed=100031)
        outcomes = []
        for action in (header, header, submit):
            out = env.step(action)
            outcomes.append((out.reward, out.terminated, out.page.axtree, "unsettled_ms" in out.info))
            time.sleep(pause_s)
        return outcomes

    at_once, later = play(0.0), play(0.6)
    assert at_once == later
    assert [o[:2] for o in at_once] == [(0.0, False), (0.0, False), (0.0, True)]  # closed again: submit misses


def test_an_animation_longer_than_the_cap_is_marked_on_the_step():
    from halo_agent.envs.miniwob import MiniWoBEnv

    hurried = MiniWoBEnv(settle_ms=50, screenshots=False)
    try:
        hurried.reset(_spec("click-collapsible"), task_seed=100031)
        assert hurried.step("click('16')").info["unsettled_ms"] == 50
    finally:
        hurried.close()
    with pytest.raises(ValueError, match="settle_ms"):
        MiniWoBEnv(settle_ms=-1)


def test_stock_agisdk_browser_env_runs_the_task():
    """agisdk's own BrowserEnv (gym.make) runs the registered task: one runner for MiniWoB and REAL."""
    import gymnasium as gym

    import halo_agent.envs.miniwob  # noqa: F401  (registers the tasks)

    from halo_agent.envs.base import ACTION_TIMEOUT_MS, action_set

    # HALO's action set: BrowserGym's code with a Playwright timeout a busy machine can meet
    actions = action_set()
    assert f"timeout={ACTION_TIMEOUT_MS})" in actions.python_includes and "timeout=500)" not in actions.python_includes
    bgym_env = gym.make("browsergym/miniwob.click-test", disable_env_checker=True, headless=True, slow_mo=0,
                        action_mapping=actions.to_python_code)
    try:
        obs, info = bgym_env.reset(seed=4)
        assert obs["goal"] == "Click the button."
        assert obs["url"].endswith("/click-test.html")
        from agisdk.REAL.browsergym.utils.obs import flatten_axtree_to_str

        text = flatten_axtree_to_str(obs["axtree_object"])
        bid = re.search(r"\[(\d+)\] button 'Click Me!'", text).group(1)
        obs, reward, terminated, truncated, info = bgym_env.step(f"click('{bid}')")
        assert (reward, terminated) == (1.0, True)
        assert info["task_info"]["raw_reward"] == 1.0
    finally:
        bgym_env.close()


def test_next_attempt_restarts_in_place_into_the_freshly_loaded_page():
    """isolation=episode (the default): MiniWoB++'s own reset for verified tasks, the same page as a load."""
    from halo_agent.envs.miniwob import MiniWoBEnv, restartable_tasks

    assert {"click-button", "enter-text", "choose-list"} <= restartable_tasks()
    restarting, loading = MiniWoBEnv(), MiniWoBEnv(isolation="document")
    try:
        for e in (restarting, loading):
            first = e.reset(_spec("enter-text"), task_seed=4)
            e.step(f"fill('{first.elements[0].bid}', 'something else')")
        again = restarting.reset(_spec("enter-text"), task_seed=4)
        loaded = loading.reset(_spec("enter-text"), task_seed=4)
        assert (restarting.restarts, loading.restarts) == (1, 0)
        assert (again.goal, again.axtree, again.screenshot) == (first.goal, first.axtree, first.screenshot)
        assert (loaded.goal, loaded.axtree, loaded.screenshot) == (first.goal, first.axtree, first.screenshot)
        # MiniWoB's own reward still judges a restarted episode
        wanted = re.search(r'"(.+)"', again.goal).group(1)
        restarting.step(f"fill('{again.elements[0].bid}', '{wanted}')")
        submit = next(el for el in restarting.state.elements if el.role == "button")
        out = restarting.step(f"click('{submit.bid}')")
        assert (out.reward, out.terminated) == (1.0, True)
        # another task, or a task that is not verified, loads its page
        restarting.reset(_spec("click-button"), task_seed=4)
        restarting.reset(_spec("focus-text-2"), task_seed=4)
        restarting.reset(_spec("focus-text-2"), task_seed=4)
        assert restarting.restarts == 1
        # Two environments at once: each in contexts of its own, in the process's one Chromium.
        assert restarting.session.browser is loading.session.browser and restarting.session.context is not loading.session.context
    finally:
        restarting.close()
        loading.close()
    # The next environment of the process starts without launching Chromium (an online loop's next rollout).
    following = MiniWoBEnv()
    try:
        page = following.reset(_spec("click-button"), task_seed=4)
        assert page.elements and following.session.launches == 0 and following.session.browser.is_connected()
    finally:
        following.close()


def test_restart_verification_catches_a_task_that_keeps_state():
    """focus-text-2's inputs are static HTML its problem generator never clears."""
    from halo_agent.envs.miniwob import restartable_tasks, verify_restart

    results = verify_restart(["focus-text-2", "click-link"], seeds=(3,), steps=6)
    assert results["click-link"] is None
    assert results["focus-text-2"] and "AXTree" in results["focus-text-2"]
    assert "focus-text-2" not in restartable_tasks()
