"""The goal-match rule (learning-v1's heuristic arm) and the random policy's constrained draw, on built pages."""

from __future__ import annotations

from halo_agent.actions import page_actions
from halo_agent.policies import make_policy
from halo_agent.policies.goal_match_policy import choose, mentions
from halo_agent.policies.random_policy import RandomPolicy
from halo_agent.types import Element, Observation

RADIOS = [Element("18", "radio", "gijNR", "click"), Element("21", "radio", "uhhkXL", "click"),
          Element("24", "radio", "TX", "click"), Element("33", "button", "Submit", "click")]


def _obs(goal: str, elements, history=()) -> Observation:
    return Observation(goal=goal, url="file:///task.html", axtree="", elements=elements, screenshot=None,
                       screenshot_hash=None, messages=[], history=list(history), step_idx=len(history), task_id="miniwob.t")


def test_mentions_prefers_quoted_names_and_whole_words():
    assert mentions('Click on the "Submit" button.', "submit") == 2
    assert mentions("Select uhhkXL and click Submit.", "uhhkXL") == 1
    assert mentions("Select uhhkXL and click Submit.", "TX") == 0  # inside no word of the goal
    assert mentions("Select uhhkXL and click Submit.", "") == 0


def test_the_named_option_first_then_submit_then_nothing_new():
    goal = "Select uhhkXL and click Submit."
    assert choose(goal, RADIOS, []) == "click('21')"
    assert choose(goal, RADIOS, ["click('21')"]) == "click('33')"
    # with every named element taken, the first element not yet acted on; nothing left: noop
    assert choose(goal, RADIOS, ["click('21')", "click('33')"]) == "click('18')"
    everything = [f"click('{e.bid}')" for e in RADIOS]
    assert choose(goal, RADIOS, everything) == "noop()"


def test_several_named_checkboxes_are_each_clicked_once_before_submit():
    boxes = [Element(str(i), "checkbox", name, "click") for i, name in enumerate(["nYs", "0QL", "kite", "Submit"])]
    goal = "Select nYs, 0QL and click Submit."
    history: list[str] = []
    for _ in range(3):
        history.append(choose(goal, boxes, history))
    assert sorted(history[:2]) == ["click('0')", "click('1')"] and history[2] == "click('3')"


def test_a_select_option_the_goal_names_and_the_policy_interface():
    elements = [Element("5", "combobox", "", "select", options=("Lara", "Kenya", "Bria")), Element("9", "button", "Submit", "click")]
    policy = make_policy("goal_match")
    out = policy.act(_obs("Select Kenya from the list and click Submit.", elements))
    assert out.action == "select_option('5', 'Kenya')" and out.action_source == "heuristic"
    assert out.action in page_actions(elements)  # the constrained model's interface


def test_the_random_policy_constrained_draws_only_the_offered_choices():
    elements = [Element("3", "textbox", "Name", "fill"), Element("5", "combobox", "", "select", options=("a", "b")),
                Element("7", "button", "Go", "click")]
    offered = set(page_actions(elements))
    policy = RandomPolicy(seed=1, constrain_actions=True)
    drawn = {policy.act(_obs("goal", elements)).action for _ in range(60)}
    assert drawn == offered  # every choice drawn, never a fill
    assert RandomPolicy(temperature=0, constrain_actions=True).act(_obs("goal", elements)).action == page_actions(elements)[0]


def test_unnamed_elements_are_matched_by_the_text_they_hold_or_their_descriptions_words():
    from halo_agent.policies.goal_match_policy import label

    inbox = [Element("17", "image", "", "click", description="open-search; in 'Primary'"),
             Element("26", "image", "", "click", description="trash; in 'Hazel Nibh nisl.'"),
             Element("27", "image", "", "click", description="star; in 'Hazel Nibh nisl.'"),
             Element("36", "image", "", "click", description="trash; in 'Roslyn Morbi porta.'"),
             Element("37", "image", "", "click", description="star; in 'Roslyn Morbi porta.'")]
    assert label(inbox[1]) == ("", ("trash", "Hazel", "Nibh", "nisl"))
    assert choose("Find the email by Hazel and click the trash icon to delete it.", inbox, []) == "click('26')"
    assert choose("Find the email by Roslyn and click the star icon to mark it as important.", inbox, []) == "click('37')"
    # the text an element holds is its label, matched whole (a quoted match first)
    tree = [Element("17", "listitem", "", "click", description="expandable; 'Renda'"),
            Element("33", "listitem", "", "click", description="'Lyda'")]
    assert label(tree[1]) == ("Lyda", ())
    assert choose('Find and click on the folder or file named "Lyda".', tree, []) == "click('33')"
    # without descriptions (--observation elements-v2) the rule knows no more than the page text: goal-match-v1's
    bare = [Element(e.bid, e.role, e.name, e.kind) for e in inbox]
    assert choose("Find the email by Hazel and click the trash icon to delete it.", bare, []) == "click('17')"
    # a named element the goal mentions still wins over a description matched by one word
    mixed = [Element("5", "image", "", "click", description="star; in 'Hazel'"), Element("6", "button", "Star", "click")]
    assert choose("Click the star.", mixed, []) == "click('6')"
    assert make_policy("goal_match").policy_version == "goal-match-v2"
