"""agisdk's GoCalendar tasks against HALO's local GoCalendar clone, in real headless Chromium.

Every v2 GoCalendar task gets a scripted solution and a wrong, partial one, played on the site
through its accessible names; agisdk's evaluator scores the ``/finish`` state with the task's own
eval script, unchanged: the solutions score 1.0, the partial runs 0.0 (v2.gocalendar-11 ships an
empty eval script, so nothing scores it above 0.0). The checks in
``halo_agent/sites/expectations/gocalendar.yaml`` all hold on each solution's state, and some but
not all of them on each partial run's. Three tasks also run whole episodes through ``RealEnv``
with BrowserGym actions, where HALO's GoCalendar progress milestones (rewards.yaml) fire, and a
wrong one (Monday's Project Sync deleted instead of Wednesday's) scores 0.0.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import jmespath
import pytest
import yaml

pytest.importorskip("agisdk")

from halo_agent.envs.base import element_for_action  # noqa: E402
from halo_agent.envs.real import RealEnv  # noqa: E402
from halo_agent.rewards import EpisodeRewards, RewardConfig  # noqa: E402
from halo_agent.sites import SITES_DIR, LocalSite  # noqa: E402

EXPECTATIONS = yaml.safe_load((SITES_DIR / "expectations" / "gocalendar.yaml").read_text())
VIEWPORT = {"width": 1280, "height": 720}

# ----------------------------------------------------------------------------- scripted steps
# A step is (verb, role, accessible name, value): what a person does on the page, played either
# with Playwright locators or as BrowserGym actions on the element of that role and name.


def click(role: str, name: str):
    return ("click", role, name, None)


def fill(name: str, value: str):
    return ("fill", "textbox", name, value)


def select(name: str, label: str):
    return ("select", "combobox", name, label)


def create(title: str, start_date: str | None = None, start_time: str | None = None, end_date: str | None = None,
           end_time: str | None = None, location: str | None = None, all_day: bool = False, repeat: str | None = None):
    steps = [click("button", "Create"), fill("Title", title)]
    if all_day:
        steps.append(click("checkbox", "All day"))
    for name, value in (("Start date", start_date), ("Start time", start_time), ("End date", end_date), ("End time", end_time)):
        if value is not None:
            steps.append(fill(name, value))
    if repeat is not None:
        steps.append(select("Repeat", repeat))
    if location is not None:
        steps.append(fill("Location", location))
    return steps + [click("button", "Save")]


def press(name: str, key: str):
    return ("press", "textbox", name, key)


def delete(chip: str):
    return [click("button", chip), click("button", "Delete event")]


DINNER_FRIENDS = "Dinner with Friends, 7:00 PM – 9:00 PM, Wednesday, July 17"
READING = "Reading Time, 10:00 PM – 11:00 PM, Wednesday, July 17"
COFFEE_SISTER = "Morning Coffee with Sister, 9:00 AM – 10:00 AM, Thursday, July 18"
SYNC_WEDNESDAY = "Project Sync, 2:00 PM – 3:00 PM, Wednesday, July 17"
SYNC_MONDAY = "Project Sync, 2:00 PM – 3:00 PM, Monday, July 15"
DINNER_PARENTS = "Dinner with Parents, 6:30 PM – 8:30 PM, Saturday, July 20"


@dataclasses.dataclass(frozen=True)
class Case:
    solution: list
    partial: list  # wrong: part of the way, or the wrong event
    solved_score: float = 1.0
    check_solved: Callable[[dict], None] | None = None  # more about the /finish state the solution leaves
    check_partial: Callable[[dict], None] | None = None
    partial_progress: bool = True  # False: the partial run is only wrong (another event deleted) and meets no check


def only_added(state: dict) -> dict:
    (event,) = state["differences"]["events"]["added"].values()
    assert state["initialfinaldiff"]["added"]["calendar"]["events"] == {event["id"]: event}
    assert state["ui"]["draft"] is None and state["ui"]["snackbar"] == "Event created"
    return event


def gym_weekdays(state: dict) -> None:
    event = only_added(state)
    # Friday, September 20, 2024, 7:45-8:45 PM Pacific (UTC-7), every weekday from then on.
    assert (event["start"], event["end"], event["allDay"]) == ("2024-09-21T02:45:00.000Z", "2024-09-21T03:45:00.000Z", False)
    assert (event["title"], event["location"]) == ("Work out at the gym", "Gym")
    assert event["recurrence"] == "RRULE:FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR"


def math_camp(state: dict) -> None:
    event = only_added(state)
    # All day: the local midnights of the first and the last day.
    assert (event["start"], event["end"], event["allDay"]) == ("2024-07-21T07:00:00.000Z", "2024-07-27T07:00:00.000Z", True)


def pickup_draft(state: dict) -> None:
    """The editor open with the title, date and time typed, nothing saved: the draft says what Save would store."""
    assert state["differences"]["events"]["added"] == {} and state["ui"]["editorOpened"]
    draft = state["ui"]["draft"]
    assert (draft["mode"], draft["title"], draft["from"], draft["to"]) == (
        "create", "Pick up sister", "2024-07-17T18:00:00.000Z", "2024-07-17T19:00:00.000Z")


def only_deleted(event_id: str, title: str) -> Callable[[dict], None]:
    def check(state: dict) -> None:
        assert list(state["differences"]["events"]["deleted"]) == [event_id]
        assert state["differences"]["events"]["deleted"][event_id]["title"] == title
        assert state["ui"]["openedEvents"] == [event_id] and state["ui"]["snackbar"] == "Event deleted"
    return check


CASES = {
    "v2.gocalendar-4": Case(
        create("Work out at the gym", "Sep 20, 2024", "7:45pm", end_time="8:45 PM", location="Gym",
               repeat="Every weekday (Monday to Friday)"),
        create("Work out", "Sep 20, 2024", "7:45pm", end_time="8:45 PM"),  # no gym location
        check_solved=gym_weekdays),
    "v2.gocalendar-6": Case(create("Pick up sister", "Wednesday", "11 am"),
                            create("Pick up sister", "Wednesday", "11 am")[:-1], check_partial=pickup_draft),  # not saved
    "v2.gocalendar-8": Case(create("Send an email to Ashley", "Monday", "9:00 AM"),
                            create("Send an email to Ashley", "Monday", "3:00 PM")),  # afternoon
    # Wrong: Saturday's Dinner with Parents deleted (opened while Wednesday's dinner was still open).
    "v2.gocalendar-10": Case(delete(DINNER_FRIENDS),
                             [click("button", DINNER_FRIENDS)] + delete(DINNER_PARENTS),
                             check_solved=only_deleted("ev-9", "Dinner with Friends")),
    # eval_gocalendar_11.py is empty: agisdk never reads SUCCESS from it.
    "v2.gocalendar-11": Case(create("Basketball game", start_time="7pm", location="San Francisco"),
                             create("Basketball game", start_time="7pm"), solved_score=0.0),
    # Enter in a field saves, like the Save button.
    "v2.gocalendar-12": Case(create("Buy gym clothes", "7/22/2024", "9:00 AM")[:-1] + [press("Start time", "Enter")],
                             create("Buy gym shoes", "7/22/2024", "9:00 AM")),
    "v2.gocalendar-13": Case(
        create("Math camp", "July 21, 2024", end_date="2024-07-27", location="Sunnyvale", all_day=True),
        create("Math camp", "July 21, 2024", "9:00 AM", location="Sunnyvale"),  # not all day, one day
        check_solved=math_camp),
    "v2.gocalendar-16": Case(delete(READING), [click("button", READING), click("button", "Close")]),
    "v2.gocalendar-18": Case(delete(COFFEE_SISTER), delete("Coffee with Alex, 4:00 PM – 4:30 PM, Friday, July 19"),
                             partial_progress=False),
    "v2.gocalendar-23": Case(delete(SYNC_WEDNESDAY), delete(SYNC_MONDAY), check_solved=only_deleted("ev-8", "Project Sync"),
                             check_partial=only_deleted("ev-2", "Project Sync"), partial_progress=False),
}


def expectation_results(task_id: str, state: dict) -> list[bool]:
    """Each check of the task's expectations on a /finish state, judged as agisdk judges a JMESPath eval."""
    out = []
    for check in EXPECTATIONS[task_id]:
        try:
            value = jmespath.search(check["query"], state)
        except jmespath.exceptions.JMESPathError:
            value = None
        out.append(value == check["expected_value"])
    return out


