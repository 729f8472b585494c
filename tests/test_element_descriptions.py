"""Elements without an accessible name are described in the elements observation: what their markup calls them and
the text they hold or sit in (``halo_agent.envs.base.describe_unnamed``, prompt ``halo-prompt-v3-elements``)."""

from __future__ import annotations

import re

import pytest


def node(node_id, role, name="", children=(), bid=None, ignored=False):
    out = {"nodeId": node_id, "role": {"value": role}, "name": {"value": name}, "childIds": list(children)}
    if bid:
        out["browsergym_id"] = bid
    if ignored:
        out["ignored"] = True
    return out


def inbox_axtree():
    """An inbox row as Chromium's AXTree has it: a row of sender and subject text, then its two CSS-drawn icons;
    a Submit button beside a select; a list item holding its own text; a hidden email's text."""
    return {"nodes": [
        node("1", "RootWebArea", "Inbox", ["2", "20", "30", "40"]),
        node("2", "generic", "", ["3", "4", "5"]),                      # the row
        node("3", "StaticText", "Hazel"), node("4", "StaticText", "Nibh   nisl."),
        node("5", "generic", "", ["6", "7"]),                           # its actions
        node("6", "image", "", bid="26"), node("7", "image", "", bid="27"),
        node("20", "generic", "", ["21", "22"]),                        # a form: a select, then Submit
        node("21", "combobox", "", bid="13"), node("22", "button", "Submit", ["23"], bid="19"),
        node("23", "StaticText", "Submit"),
        node("30", "list", "", ["31"]),
        node("31", "listitem", "", ["32", "33"], bid="17"),
        node("32", "StaticText", "Cheree"), node("33", "StaticText", "Sergio, hidden", ignored=True),
        node("40", "generic", "", ["41"]),
        node("41", "image", "", bid="50"),                              # nothing around it but the page's root
    ]}


CLICKABLE = {bid: {"clickable": True} for bid in ("26", "27", "50")}  # as the DOM snapshot marks the icons


def test_an_unnamed_element_is_described_by_its_markup_and_the_text_it_holds_or_sits_in():
    from halo_agent.envs.base import elements_from_axtree

    markup = {"26": "trash", "27": "star", "13": "options"}
    elements = {e.bid: e for e in elements_from_axtree(inbox_axtree(), CLICKABLE, markup)}
    assert elements["26"].description == "trash; in 'Hazel Nibh nisl.'"  # the row's text, whitespace as one space
    assert elements["27"].description == "star; in 'Hazel Nibh nisl.'"
    # The form's text is the Submit button's, another listed element: not the select's.
    assert elements["13"].description == "options"
    # Its own text, the hidden part left out; no markup name.
    assert elements["17"].description == "'Cheree'"
    # Text further up than DESCRIPTION_LEVELS ancestors (the root's) is not its row: nothing to say.
    assert elements["50"].description == ""
    assert elements["19"].name == "Submit" and elements["19"].description == ""  # a named element is as it was


def test_a_description_is_cut_to_its_length_and_a_deep_tree_is_walked_without_recursion():
    from halo_agent.envs.base import DESCRIPTION_TEXT_CHARS, elements_from_axtree

    depth = 5000  # deeper than Python's recursion limit
    nodes = [node(str(i), "generic", "", [str(i + 1)]) for i in range(depth)]
    nodes += [node(str(depth), "generic", "", [str(depth + 1), str(depth + 2)]),
              node(str(depth + 1), "StaticText", "word " * 30), node(str(depth + 2), "link", "", bid="9")]
    nodes[0]["childIds"] = ["1"]
    (element,) = elements_from_axtree({"nodes": nodes}, {})
    assert element.description == f"in '{('word ' * 30)[:DESCRIPTION_TEXT_CHARS]}'"


def test_markup_names_come_from_the_dom_snapshot_title_first_then_alt_id_class_and_image_file():
    from halo_agent.envs.base import DESCRIPTION_MARKUP_CHARS, markup_names

    strings = ["bid", "1", "class", "trash icon", "id", "open-search", "title", "Delete", "src",
               "/img/star.png?v=2", "2", "3", "4", "alt", "", "5", "x" * 40]
    index = {s: i for i, s in enumerate(strings)}

    def attrs(*pairs):
        return [index[v] for pair in pairs for v in pair]

    snapshot = {"strings": strings, "documents": [{"nodes": {"attributes": [
        attrs(("bid", "1"), ("class", "trash icon"), ("id", "open-search"), ("title", "Delete")),  # title wins
        attrs(("class", "trash icon"), ("bid", "2")),                                               # its first class
        attrs(("bid", "3"), ("src", "/img/star.png?v=2")),                                          # the file's stem
        attrs(("bid", "4"), ("alt", "")),                                                           # empty: nothing
        attrs(("bid", "5"), ("id", "x" * 40)),
        attrs(("id", "open-search")),                                                               # no bid
    ]}}]}
    assert markup_names(snapshot) == {"1": "Delete", "2": "trash", "3": "star", "5": "x" * DESCRIPTION_MARKUP_CHARS}
    assert markup_names({}) == {}


