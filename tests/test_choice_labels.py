"""Labelled choices: each constrained choice names its element before the action (``# 'Tab #2'`` then ``click('21')``).

The label is part of what the model scores and what the lake stores as the answer (``model_output``); the
action that runs and is stored as ``action`` is the canonical BrowserGym call.
"""

from __future__ import annotations

import pytest

from halo_agent.actions import choice_label, labelled_choice, page_actions, parse_action, parse_action_detailed
from halo_agent.types import Element

ELEMENTS = [
    Element("18", "tab", "Tab #1", "click"),
    Element("21", "link", "Tab #2", "click"),
    Element("16", "textbox", "", "fill"),
    Element("30", "combobox", "Size", "select", ("S", "M")),
    Element("31", "button", "Back (to list)\nnow", "click"),  # an action-like name on two lines
    Element("32", "button", "click('99')", "click"),
]


def test_a_labelled_choice_names_its_element_first_and_parses_to_the_canonical_action():
    plain = page_actions(ELEMENTS)
    labelled = page_actions(ELEMENTS, labels=True)
    assert labelled[:4] == ["# 'Tab #1'\nclick('18')", "# 'Tab #2'\nclick('21')", "# textbox\nclick('16')",
                            "# 'Size'\nselect_option('30', 'S')"]
    assert labelled[5] == "# 'Back (to list) now'\nclick('31')"  # one line: the label never spills into the code
    assert len(labelled) == len(plain) == len(set(labelled))
    for text, action in zip(labelled, plain):
        parsed = parse_action_detailed(text, ELEMENTS)
        assert parsed.action == action  # a name that reads like an action ("click('99')", "Back (") is not the action
        assert "dropped comment lines" in parsed.repairs
    assert page_actions([], labels=True) == ["noop()"]


def test_labels_are_one_line_and_bounded():
    assert choice_label(Element("1", "button", "  Ok \t", "click")) == "'Ok'"
    assert choice_label(Element("1", "checkbox", "", "click")) == "checkbox"
    assert choice_label(Element("1", "button", "x" * 100, "click")) == "'" + "x" * 40 + "'"
    assert labelled_choice("click('1')", "a\nb") == "# a b\nclick('1')"


def test_comment_lines_are_dropped_only_where_an_action_is_left():
    assert parse_action("# 'Tab #2'\nclick('21')  # and a trailing comment") == ("click('21')", None)
    assert parse_action("## Action\nfill('16', '#hashtag')") == ("fill('16', '#hashtag')", None)
    # An answer that is nothing but a comment is read as before (the parser is lenient with a model's text).
    assert parse_action("# click('21')") == ("click('21')", None)
    assert parse_action("# 'Tab #2'")[0] is None


# ----------------------------------------------------------------------------- scored by HALO's chat server

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """HALO's chat server around a tiny model with random weights (no warm-up: the labels' scoring, not skill).

    It answers raw logprobs (the model's own distribution), which these tests compare with what the trainer
    computes for the same answer, and by which covering ranks the forced choices."""
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_train.tiny_model import build_tiny_model

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = build_tiny_model(tmp_path_factory.mktemp("labels") / "tiny", vocab_size=1024)
    with ChatCompletionServer(LocalChatModel(str(folder), device="cpu", logprobs_mode="raw_logprobs"), served_model_name="tiny") as server:
        yield server
    torch.set_num_threads(previous)


def _observation():
    from halo_data import prompts
    from halo_agent.types import Observation

    page = prompts.elements_text((e.bid, e.role, e.name) for e in ELEMENTS[:3])
    messages = prompts.render_messages("Click on Tab #2.", "file:///click-tab.html", page, [])
    return Observation(goal="Click on Tab #2.", url="file:///click-tab.html", axtree=page, elements=ELEMENTS[:3],
                       screenshot=None, screenshot_hash=None, messages=messages, history=(), step_idx=0, task_id="miniwob.click-tab")


