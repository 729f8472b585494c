"""A non-learned rule: act on the page element whose name the goal mentions.

The heuristic baseline of HALO's learning experiments (``bench/protocols/learning-v1.yaml``). It chooses
among the same closed list of actions a constrained model answers from (``halo_agent.actions.page_actions``:
a click per element, a ``select_option`` per option), so it is compared with a model on one action
interface. At each step, of the actions not yet taken in the episode:

1. an element (or a select's option) whose accessible name the goal mentions, quoted or as whole words
   (a quoted match first, then the longest name, then page order), unless its name is a generic
   confirmation word (``Submit``, ``OK``, ...);
2. else a generic confirmation element (one the goal names first);
3. else the first element in page order; ``noop()`` when every action was taken.

This solves the tasks where the goal names what to click (click-button, click-link, click-option,
click-checkboxes, choose-list, click-button-sequence, ...) and has nothing to say where it does not
(use-spinner, navigate-tree's hidden files): the experiment's protocol names those tasks.
"""

from __future__ import annotations

import re
import time
from typing import Sequence

from halo_agent.actions import compact_elements, format_action, parse_action_detailed, ActionParseError
from halo_agent.types import Element, Observation, PolicyOutput

GENERIC_NAMES = frozenset({"submit", "ok", "okay", "next", "done", "search", "go", "confirm", "yes", "close", "cancel"})
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|'([^']+)'")


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
    offered: list[tuple[tuple[str, ...], str, str]] = []  # (key, name, action) in page order
    for element in compact_elements(elements):
        if element.kind == "select" and element.options:
            offered += [((element.bid, o), o, format_action("select_option", [element.bid, o])) for o in element.options]
        else:
            offered.append(((element.bid,), element.name, format_action("click", [element.bid])))
    open_actions = [(i, name, action) for i, (key, name, action) in enumerate(offered) if key not in taken]
    if not open_actions:
        return "noop()"
    named = [(mentions(goal, name), len(_normal(name)), -i, action) for i, name, action in open_actions
             if _normal(name) not in GENERIC_NAMES and mentions(goal, name)]
    if named:
        return max(named)[3]
    generic = [(mentions(goal, name), -i, action) for i, name, action in open_actions if _normal(name) in GENERIC_NAMES]
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
        self.policy_version = policy_version or "goal-match-v1"
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
