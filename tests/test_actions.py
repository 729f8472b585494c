"""Parsing model output into BrowserGym actions: the shapes models really answer in, and the broken ones."""

from __future__ import annotations

import pytest

from halo_agent.actions import (
    ActionParseError,
    bids_in_axtree,
    format_action,
    parse_action,
    parse_action_detailed,
    parse_for_observation,
    png_size,
    rescale_coordinates,
)
from halo_agent.types import Element, Observation

ELEMENTS = (
    Element("12", "button", "Send", "click"),
    Element("5", "textbox", "To", "fill"),
    Element("7", "combobox", "Color", "select", ("Red", "Blue")),
    Element("a31", "link", "Inbox", "click"),  # an element inside an iframe
)

VALID = [
    # bare BrowserGym calls
    ("click('12')", "click('12')"),
    ('click("12")', "click('12')"),
    ("click( '12' )", "click('12')"),
    ("click(12)", "click('12')"),
    ("click('[12]')", "click('12')"),
    ("click('a31')", "click('a31')"),
    ("click('12', button='left')", "click('12')"),
    ("click('12', 'right')", "click('12', 'right')"),
    ("dblclick('12')", "dblclick('12')"),
    ("fill('5', 'bob@example.com')", "fill('5', 'bob@example.com')"),
    ("fill(bid='5', value='x y')", "fill('5', 'x y')"),
    ("fill('5', 42)", "fill('5', '42')"),
    ("fill('5', 'line one\\nline two')", "fill('5', 'line one\\nline two')"),
    ("select_option('7', 'Blue')", "select_option('7', 'Blue')"),
    ("select_option('7', 'blue')", "select_option('7', 'Blue')"),
    ("select_option('7', ['Red', 'blue'])", "select_option('7', ['Red', 'Blue'])"),
    ("press('5', 'Enter')", "press('5', 'Enter')"),
    ("press('Enter')", "keyboard_press('Enter')"),
    ("press('5', 'Control+a')", "press('5', 'Control+a')"),
    ("scroll(0, 300)", "scroll(0, 300)"),
    ("scroll(0, -200.0)", "scroll(0, -200)"),
    ("scroll('down')", "scroll(0, 300)"),
    ("send_msg_to_user('The total is $18.40')", "send_msg_to_user('The total is $18.40')"),
    ("report_infeasible('no such product')", "report_infeasible('no such product')"),
    ("noop()", "noop()"),
    ("noop(500)", "noop(500)"),
    ("noop(1000)", "noop()"),
    ("go_back()", "go_back()"),
    ("goto('http://localhost/inbox')", "goto('http://localhost/inbox')"),
    ("keyboard_type('hello')", "keyboard_type('hello')"),
    # prose around the call, fences, labels, thinking
    ("```python\nclick('12')\n```", "click('12')"),
    ("```\nfill('5', 'hi')\n```\nThis fills the recipient.", "fill('5', 'hi')"),
    ("The send button has id 12.\nAction: click('12')", "click('12')"),
    ("Thought: I should type the address.\nAction:\n```\nfill('5', 'a@b.c')\n```", "fill('5', 'a@b.c')"),
    ("Next action: noop()", "noop()"),
    ("I will click on the Send button: click('12')", "click('12')"),
    ("<think>maybe click('5')? no.</think>\nclick('12')", "click('12')"),
    ("```python\nclick('12')", "click('12')"),  # fence cut off by max_tokens
    ("click('12'", "click('12')"),  # call cut off by max_tokens
    # typographic quotes from chat UIs
    ("click(\u201812\u2019)", "click('12')"),
    ("fill('5', \u201chello\u201d)", "fill('5', 'hello')"),
    # an unescaped quote inside the text
    ("fill('5', 'it's on Tuesday')", 'fill(\'5\', "it\'s on Tuesday")'),
    ("send_msg_to_user('I can't find it')", 'send_msg_to_user("I can\'t find it")'),
    # JSON actions
    ('{"action": "click", "bid": "12"}', "click('12')"),
    ('{"action": "click", "bid": 12}', "click('12')"),
    ('{"action": "fill", "bid": "5", "text": "bob@example.com"}', "fill('5', 'bob@example.com')"),
    ('{"action": "fill", "element_id": "5", "value": "x"}', "fill('5', 'x')"),
    ('{"action": "type", "bid": "5", "text": "x"}', "fill('5', 'x')"),
    ('{"action": "type", "text": "abc"}', "keyboard_type('abc')"),
    ('{"action": "select_option", "bid": "7", "option": "Red"}', "select_option('7', 'Red')"),
    ('{"action": "press", "key": "Enter"}', "keyboard_press('Enter')"),
    ('{"action": "press", "bid": "5", "key": "Enter"}', "press('5', 'Enter')"),
    ('{"action": "scroll", "direction": "up"}', "scroll(0, -300)"),
    ('{"action": "scroll", "direction": "down", "amount": 500}', "scroll(0, 500)"),
    ('{"action": "answer", "text": "Paris"}', "send_msg_to_user('Paris')"),
    ('{"action": "send_msg_to_user", "message": "done"}', "send_msg_to_user('done')"),
    ('{"action": "noop"}', "noop()"),
    ("{'action': 'click', 'bid': '12'}", "click('12')"),
    ('```json\n{"name": "click", "arguments": {"element_id": "12"}}\n```', "click('12')"),
    ('{"name": "fill", "arguments": "{\\"bid\\": \\"5\\", \\"value\\": \\"hi\\"}"}', "fill('5', 'hi')"),
    ('{"thought": "send it", "action": {"action": "click", "bid": "12"}}', "click('12')"),
    ('{"action": "click(\'12\')"}', "click('12')"),
    ('{"function": "fill", "args": ["5", "x"]}', "fill('5', 'x')"),
    # WebArena-style
    ("click [12]", "click('12')"),
    ("type [5] [hello world] [1]", "fill('5', 'hello world')"),
    ("press [Enter]", "keyboard_press('Enter')"),
    ("scroll [down]", "scroll(0, 300)"),
    ("stop [42]", "send_msg_to_user('42')"),
    # other frameworks' names
    ("answer('Paris')", "send_msg_to_user('Paris')"),
    ("input_text('5', 'x')", "fill('5', 'x')"),
    ("type('5', 'x')", "fill('5', 'x')"),
    ("type('hello')", "keyboard_type('hello')"),
    ("wait()", "noop()"),
]