def agisdk_score(task_id: str, state: dict) -> float:
    """agisdk's own evaluator for the task (its eval script or JMESPath evals) on a /finish state."""
    from agisdk.REAL.browsergym.webclones.evaluate import WebCloneEvaluator
    from agisdk.REAL.browsergym.webclones.task_config import TaskConfig

    version, name = task_id.split(".", 1)
    reward, *_ = WebCloneEvaluator(TaskConfig(name, version)).evaluate(env_state=state, model_response="Done.")
    return float(reward)


# ----------------------------------------------------------------------------- Playwright on the site


@pytest.fixture(scope="module")
def site():
    with LocalSite("gocalendar") as served:
        yield served


@pytest.fixture(scope="module")
def calendar_page():
    """One page for all the direct plays: each starts with /config, which resets the calendar."""
    from halo_agent.browser import ensure_environment
    from halo_agent.envs.real import route_agisdk_console_to_logging

    ensure_environment()
    route_agisdk_console_to_logging()
    from agisdk.REAL.browsergym.core import _get_global_playwright  # the Playwright instance agisdk's env uses

    launched = _get_global_playwright().chromium.launch(headless=True)
    page = launched.new_context(viewport=VIEWPORT).new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    launched.close()


def play(page, site, task_id: str, steps: list) -> dict:
    """The contract's path: /config for the task, the steps on /, then /finish's JSON."""
    page.errors.clear()
    page.goto(f"{site.url}/config?run_id=0&task_id={task_id}&latency=0")
    page.goto(site.url + "/")
    for verb, role, name, value in steps:
        target = page.get_by_role(role, name=name, exact=True)
        if verb == "fill":
            target.fill(value)
        elif verb == "press":
            target.press(value)
        elif verb == "select":
            target.select_option(label=value)
        else:
            target.click()
    page.goto(site.url + "/finish")
    state = json.loads(page.locator("pre").inner_text())
    assert not page.errors, page.errors
    return state