def test_the_observation_line_and_a_labelled_choice_carry_the_description():
    from halo_agent.actions import labelled_answer, page_actions
    from halo_agent.envs.base import elements_from_axtree
    from halo_data import prompts

    elements = elements_from_axtree(inbox_axtree(), CLICKABLE, {"26": "trash", "27": "star", "13": "options"})
    page = prompts.elements_text((e.bid, e.role, e.name, e.description) for e in elements)
    assert page.splitlines()[:2] == ["[26] image '' (trash; in 'Hazel Nibh nisl.')",
                                     "[27] image '' (star; in 'Hazel Nibh nisl.')"]
    assert "[19] button 'Submit'" in page.splitlines() and "[50] image ''" in page.splitlines()
    assert prompts.elements_text([("5", "button", "OK")]) == "[5] button 'OK'"  # (bid, role, name) as before
    # A stored answer on that page becomes the labelled choice page_actions offers.
    clicks = [a for a in page_actions(elements) if a.startswith("click(")]
    assert [labelled_answer(a, page) for a in clicks] == [a for a in page_actions(elements, labels=True) if "click(" in a]
    assert labelled_answer("click('26')", page) == "# image (trash; in 'Hazel Nibh nisl.')\nclick('26')"


@pytest.mark.browser
def test_on_a_real_inbox_the_description_alone_finds_the_named_senders_trash_icon():
    """email-inbox-delete's icons are spans drawn by CSS: without descriptions its elements observation is seven
    ``image ''`` lines. With them, the trash icon whose row names the goal's sender solves the task in one click,
    and the goal-match rule finds it."""
    from halo_agent.envs.miniwob import MiniWoBEnv
    from halo_agent.policies.goal_match_policy import choose
    from halo_agent.rollout.episode import build_observation
    from halo_data import prompts

    env = MiniWoBEnv(headless=True, screenshots=False)
    try:
        spec = env.task_spec("miniwob.email-inbox-delete")
        for seed in (0, 1):
            page = env.reset(spec, seed)
            sender = re.search(r"email by (\S+) and", page.goal).group(1)
            text = prompts.elements_text((e.bid, e.role, e.name, e.description) for e in page.elements)
            lines = [line for line in text.splitlines() if "(trash; in '" + sender + " " in line]
            assert len(lines) == 1, text
            bid = re.match(r"\[(\w+)\]", lines[0]).group(1)
            outcome = env.step(f"click('{bid}')")
            assert outcome.terminated and outcome.reward == 1.0  # MiniWoB's own reward
            # The goal-match rule reads the same descriptions and picks that icon.
            observation = build_observation(env.reset(spec, seed), spec.task_id, [], 0, False, None,
                                            observation_format="elements")
            assert choose(observation.goal, observation.elements, []) == f"click('{bid}')"
    finally:
        env.close()


def test_the_elements_v2_observation_renders_learning_v2s_prompts_without_descriptions():
    from halo_agent.envs.base import PageState, elements_from_axtree
    from halo_agent.rollout.episode import build_observation
    from halo_data import prompts

    elements = elements_from_axtree(inbox_axtree(), CLICKABLE, {"26": "trash", "27": "star", "13": "options"})
    page = PageState(goal="Find the email by Hazel and click the trash icon.", url="file:///inbox.html", axtree="",
                     elements=elements, screenshot=None)

    def user_text(observation: str) -> str:
        obs = build_observation(page, "miniwob.email-inbox-delete", [], 0, False, None, observation_format=observation)
        return obs.messages[-1]["content"]

    assert "[26] image '' (trash; in 'Hazel Nibh nisl.')" in user_text("elements")
    old = user_text("elements-v2")
    assert "[26] image ''\n[27] image ''" in old and "(trash" not in old
    assert old == user_text("elements").replace(" (trash; in 'Hazel Nibh nisl.')", "").replace(
        " (star; in 'Hazel Nibh nisl.')", "").replace(" (options)", "").replace(" ('Cheree')", "")
    assert prompts.PROMPT_VERSIONS["elements-v2"] == "halo-prompt-v2-elements"
    # Nor do its elements: a rule or a labelled choice knows no more than the page text says.
    obs = build_observation(page, "miniwob.email-inbox-delete", [], 0, False, None, observation_format="elements-v2")
    assert not any(e.description for e in obs.elements)


def test_a_malformed_tree_whose_children_cycle_is_described_without_hanging():
    from halo_agent.envs.base import elements_from_axtree

    nodes = [node("1", "generic", "", ["2"]), node("2", "generic", "", ["3", "1"]),  # 2 lists its own parent
             node("3", "StaticText", "Hazel"), node("4", "image", "", bid="26")]
    nodes[1]["childIds"].append("4")
    (element,) = elements_from_axtree({"nodes": nodes}, CLICKABLE, {"26": "trash"})
    assert element.description.startswith("trash; in 'Hazel")