@pytest.mark.parametrize("text,expected", VALID)
def test_valid_outputs(text, expected):
    action, error = parse_action(text, elements=ELEMENTS)
    assert error is None, error
    assert action == expected


INVALID = [
    ("", "empty model output"),
    ("   \n ", "empty model output"),
    ("I think we should look at the inbox first.", "no action found"),
    ("teleport('12')", "unknown action 'teleport'"),
    ("click('99')", "element id '99' is not on the page"),
    ("click('Send button')", "invalid element id 'Send button'"),
    ("click()", "click is missing bid"),
    ("click(", "click is missing bid"),
    ("fill('5')", "fill is missing value"),
    ("fill('5', 'a', 'b')", "fill takes at most 2 arguments"),
    ("scroll(0, 'a lot')", "delta_y must be a number"),
    ("scroll('sideways')", "unknown scroll direction 'sideways'"),
    ("select_option('7', 'Green')", "'Green' is not an option of element '7'"),
    ("click('12', 'sideways')", "button must be one of left, middle, right"),
    ("mouse_click(100, 200)", "need screenshot mode"),
    ('{"bid": "12"}', "JSON action without an 'action' name"),
    ('{"action": "fly", "bid": "12"}', "unknown action 'fly'"),
    ("press('5', '')", "empty key"),
    ("fill('5', None)", "value must be text"),
]


@pytest.mark.parametrize("text,message", INVALID)
def test_invalid_outputs(text, message):
    action, error = parse_action(text, elements=ELEMENTS)
    assert action is None
    assert message in error
    assert "\n" not in error


def test_without_page_information_any_bid_is_accepted():
    assert parse_action("click('9999')") == ("click('9999')", None)


def test_bids_from_the_axtree_count_as_on_the_page():
    axtree = "RootWebArea 'Mail'\n\t[12] button 'Send'\n\t[88] StaticText 'Total'"
    assert bids_in_axtree(axtree) == {"12", "88"}
    assert parse_action("click('88')", elements=ELEMENTS, valid_bids=bids_in_axtree(axtree)) == ("click('88')", None)
    obs = Observation(goal="g", url="u", axtree=axtree, elements=(), screenshot=None, screenshot_hash=None,
                      messages=[], history=(), step_idx=0, task_id="t")
    assert parse_for_observation("click('88')", obs) == ("click('88')", None)
    assert parse_for_observation("click('5')", obs)[0] is None


def test_coordinates_in_screenshot_mode():
    assert parse_action("mouse_click(100, 200)", allow_coordinates=True, viewport=(1280, 720)) == ("mouse_click(100, 200)", None)
    assert parse_action("mouse_click(100.0, 200.5)", allow_coordinates=True) == ("mouse_click(100, 200.5)", None)
    action, error = parse_action("mouse_click(2000, 10)", allow_coordinates=True, viewport=(1280, 720))
    assert action is None and "outside the 1280x720 viewport" in error
    assert parse_action('{"action": "left_click", "coordinate": [640, 360]}', allow_coordinates=True)[0] == "mouse_click(640, 360)"
    assert parse_action('{"action": "click", "x": 10, "y": 20}', allow_coordinates=True)[0] == "mouse_click(10, 20)"
    assert parse_action("mouse_drag_and_drop(1, 2, 3, 4)", allow_coordinates=True)[0] == "mouse_drag_and_drop(1, 2, 3, 4)"


