"""Macros and recovery on real MiniWoB++ pages (headless Chromium): each macro's program where its precondition
holds, and its refusal on pages it does not fit."""

from __future__ import annotations

import pytest

from halo_agent.hierarchy import MACROS, LoopDetector, MacroRefused, Recovery, goal_fields
from halo_agent.rollout import RolloutConfig, build_observation, resolve_tasks
from halo_agent.rollout.workers import env_for
from halo_agent.types import Element, Observation

PAGES = ("login-user", "click-dialog", "search-engine", "enter-text", "click-checkboxes")


@pytest.fixture(scope="module")
def pages() -> dict[str, Observation]:
    config = RolloutConfig(env="miniwob", tasks=list(PAGES), lake="unused")
    env = env_for(config)
    try:
        out = {}
        for task in resolve_tasks(config):
            page = env.reset(task, 3)
            out[task.task_id.split(".", 1)[1]] = build_observation(page, task.task_id, [], 0, False, None, task.site)
        return out
    finally:
        env.close()


def bid(obs: Observation, role: str, name: str = "") -> str:
    return next(e.bid for e in obs.elements if e.role == role and e.name == name)


def test_log_in_fills_both_fields_from_the_goal_then_logs_in(pages):
    obs = pages["login-user"]
    fields = goal_fields(obs.goal)
    user, password = [e.bid for e in obs.elements if e.kind == "fill"]
    assert MACROS["log_in"].plan(obs).actions == (
        f"fill({user!r}, {fields['username']!r})", f"fill({password!r}, {fields['password']!r})", f"click({bid(obs, 'button', 'Login')!r})")


def test_search_close_modal_and_fill_form_fit_their_pages(pages):
    search = pages["search-engine"]
    query = goal_fields(search.goal)["enter"]
    box = next(e.bid for e in search.elements if e.kind == "fill")
    assert MACROS["search"].plan(search).actions == (f"fill({box!r}, {query!r})", f"click({bid(search, 'button', 'Search')!r})")
    dialog = pages["click-dialog"]
    assert MACROS["close_modal"].plan(dialog).actions == (f"click({bid(dialog, 'button', 'Close')!r})",)
    form = pages["enter-text"]
    text = goal_fields(form.goal)["enter"]
    assert MACROS["fill_form"].plan(form).actions == (
        f"fill({next(e.bid for e in form.elements if e.kind == 'fill')!r}, {text!r})", f"click({bid(form, 'button', 'Submit')!r})")


def test_add_to_cart_clicks_the_cart_button():
    obs = Observation(goal="Buy the red mug", url="http://shop/p/1", axtree="[5] button 'Add to cart'",
                      elements=[Element("4", "link", "Home", "click"), Element("5", "button", "Add to cart", "click")],
                      screenshot=None, screenshot_hash=None, messages=[], history=[], step_idx=0, task_id="shop-1")
    assert MACROS["add_to_cart"].plan(obs).actions == ("click('5')",)


@pytest.mark.parametrize("macro, page, reason", [
    ("log_in", "click-dialog", "log_in needs a user name field, a password field and a log-in button"),
    ("log_in", "enter-text", "log_in needs a user name field, a password field and a log-in button"),
    ("search", "click-checkboxes", "search needs a search box"),
    ("search", "click-dialog", "search needs a search box"),
    ("fill_form", "click-dialog", "fill_form needs labelled fields whose labels the goal gives values for"),
    ("fill_form", "click-checkboxes", "fill_form needs labelled fields whose labels the goal gives values for"),
    ("add_to_cart", "login-user", "add_to_cart needs an 'Add to cart' button"),
    ("add_to_cart", "click-checkboxes", "add_to_cart needs an 'Add to cart' button"),
    ("close_modal", "login-user", "close_modal needs a dialog, modal or cookie banner on the page"),
    ("close_modal", "enter-text", "close_modal needs a dialog, modal or cookie banner on the page"),
])
def test_each_macro_refuses_a_page_it_does_not_fit(pages, macro, page, reason):
    with pytest.raises(MacroRefused) as refused:
        MACROS[macro].plan(pages[page])
    assert str(refused.value) == reason


def test_loop_detector_and_recovery_order(pages):
    loops = LoopDetector(repeats=2)
    loops.record("S", "click('1')", "S")
    assert not loops.looping("S")
    loops.record("S", "click('1')", "S")
    assert loops.looping("S") and not loops.looping("T")
    loops.broken()
    assert not loops.looping("S")
    dialog = pages["click-dialog"]
    close = f"click({bid(dialog, 'button', 'Close')!r})"
    recovery = Recovery()
    assert recovery.action(dialog, set()) == ("clear_obstruction", close)
    boxes = pages["click-checkboxes"]
    first, second = [e.bid for e in boxes.elements if e.role == "checkbox"][:2]
    assert recovery.action(boxes, {f"click({first!r})"}) == ("alternative_element", f"click({second!r})")
    everything = {f"click({e.bid!r})" for e in boxes.elements}
    assert recovery.action(boxes, everything, start_url="http://elsewhere/") == ("go_back", "go_back()")
    assert recovery.action(boxes, everything) == ("scroll", "scroll(0, 300)")