@pytest.mark.browser
@pytest.mark.parametrize("task_id", sorted(CASES, key=lambda t: int(t.rsplit("-", 1)[1])))
def test_v2_task_scored_by_its_eval_script_and_expectations(calendar_page, site, task_id):
    case = CASES[task_id]
    solved = play(calendar_page, site, task_id, case.solution)
    assert solved["taskId"] == task_id
    assert agisdk_score(task_id, solved) == case.solved_score
    assert all(expectation_results(task_id, solved)), list(zip(EXPECTATIONS[task_id], expectation_results(task_id, solved)))
    if case.check_solved:
        case.check_solved(solved)

    partial = play(calendar_page, site, task_id, case.partial)
    assert agisdk_score(task_id, partial) == 0.0
    held = expectation_results(task_id, partial)
    # Deleting the wrong event is no progress towards deleting the right one.
    assert (any(held) if case.partial_progress else not any(held)) and not all(held), held
    if case.check_partial:
        case.check_partial(partial)


@pytest.mark.browser
def test_a_fresh_calendar_has_no_differences(calendar_page, site):
    fresh = play(calendar_page, site, "v2.gocalendar-4", [])
    assert fresh["taskId"] == "v2.gocalendar-4"
    assert fresh["differences"]["events"] == {"added": {}, "updated": {}, "deleted": {}}
    assert fresh["ui"] == {"snackbar": "", "editorOpened": False, "openedEvents": [], "draft": None}
    for task_id in CASES:
        assert agisdk_score(task_id, fresh) == 0.0 and not any(expectation_results(task_id, fresh)), task_id