def test_the_chat_server_scores_a_labelled_choice_with_its_label(served):
    from halo_agent.policies.openai_policy import OpenAIPolicy
    from halo_data import prompts
    from halo_train.grpo import stored_completion_logprob

    obs = _observation()
    policy = OpenAIPolicy(model="tiny", base_url=served.url, temperature=1.0, n=6, seed=4, constrain_actions=True, choice_labels=True)
    policy.act(obs)
    labelled = page_actions(obs.elements, labels=True)
    assert served.received[-1]["choices"] == labelled
    assert policy.config()["choice_labels"] is True
    tokenizer, model = served.engine.tokenizer, served.engine.model
    for sample in policy.last_samples:
        assert sample.model_output in labelled and sample.parse_error is None
        assert sample.action == page_actions(obs.elements)[labelled.index(sample.model_output)]  # the canonical call runs
        # Scored with its label: the label's tokens, the action's, then EOS; what the trainer computes for the answer.
        assert tokenizer.decode(sample.completion_token_ids, skip_special_tokens=True) == sample.model_output
        assert len(sample.logprobs) == len(sample.completion_token_ids)
        assert len(sample.logprobs) > len(tokenizer(sample.action, add_special_tokens=False)["input_ids"]) + 1
        row = {"prompt": prompts.dumps(obs.messages), "model_output": sample.model_output, "temperature": 1.0,
               "completion_token_ids": sample.completion_token_ids, "logprobs": sample.logprobs,
               "logprobs_mode": sample.logprobs_mode, "draw": sample.draw, "choices": sample.choices}
        assert sample.logprob_sum == pytest.approx(stored_completion_logprob(model, tokenizer, row), abs=1e-4)


def test_labels_without_constrained_decoding_are_refused(served):
    from halo_agent.policies.openai_policy import OpenAIPolicy, PolicyConfigError

    with pytest.raises(PolicyConfigError, match="choice_labels labels the choices of constrained decoding"):
        OpenAIPolicy(model="tiny", base_url=served.url, choice_labels=True)
    with pytest.raises(PolicyConfigError, match="choice_labels must be true or false"):
        OpenAIPolicy(model="tiny", base_url=served.url, constrain_actions=True, choice_labels="yes")


@pytest.mark.parametrize("n", [8, 2])
def test_covering_the_choices_draws_the_action_then_forces_each_other_choice_in_the_pages_order(served, n):
    from halo_agent.policies.openai_policy import OpenAIPolicy

    obs = _observation()
    labelled = page_actions(obs.elements, labels=True)
    policy = OpenAIPolicy(model="tiny", base_url=served.url, temperature=1.0, n=n, seed=4, constrain_actions=True,
                          choice_labels=True, cover_choices=True)
    served.received.clear()
    action = policy.act(obs)
    requests = list(served.received)
    # One draw among all the choices (n=1), then one forced request for each other choice.
    assert requests[0]["choices"] == labelled and requests[0]["n"] == 1
    assert sorted(r["choices"][0] for r in requests[1:]) == sorted(c for c in labelled if c != action.model_output)
    assert all(len(r["choices"]) == 1 and r["n"] == 1 for r in requests[1:])
    samples = policy.last_samples
    assert samples[0] is action and len(samples) == min(n, len(labelled))
    assert len({s.model_output for s in samples}) == len(samples) and {s.model_output for s in samples} <= set(labelled)
    # Each forced choice carries the tokens the engine spelled it with and no logprobs: a one-choice mask's say
    # nothing of the page's draw (under raw_logprobs too, as vLLM masks the logits it computes them from).
    tokenizer = served.engine.tokenizer
    assert action.logprob_sum is not None
    for sample in samples[1:]:
        assert sample.logprobs is None and sample.logprob_sum is None and sample.choices == labelled
        assert tokenizer.decode(sample.completion_token_ids, skip_special_tokens=True) == sample.model_output
    for sample in samples:
        assert sample.action == page_actions(obs.elements)[labelled.index(sample.model_output)]
    assert [s.model_output for s in samples[1:]] == [c for c in labelled if c != action.model_output][: n - 1]
    assert policy.config()["cover_choices"] is True


def test_covering_needs_constrained_decoding(served):
    from halo_agent.policies.openai_policy import OpenAIPolicy, PolicyConfigError

    with pytest.raises(PolicyConfigError, match="cover_choices covers the choices of constrained decoding"):
        OpenAIPolicy(model="tiny", base_url=served.url, n=4, cover_choices=True)


