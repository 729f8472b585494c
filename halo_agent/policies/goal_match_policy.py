"""A non-learned rule: act on the page element whose name the goal mentions.

The heuristic baseline of HALO's learning experiments (``bench/protocols/learning-v1.yaml``). It chooses
among the same closed list of actions a constrained model answers from (``halo_agent.actions.page_actions``:
a click per element, a ``select_option`` per option), so it is compared with a model on one action
interface. At each step, of the actions not yet taken in the episode:

1. an element (or a select's option) whose label the goal mentions, quoted or as whole words (a quoted
   match first, then the most words matched, then the longest label, then page order), unless its label
   is a generic confirmation word (``Submit``, ``OK``, ...). The label is the accessible name; for an
   element without one, the text its description says it holds (``'Lyda'``), else the words of its
   description (``trash; in 'Hazel Nibh nisl.'``: the goal "Find the email by Hazel and click the trash
   icon" mentions two of them, ``trash`` and ``Hazel``);
2. else a generic confirmation element (one the goal names first);
3. else the first element in page order; ``noop()`` when every action was taken.

This solves the tasks where the goal names what to click (click-button, click-link, click-option,
click-checkboxes, choose-list, click-button-sequence, ...) and, where the observation describes unnamed
elements (``--observation elements``), an inbox's icons and a tree's visible files; it has nothing to say
where the goal names nothing on the page (use-spinner, navigate-tree's hidden files). Under
``--observation elements-v2`` the elements carry no descriptions, and the rule is goal-match-v1's.
"""

from __future__ import annotations

import re
import time
from typing import Sequence

from halo_agent.actions import compact_elements, format_action, parse_action_detailed, ActionParseError
from halo_agent.types import Element, Observation, PolicyOutput

GENERIC_NAMES = frozenset({"submit", "ok", "okay", "next", "done", "search", "go", "confirm", "yes", "close", "cancel"})
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|'([^']+)'")
# A description: what the markup calls the element, then the text it holds ('...') or sits in (in '...').
_DESCRIPTION = re.compile(r"^(?:(?P<markup>[^;']*?)(?:; |$))?(?:(?P<around>in )?'(?P<text>.*)')?$")
_WORD = re.compile(r"[^\W_]{3,}")  # description words the goal may name: three letters or more, not these
_COMMON_WORDS = frozenset({"the", "and", "for", "with", "you", "your", "this", "that", "from", "are", "was", "not"})


def _normal(text: str) -> str:
    return " ".join(str(text or "").lower().split())


def mentions(goal: str, name: str) -> int:
    """How the goal names ``name``: 2 quoted as a whole, 1 as whole words in its text, 0 not at all."""
    name = _normal(name)
    if not name:
        return 0
    normal_goal = _normal(goal)
    if name in {_normal(next(g for g in m.groups() if g is not None)) for m in _QUOTED.finditer(goal or "")}:
        return 2
    return 1 if re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", normal_goal) else 0


def label(element: Element) -> tuple[str, tuple[str, ...]]:
    """What the rule matches the goal against: (a label, matched whole; description words, each matched alone).
    The accessible name, else the text the element holds; else no label and its description's words."""
    if element.name or not element.description:
        return element.name, ()
    m = _DESCRIPTION.match(element.description)
    if m is None:
        return "", tuple(_WORD.findall(element.description))
    if m.group("text") is not None and not m.group("around"):
        return m.group("text"), ()
    return "", tuple(_WORD.findall(f"{m.group('markup') or ''} {m.group('text') or ''}"))


def _rank(goal: str, element_label: tuple[str, tuple[str, ...]]) -> tuple[int, int, int]:
    """(how the goal names the label: 2 quoted, 1 in words, 0 not; description words it names; label length)."""
    name, words = element_label
    if name:
        level = mentions(goal, name)
        return level, int(level > 0), len(_normal(name))
    named = {w.lower() for w in words if w.lower() not in _COMMON_WORDS and mentions(goal, w)}
    return int(bool(named)), len(named), 0


def _taken(history: Sequence[str]) -> set[tuple[str, ...]]:
    """The (bid) clicks and (bid, option) selections of the episode so far."""
    taken: set[tuple[str, ...]] = set()
    for action in history:
        try:
            parsed = parse_action_detailed(action)
        except ActionParseError:
            continue
        if parsed.name in ("click", "select_option") and parsed.args:
            taken.add(tuple(str(a) for a in parsed.args[:2]))
    return taken


def choose(goal: str, elements: Sequence[Element], history: Sequence[str]) -> str:
    """The rule's action on a page (see the module docstring)."""
    taken = _taken(history)
    offered: list[tuple[tuple[str, ...], tuple[str, tuple[str, ...]], str]] = []  # (key, label, action) in page order
    for element in compact_elements(elements):
        if element.kind == "select" and element.options:
            offered += [((element.bid, o), (o, ()), format_action("select_option", [element.bid, o])) for o in element.options]
        else:
            offered.append(((element.bid,), label(element), format_action("click", [element.bid])))
    open_actions = [(i, lab, action) for i, (key, lab, action) in enumerate(offered) if key not in taken]
    if not open_actions:
        return "noop()"
    ranked = [(_rank(goal, lab), -i, action) for i, lab, action in open_actions if _normal(lab[0]) not in GENERIC_NAMES]
    named = [r for r in ranked if r[0][0]]
    if named:
        return max(named)[2]
    generic = [(mentions(goal, lab[0]), -i, action) for i, lab, action in open_actions if _normal(lab[0]) in GENERIC_NAMES]
    if generic:
        return max(generic)[2]
    return open_actions[0][2]


class GoalMatchPolicy:
    """Implements ``halo_agent.types.Policy``; deterministic, so temperature and seed change nothing."""

    name = "goal_match"
    model = None
    adapter = None
    uses_screenshot = False

    def __init__(self, policy_version: str | None = None, n: int = 1, **_: object):
        self.policy_version = policy_version or "goal-match-v2"
        self.n = max(1, int(n))
        self.last_samples: list[PolicyOutput] = []

    def reset(self, seed: int) -> None:  # noqa: ARG002 - the rule draws nothing
        self.last_samples = []

    def act(self, obs: Observation) -> PolicyOutput:
        start = time.perf_counter()
        action = choose(obs.goal, list(obs.elements), list(obs.history))
        out = PolicyOutput(model_output=action, action=action, action_source="heuristic",
                           latency_ms=(time.perf_counter() - start) * 1000.0)
        self.last_samples = [out] * self.n
        return out

    def close(self) -> None:
        pass
