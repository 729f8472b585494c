"""Deterministic recovery policies: loop detection, then loop breaking without a model call.

    loops = LoopDetector(repeats=2)
    loops.record(state_before, action, state_after)      # after every step
    loops.looping(state)                                 # the same action from the same state, again and again
    Recovery().action(obs, state, tried)                 # ("clear_obstruction", "click('20')") or None

In order, the first that applies: clear an obstruction (a cookie banner, modal or
pop-up, through the ``close_modal`` macro's program), retry with an alternative
element (one of the same kind not yet tried from this state), navigate back (when
the episode has left its first page), scroll. Each is recorded with
``action_source = 'recovery'`` and its name in the step's ``macro`` column.
"""

from __future__ import annotations

import collections
import dataclasses

from halo_agent.envs.base import element_for_action
from halo_agent.hierarchy.macros import MacroRefused, close_modal
from halo_agent.types import Observation

SCROLL = "scroll(0, 300)"
BACK = "go_back()"


class LoopDetector:
    """Counts (state, action) pairs and stalls within an episode."""

    def __init__(self, repeats: int = 2, stalled_steps: int = 3):
        if repeats < 2 or stalled_steps < 2:
            raise ValueError("a loop needs at least 2 repeats and 2 stalled steps")
        self.repeats = repeats
        self.stalled_steps = stalled_steps
        self.reset()

    def reset(self) -> None:
        self.pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.stalled = 0  # consecutive steps that left the page as it was
        self.last: tuple[str, str] | None = None

    def record(self, state_before: str, action: str | None, state_after: str | None) -> None:
        if action is None:
            return
        self.pairs[(state_before, action)] += 1
        self.last = (state_before, action)
        self.stalled = self.stalled + 1 if state_after == state_before else 0

    def looping(self, state: str) -> bool:
        """Whether the episode is stuck on ``state``: its last action repeated there, or the page no longer changes."""
        if self.last is None or self.last[0] != state:
            return False
        return self.pairs[self.last] >= self.repeats or self.stalled >= self.stalled_steps

    def broken(self) -> None:
        """A recovery acted: count the next repeats afresh."""
        self.stalled = 0
        if self.last is not None:
            self.pairs[self.last] = 0


@dataclasses.dataclass
class Recovery:
    """The recovery policies, tried in order; ``action`` gives the first that applies and was not tried here."""

    scroll: bool = True

    def action(self, obs: Observation, tried: set[str], start_url: str | None = None) -> tuple[str, str] | None:
        for name, action in self._candidates(obs, tried, start_url):
            if action not in tried:
                return name, action
        return None

    def _candidates(self, obs: Observation, tried: set[str], start_url: str | None):
        try:
            yield "clear_obstruction", close_modal(obs)[0]
        except MacroRefused:
            pass
        yield from (("alternative_element", a) for a in self._alternatives(obs, tried))
        if start_url is not None and obs.url.split("#", 1)[0] != start_url.split("#", 1)[0]:
            yield "go_back", BACK
        if self.scroll:
            yield "scroll", SCROLL

    @staticmethod
    def _alternatives(obs: Observation, tried: set[str]) -> list[str]:
        """The actions tried here on other elements of the same kind and role; then clicks on the untried clickable elements."""
        out: list[str] = []
        for action in sorted(tried):
            target = element_for_action(action, obs.elements)
            if target is None:
                continue
            quoted = repr(target.bid)
            out += [action.replace(quoted, repr(e.bid), 1) for e in obs.elements
                    if e.bid != target.bid and (e.kind, e.role) == (target.kind, target.role)]
        out += [f"click({e.bid!r})" for e in obs.elements if e.kind == "click"]
        return [a for a in dict.fromkeys(out) if a not in tried]
