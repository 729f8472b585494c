"""HALO's runner for BrowserGym actions, in real headless Chromium: the quick click path and when it steps aside."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

PAGE = """<!doctype html><html><body style="margin:0">
<button id="free" onclick="window.hits.push('free')">Free</button>
<button id="off" disabled onclick="window.hits.push('off')">Off</button>
<div style="position:relative; width:120px; height:40px">
  <button id="under" onclick="window.hits.push('under')" style="width:120px; height:40px">Under</button>
  <div id="cover" onclick="window.hits.push('cover')" style="position:absolute; inset:0; background:#888"></div>
</div>
<input id="box" type="checkbox" aria-label="Box">
<script>window.hits = [];</script>
</body></html>"""


@pytest.fixture(scope="module")
def session():
    from halo_agent.browser import BrowserSession

    s = BrowserSession(headless=True)
    yield s
    s.close()


@pytest.fixture()
def page_state(session):
    from halo_agent.envs.base import extract_page_state

    page = session.new_page({"width": 400, "height": 300})
    page.set_content(PAGE)
    state = extract_page_state(page, "goal")
    return page, state


def _bid(page, element_id):
    return page.eval_on_selector(f"#{element_id}", "el => el.getAttribute('bid')")


class CountingRunner:
    """An ActionRunner that counts the clicks handed to BrowserGym's own click."""

    def __new__(cls):
        from halo_agent.envs.base import ActionRunner

        runner = ActionRunner()
        namespace = runner._globals()
        original = namespace["_browsergym_click"]
        runner.fallbacks = 0

        def counted(*args, **kwargs):
            runner.fallbacks += 1
            return original(*args, **kwargs)

        namespace["_browsergym_click"] = counted
        return runner


def test_click_on_an_unmoved_free_element_goes_straight_to_the_mouse(page_state):
    page, state = page_state
    runner = CountingRunner()
    bid = _bid(page, "free")
    assert bid in state.extra["element_bboxes"]
    assert runner.run(page, f"click('{bid}')", state.extra["element_bboxes"]) == (None, [])
    checkbox = _bid(page, "box")
    assert runner.run(page, f"click('{checkbox}')", state.extra["element_bboxes"]) == (None, [])
    assert page.evaluate("window.hits") == ["free"]
    assert page.is_checked("#box")
    assert runner.fallbacks == 0


def test_covered_disabled_or_moved_elements_get_playwrights_checks(page_state):
    page, state = page_state
    runner = CountingRunner()
    boxes = dict(state.extra["element_bboxes"])
    under, off, free = _bid(page, "under"), _bid(page, "off"), _bid(page, "free")
    boxes.setdefault(under, [0, 0, 0, 0])
    boxes.setdefault(off, [0, 0, 0, 0])

    error, _ = runner.run(page, f"click('{under}')", boxes)  # the cover intercepts the click
    assert error and "Timeout" in error
    error, _ = runner.run(page, f"click('{off}')", boxes)  # disabled: Playwright waits, then times out
    assert error and "Timeout" in error
    page.evaluate("document.getElementById('free').style.marginLeft = '30px'")  # moved since observed
    assert runner.run(page, f"click('{free}')", boxes) == (None, [])
    assert runner.fallbacks == 3
    assert page.evaluate("window.hits") == ["free"]


def test_unknown_elements_and_other_actions_keep_browsergym_errors(page_state):
    page, state = page_state
    runner = CountingRunner()
    error, _ = runner.run(page, "click('9999')", state.extra["element_bboxes"])
    assert error == 'ValueError: Could not find element with bid "9999"'
    error, _ = runner.run(page, "no_such_action('1')", state.extra["element_bboxes"])
    assert error.startswith("NameError")
    error, messages = runner.run(page, "send_msg_to_user('done')")
    assert error is None and messages == [("assistant", "done")]
    # the action library is executed once and reused
    assert runner._globals() is runner._globals()


def test_same_result_as_browsergym_execution(session):
    """The runner and BrowserGym's own execute_python_code leave a page in the same state."""
    from agisdk.REAL.browsergym.core.action.base import execute_python_code

    from halo_agent.envs.base import ActionRunner, action_set, extract_page_state

    results = []
    for use_runner in (True, False):
        page = session.new_page({"width": 400, "height": 300})
        page.set_content(PAGE)
        state = extract_page_state(page, "goal")
        actions = [f"click('{_bid(page, 'free')}')", f"click('{_bid(page, 'box')}')", f"click('{_bid(page, 'free')}')"]
        for action in actions:
            if use_runner:
                assert ActionRunner().run(page, action, state.extra["element_bboxes"])[0] is None
            else:
                execute_python_code(action_set().to_python_code(action), page, lambda _: None, lambda _: None)
            state = extract_page_state(page, "goal")
        results.append((page.evaluate("window.hits"), state.axtree))
    assert results[0] == results[1]
