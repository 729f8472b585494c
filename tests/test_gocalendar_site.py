"""agisdk's GoCalendar tasks against HALO's local GoCalendar clone, in real headless Chromium.

Every v2 GoCalendar task gets a scripted solution and a wrong, partial one, played on the site
through its accessible names; agisdk's evaluator scores the ``/finish`` state with the task's own
eval script, unchanged: the solutions score 1.0, the partial runs 0.0 (v2.gocalendar-11 ships an
empty eval script, so nothing scores it above 0.0). The checks in
``halo_agent/sites/expectations/gocalendar.yaml`` all hold on each solution's state, and some but
not all of them on each partial run's. Three tasks also run whole episodes through ``RealEnv``
with BrowserGym actions, where HALO's GoCalendar progress milestones (rewards.yaml) fire.
"""

from __future__ import annotations

import dataclasses
import json

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


def delete(chip: str):
    return [click("button", chip), click("button", "Delete event")]


DINNER_FRIENDS = "Dinner with Friends, 7:00 PM – 9:00 PM, Wednesday, July 17"
READING = "Reading Time, 10:00 PM – 11:00 PM, Wednesday, July 17"
COFFEE_SISTER = "Morning Coffee with Sister, 9:00 AM – 10:00 AM, Thursday, July 18"
SYNC_WEDNESDAY = "Project Sync, 2:00 PM – 3:00 PM, Wednesday, July 17"
SYNC_MONDAY = "Project Sync, 2:00 PM – 3:00 PM, Monday, July 15"


@dataclasses.dataclass(frozen=True)
class Case:
    solution: list
    partial: list  # wrong: part of the way, or the wrong event
    solved_score: float = 1.0