def test_a_stored_answer_gets_the_label_of_the_element_it_acted_on():
    from halo_agent.actions import labelled_answer

    page = "[17] tablist ''\n[18] tab 'Tab #1'\n[21] link 'Tab #2'\n[30] button 'it's \"ok\"'"
    assert labelled_answer("click('21')", page) == "# 'Tab #2'\nclick('21')"
    assert labelled_answer("click('17')", page) == "# tablist\nclick('17')"
    assert labelled_answer("fill('30', 'x')", page) == "# 'it's \"ok\"'\nfill('30', 'x')"
    assert labelled_answer("click('99')", page) is None  # not on that page
    assert labelled_answer("scroll(0, 200)", page) is None and labelled_answer("no action", page) is None
    # What page_actions offers with labels is what a stored answer on that page becomes.
    from halo_data import prompts

    elements = ELEMENTS[:3]
    page = prompts.elements_text((e.bid, e.role, e.name) for e in elements)
    assert [labelled_answer(a, page) for a in page_actions(elements)] == page_actions(elements, labels=True)


def test_an_element_wrapping_a_same_named_one_is_listed_once_as_the_inner_one():
    """A tab whose link carries the same name is one thing to act on: the compact views list the link only."""
    from halo_agent.actions import compact_elements
    from halo_agent.envs.base import elements_from_axtree

    def node(node_id, bid, role, name, children=()):
        return {"nodeId": node_id, "browsergym_id": bid, "role": {"value": role}, "name": {"value": name},
                "childIds": list(children)}

    axtree = {"nodes": [
        node("1", "17", "tablist", "", ["2", "4"]),
        node("2", "18", "tab", "Tab #1", ["3"]), node("3", "19", "link", "Tab #1", ["5"]),
        node("4", "20", "tab", "Tab #2", ["6"]), node("6", "21", "link", "Second"),  # a different name: both stay
        {"nodeId": "5", "role": {"value": "StaticText"}, "name": {"value": "Tab #1"}},
    ]}
    elements = elements_from_axtree(axtree, {"17": {"clickable": True}})  # as BrowserGym marks the tablist
    assert [(e.bid, e.wraps) for e in elements] == [("17", None), ("18", "19"), ("19", None), ("20", None), ("21", None)]
    assert [e.bid for e in compact_elements(elements)] == ["17", "19", "20", "21"]
    assert page_actions(elements, labels=True)[:2] == ["# tablist\nclick('17')", "# 'Tab #1'\nclick('19')"]
    assert parse_action("click('18')", elements=elements)[0] == "click('18')"  # the wrapper is still a valid target


def test_the_elements_observation_of_a_real_tab_page_lists_each_tab_once_then_the_goal(tmp_path):
    import json

    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake

    run_rollouts(RolloutConfig(env="miniwob", tasks=["click-tab"], rollouts_per_task=1, policy="random", observation="elements",
                               max_steps=1, task_seed=3, seed=0, lake=str(tmp_path / "lake"), run_id="tabs", progress=False))
    step = Lake.open(str(tmp_path / "lake")).query_arrow("select prompt, prompt_version from steps").to_pylist()[0]
    text = json.loads(step["prompt"])[-1]["content"]
    page = text.split("Page:\n", 1)[1]
    assert text.splitlines()[-2:] == [f"Goal: {text.split('Goal: ', 1)[1].splitlines()[0]}", "Next action:"]
    assert "URL: click-tab.html\n" in text  # a local file's URL is its file name: no install path in the prompt
    assert text.count("Goal: ") == 1 and "Tab #" in text.splitlines()[-2]  # the goal comes after the page, once
    names = [line.split(" ", 2)[2] for line in page.splitlines() if line.startswith("[")]
    tabs = [n for n in names if "Tab #" in n]
    assert len(tabs) >= 2 and len(tabs) == len(set(tabs))
    assert all(line.split()[1] == "link" for line in page.splitlines() if line.startswith("[") and "Tab #" in line)
    assert step["prompt_version"] == "halo-prompt-v3-elements"