@pytest.mark.browser
def test_v1_tasks_edit_delete_create_by_their_jmespath_evals(calendar_page, site):
    """The v1 GoCalendar tasks' JMESPath evals read ``eventsDiff``; the edit path changes only the edited fields."""
    edit = [click("button", "Team Check-In, 11:00 AM – 11:30 AM, Thursday, July 18"), click("button", "Edit event"),
            fill("Title", "Project Kickoff"), fill("Location", "Zoom"), click("button", "Save")]
    state = play(calendar_page, site, "v1.gocalendar-4", edit)
    assert agisdk_score("v1.gocalendar-4", state) == 1.0
    changed = state["initialfinaldiff"]["updated"]["calendar"]["events"]
    assert changed == {"ev-12": {"title": "Project Kickoff", "location": "Zoom"}}
    assert state["ui"]["snackbar"] == "Event saved"
    cancelled = play(calendar_page, site, "v1.gocalendar-4", edit[:2] + [click("button", "Cancel")])
    assert agisdk_score("v1.gocalendar-4", cancelled) == 0.0 and cancelled["differences"]["events"]["updated"] == {}

    breakfast = delete("Breakfast Meeting with Client, 10:00 AM – 11:00 AM, Friday, July 19")
    assert agisdk_score("v1.gocalendar-3", play(calendar_page, site, "v1.gocalendar-3", breakfast)) == 1.0
    meeting = create("Team Meeting", "2024/07/19", "2:00 PM", end_time="2:30 PM", location="Conference Room A")
    assert agisdk_score("v1.gocalendar-1", play(calendar_page, site, "v1.gocalendar-1", meeting)) == 1.0


# ----------------------------------------------------------------------------- whole episodes through RealEnv

def _element(page, role: str, name: str):
    for element in page.elements:
        if element.role == role and element.name == name:
            return element
    raise AssertionError(f"no {role} {name!r} on {page.url}: {[(e.role, e.name) for e in page.elements]}")


def run_episode(env: RealEnv, task_id: str, steps: list, answer: str = "Done."):
    """BrowserGym actions for the steps, then the answer; the final outcome and the milestones each step reached."""
    page = env.reset(task_id, task_seed=0)
    rewards = EpisodeRewards(RewardConfig.load(), "gocalendar", start_url=page.url, start_state=page.axtree)
    reached = []
    for verb, role, name, value in steps:
        bid = _element(page, role, name).bid
        action = {"fill": f"fill({bid!r}, {value!r})", "press": f"press({bid!r}, {value!r})",
                  "select": f"select_option({bid!r}, {value!r})"}.get(verb, f"click({bid!r})")
        outcome = env.step(action)
        assert outcome.action_error is None, outcome.action_error
        assert not outcome.terminated and outcome.reward == 0.0
        step = rewards.step(state_hash=page.axtree, action=action, action_valid=True,
                            target=element_for_action(action, page.elements),
                            url_after=outcome.page.url, page_after=outcome.page.axtree, state_hash_after=outcome.page.axtree)
        reached.append(step.milestones)
        page = outcome.page
    final = env.step(f"send_msg_to_user({answer!r})")
    assert final.terminated
    return final, reached, rewards.cumulative_progress


@pytest.mark.browser
@pytest.mark.slow
def test_real_env_episodes_score_and_reach_the_milestones(site):
    """Three v2 tasks solved in whole RealEnv episodes (agisdk's BrowserEnv, BrowserGym actions), and a wrong one."""
    env = RealEnv(site_urls={"gocalendar": site.url}, screenshot=False)
    try:
        # Create: every GoCalendar milestone, each at its step (Create, Title, Start date, Save + "Event created").
        task_id = "v2.gocalendar-6"
        answer = "I added 'Pick up sister' on Wednesday at 11 AM."
        final, reached, progress = run_episode(env, task_id, CASES[task_id].solution, answer)
        assert final.reward == 1.0 and final.raw_reward == 1.0
        assert reached == [["create_clicked"], ["title_filled"], ["datetime_set"], [], ["save_clicked", "event_created"]]
        assert progress == 1.0 and "Event created" in final.page.axtree
        assert all(expectation_results(task_id, final.info["env_state"]))

        task_id = "v2.gocalendar-10"
        final, _, _ = run_episode(env, task_id, CASES[task_id].solution)
        assert final.reward == 1.0 and "Event deleted" in final.page.axtree
        only_deleted("ev-9", "Dinner with Friends")(final.info["env_state"])

        # Wednesday's Project Sync is right, Monday's is wrong.
        task_id = "v2.gocalendar-23"
        final, _, _ = run_episode(env, task_id, CASES[task_id].solution)
        assert final.reward == 1.0
        only_deleted("ev-8", "Project Sync")(final.info["env_state"])
        final, _, _ = run_episode(env, task_id, CASES[task_id].partial)
        assert final.reward == 0.0
        only_deleted("ev-2", "Project Sync")(final.info["env_state"])
    finally:
        env.close()