CASES = {
    "v2.gocalendar-4": Case(
        create("Work out at the gym", "Sep 20, 2024", "7:45pm", end_time="8:45 PM", location="Gym",
               repeat="Every weekday (Monday to Friday)"),
        create("Work out", "Sep 20, 2024", "7:45pm", end_time="8:45 PM")),  # no gym location
    "v2.gocalendar-6": Case(create("Pick up sister", "Wednesday", "11 am"),
                            create("Pick up sister", "Thursday", "11 am")),
    "v2.gocalendar-8": Case(create("Send an email to Ashley", "Monday", "9:00 AM"),
                            create("Send an email to Ashley", "Monday", "3:00 PM")),  # afternoon
    "v2.gocalendar-10": Case(delete(DINNER_FRIENDS), delete("Dinner with Parents, 6:30 PM – 8:30 PM, Saturday, July 20")),
    # eval_gocalendar_11.py is empty: agisdk never reads SUCCESS from it.
    "v2.gocalendar-11": Case(create("Basketball game", start_time="7pm", location="San Francisco"),
                             create("Basketball game", start_time="7pm"), solved_score=0.0),
    "v2.gocalendar-12": Case(create("Buy gym clothes", "7/22/2024", "9:00 AM"), create("Buy gym shoes", "7/22/2024", "9:00 AM")),
    "v2.gocalendar-13": Case(
        create("Math camp", "July 21, 2024", end_date="2024-07-27", location="Sunnyvale", all_day=True),
        create("Math camp", "July 21, 2024", "9:00 AM", location="Sunnyvale")),  # not all day, one day
    "v2.gocalendar-16": Case(delete(READING), [click("button", READING), click("button", "Close")]),
    "v2.gocalendar-18": Case(delete(COFFEE_SISTER), delete("Coffee with Alex, 4:00 PM – 4:30 PM, Friday, July 19")),
    "v2.gocalendar-23": Case(delete(SYNC_WEDNESDAY), delete(SYNC_MONDAY)),
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

    partial = play(calendar_page, site, task_id, case.partial)
    assert agisdk_score(task_id, partial) == 0.0
    held = expectation_results(task_id, partial)
    assert any(held) and not all(held), held


@pytest.mark.browser
def test_the_finish_state_names_times_in_utc_and_the_changed_fields(calendar_page, site):
    fresh = play(calendar_page, site, "v2.gocalendar-4", [])
    assert fresh["differences"]["events"] == {"added": {}, "updated": {}, "deleted": {}}
    assert fresh["ui"] == {"snackbar": "", "editorOpened": False, "openedEvents": [], "draft": None}
    assert not any(expectation_results("v2.gocalendar-4", fresh))

    state = play(calendar_page, site, "v2.gocalendar-4", CASES["v2.gocalendar-4"].solution)
    (event,) = state["differences"]["events"]["added"].values()
    # Friday, September 20, 2024, 7:45-8:45 PM Pacific (UTC-7), every weekday from then on.
    assert (event["start"], event["end"], event["allDay"]) == ("2024-09-21T02:45:00.000Z", "2024-09-21T03:45:00.000Z", False)
    assert (event["title"], event["location"], event["recurrence"]) == ("Work out at the gym", "Gym", "RRULE:FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR")
    assert state["initialfinaldiff"]["added"]["calendar"]["events"] == {event["id"]: event}
    assert state["ui"]["snackbar"] == "Event created" and state["ui"]["draft"] is None

    camp = play(calendar_page, site, "v2.gocalendar-13", CASES["v2.gocalendar-13"].solution)
    (event,) = camp["differences"]["events"]["added"].values()
    # All day: the local midnights of the first and the last day.
    assert (event["start"], event["end"], event["allDay"]) == ("2024-07-21T07:00:00.000Z", "2024-07-27T07:00:00.000Z", True)

    # Mid-way: the editor open with the title, date and time typed, nothing saved yet.
    draft = play(calendar_page, site, "v2.gocalendar-6", CASES["v2.gocalendar-6"].solution[:-1])
    assert draft["differences"]["events"]["added"] == {}
    assert draft["ui"]["draft"]["title"] == "Pick up sister"
    assert (draft["ui"]["draft"]["from"], draft["ui"]["draft"]["to"]) == ("2024-07-17T18:00:00.000Z", "2024-07-17T19:00:00.000Z")
    assert expectation_results("v2.gocalendar-6", draft) == [True, True, True, False]
    assert agisdk_score("v2.gocalendar-6", draft) == 0.0  # a draft is no event


@pytest.mark.browser
def test_v1_tasks_edit_delete_create_by_their_jmespath_evals(calendar_page, site):
    """The v1 GoCalendar tasks' JMESPath evals read ``eventsDiff``; the edit path changes only the edited fields."""
    edit = [click("button", "Team Check-In, 11:00 AM – 11:30 AM, Thursday, July 18"), click("button", "Edit event"),
            fill("Title", "Project Kickoff"), fill("Location", "Zoom"), click("button", "Save")]
    state = play(calendar_page, site, "v1.gocalendar-4", edit)
    assert agisdk_score("v1.gocalendar-4", state) == 1.0
    assert state["initialfinaldiff"]["updated"]["calendar"]["events"] == {"ev-12": {"title": "Project Kickoff", "location": "Zoom"}}
    assert state["ui"]["snackbar"] == "Event saved"
    assert agisdk_score("v1.gocalendar-4", play(calendar_page, site, "v1.gocalendar-4", edit[:2] + [click("button", "Cancel")])) == 0.0

    breakfast = delete("Breakfast Meeting with Client, 10:00 AM – 11:00 AM, Friday, July 19")
    assert agisdk_score("v1.gocalendar-3", play(calendar_page, site, "v1.gocalendar-3", breakfast)) == 1.0
    meeting = create("Team Meeting", "Jul 19, 2024", "2:00 PM", end_time="2:30 PM", location="Conference Room A")
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
        action = {"fill": f"fill({bid!r}, {value!r})", "select": f"select_option({bid!r}, {value!r})"}.get(verb, f"click({bid!r})")
        outcome = env.step(action)
        assert outcome.action_error is None, outcome.action_error
        assert not outcome.terminated and outcome.reward == 0.0
        step = rewards.step(state_hash=page.axtree, action=action, action_valid=True, target=element_for_action(action, page.elements),
                            url_after=outcome.page.url, page_after=outcome.page.axtree, state_hash_after=outcome.page.axtree)
        reached.append(step.milestones)
        page = outcome.page
    final = env.step(f"send_msg_to_user({answer!r})")
    assert final.terminated
    return final, reached, rewards.cumulative_progress


@pytest.mark.browser
@pytest.mark.slow
def test_real_env_episodes_score_and_reach_the_milestones(site):
    env = RealEnv(site_urls={"gocalendar": site.url}, screenshot=False)
    try:
        # Create: every GoCalendar milestone, each at its step (Create, Title, Start date, Save + "Event created").
        task_id = "v2.gocalendar-6"
        final, reached, progress = run_episode(env, task_id, CASES[task_id].solution, "I added 'Pick up sister' on Wednesday at 11 AM.")
        assert final.reward == 1.0 and final.raw_reward == 1.0
        assert reached == [["create_clicked"], ["title_filled"], ["datetime_set"], [], ["save_clicked", "event_created"]]
        assert progress == 1.0 and "Event created" in final.page.axtree
        assert all(expectation_results(task_id, final.info["env_state"]))
        final, _, _ = run_episode(env, task_id, [])  # no-op: nothing added
        assert final.reward == 0.0 and final.info["env_state"]["differences"]["events"]["added"] == {}

        # Delete: Wednesday's Dinner with Friends; answering without deleting it scores 0.
        task_id = "v2.gocalendar-10"
        final, _, _ = run_episode(env, task_id, CASES[task_id].solution)
        assert final.reward == 1.0 and all(expectation_results(task_id, final.info["env_state"]))
        final, _, _ = run_episode(env, task_id, [])
        assert final.reward == 0.0 and final.info["env_state"]["differences"]["events"]["deleted"] == {}

        # Delete: Wednesday's Project Sync is right, Monday's is wrong.
        task_id = "v2.gocalendar-23"
        final, _, _ = run_episode(env, task_id, CASES[task_id].solution)
        assert final.reward == 1.0 and "Event deleted" in final.page.axtree
        assert list(final.info["env_state"]["differences"]["events"]["deleted"]) == ["ev-8"]
        final, _, _ = run_episode(env, task_id, CASES[task_id].partial)
        assert final.reward == 0.0
        assert list(final.info["env_state"]["differences"]["events"]["deleted"]) == ["ev-2"]
    finally:
        env.close()