def test_relative_coordinates_are_rescaled_to_the_viewport():
    assert rescale_coordinates("mouse_click(500, 500)", 1000, (1280, 720)) == "mouse_click(640, 360)"
    assert rescale_coordinates("mouse_drag_and_drop(0, 0, 1000, 1000)", 1000, (1280, 720)) == "mouse_drag_and_drop(0, 0, 1280, 720)"
    assert rescale_coordinates("click('12')", 1000, (1280, 720)) == "click('12')"


def test_repairs_are_reported():
    parsed = parse_action_detailed("Action: click(12)")
    assert parsed.name == "click" and parsed.args == ("12",)
    assert "quoted a numeric element id" in parsed.repairs
    with pytest.raises(ActionParseError):
        parse_action_detailed("nothing here")


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    action, error = parse_action(f"click(__import__('pathlib').Path('{marker}').touch())")
    assert action is None and error
    assert not marker.exists()


def test_canonical_actions_run_through_browsergym_action_set():
    """Every canonical form must be accepted by the action set agisdk's environment executes."""
    from agisdk.REAL.browsergym.core.action.highlevel import HighLevelActionSet

    action_set = HighLevelActionSet(subsets=["chat", "infeas", "bid", "coord", "nav", "tab"], multiaction=False)
    for text, expected in VALID:
        code = action_set.to_python_code(expected)
        assert expected in code
    assert format_action("fill", ["5", "it's"]) == 'fill(\'5\', "it\'s")'


def test_png_size():
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (33, 17)).save(buffer, format="PNG")
    assert png_size(buffer.getvalue()) == (33, 17)
    assert png_size(b"not a png") is None


@pytest.mark.parametrize("output, grid_action, pixels", [
    ('{"action": "left_click", "coordinate": [500, 250]}', "mouse_click(500, 250)", "mouse_click(250, 80)"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 250]}}</tool_call>',
     "mouse_click(500, 250)", "mouse_click(250, 80)"),
    ('{"action": "right_click", "coordinate": [10, 20]}', "mouse_click(10, 20, 'right')", "mouse_click(5, 6, 'right')"),
    ('{"action": "double_click", "coordinate": [100, 1000]}', "mouse_dblclick(100, 1000)", "mouse_dblclick(50, 320)"),
    ('{"action": "mouse_move", "coordinate": [0, 0]}', "mouse_move(0, 0)", "mouse_move(0, 0)"),
    ('{"action": "scroll", "coordinate": [500, 500], "pixels": -300}', "scroll(0, 300)", "scroll(0, 300)"),
    ('{"action": "key", "keys": ["Control", "a"]}', "keyboard_press('Control+a')", "keyboard_press('Control+a')"),
    ('{"action": "double_click", "bid": "12"}', "dblclick('12')", "dblclick('12')"),
])
def test_qwen3_vl_computer_use_actions(output, grid_action, pixels):
    """Qwen3-VL answers on a 0..1000 grid; validated there, then rescaled to the 500x320 viewport."""
    action, error = parse_action(output, allow_coordinates=True, viewport=(1000, 1000))
    assert (action, error) == (grid_action, None)
    assert rescale_coordinates(action, 1000, (500, 320)) == pixels


def test_a_computer_use_click_off_the_grid_is_a_parse_error():
    action, error = parse_action('{"action": "left_click", "coordinate": [1200, 40]}', allow_coordinates=True, viewport=(1000, 1000))
    assert action is None and "outside the 1000x1000 viewport" in error


def test_page_actions_are_the_closed_list_a_constrained_policy_chooses_from():
    from halo_agent.actions import page_actions

    elements = [Element("12", "button", "OK", "click"), Element("14", "textbox", "To", "fill"),
                Element("16", "combobox", "Size", "select", ("S", "M")), Element("12", "button", "OK", "click")]
    assert page_actions(elements) == ["click('12')", "click('14')", "select_option('16', 'S')", "select_option('16', 'M')"]
    assert page_actions([]) == ["noop()"]
    assert all(parse_action(a, elements=elements)[0] == a for a in page_actions(elements))


def test_a_rollout_plans_every_task_seed_it_is_given():
    from halo_agent.rollout.config import RolloutConfig, RolloutError
    from halo_agent.rollout.tasks import plan_episodes
    from halo_agent.envs.base import TaskSpec

    task = TaskSpec(task_id="miniwob.click-tab", env="miniwob", site="miniwob")
    specs = plan_episodes(RolloutConfig(tasks=["click-tab"], task_seed=5, task_seeds=3, rollouts_per_task=2), "r", [task])
    assert [(s.task_seed, s.attempt_idx) for s in specs] == [(5, 0), (5, 1), (6, 0), (6, 1), (7, 0), (7, 1)]
    assert len({s.episode_id for s in specs}) == 6
    with pytest.raises(RolloutError, match="--task-seeds must be at least 1"):
        RolloutConfig(tasks=["click-tab"], task_seeds=0)
