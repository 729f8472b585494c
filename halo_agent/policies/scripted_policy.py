"""A scripted policy: a fixed plan of actions on elements named as the page names them.

For measurements and tests that need a known solution (whole or partial) of a task::

    policy = ScriptedPolicy([("click", "Compose"), ("fill", "To", "brian.king@example.com"),
                             ("click", "Send"), ("answer", "Sent.")])

Each step is ``(verb, element name[, text])`` with verb ``click`` or ``fill``, resolved at
that step against the page's elements (the first whose accessible name equals it), or
``("answer", text)``: ``send_msg_to_user(text)``. When the plan runs out the policy answers
``"Done."``. A name missing from the page is an error of the plan (``ScriptError``), not an
action the environment refuses.
"""

from __future__ import annotations

import time
from typing import Sequence

from halo_agent.types import Observation, PolicyOutput


class ScriptError(RuntimeError):
    """The plan names an element the page does not offer."""


class ScriptedPolicy:
    """Implements ``halo_agent.types.Policy``."""

    name = "scripted"
    model = None
    adapter = None
    uses_screenshot = False

    def __init__(self, plan: Sequence[tuple[str, ...]], policy_version: str = "scripted-v1"):
        for step in plan:
            if not step or step[0] not in ("click", "fill", "answer") or (step[0] == "fill" and len(step) != 3):
                raise ValueError(f"a plan step is (click, NAME), (fill, NAME, TEXT) or (answer, TEXT), got {step!r}")
        self.plan = [tuple(s) for s in plan]
        self.policy_version = policy_version
        self.last_samples: list[PolicyOutput] = []
        self._next = 0

    def reset(self, seed: int) -> None:  # noqa: ARG002 - the plan is the same for every seed
        self._next = 0

    def act(self, obs: Observation) -> PolicyOutput:
        start = time.perf_counter()
        step = self.plan[self._next] if self._next < len(self.plan) else ("answer", "Done.")
        self._next += 1
        if step[0] == "answer":
            action = f"send_msg_to_user({step[1]!r})"
        else:
            bid = next((e.bid for e in obs.elements if e.name == step[1]), None)
            if bid is None:
                raise ScriptError(f"step {self._next}: no element named {step[1]!r} on {obs.url}")
            action = f"click({bid!r})" if step[0] == "click" else f"fill({bid!r}, {step[2]!r})"
        out = PolicyOutput(model_output=action, action=action, action_source="scripted",
                           latency_ms=(time.perf_counter() - start) * 1000.0)
        self.last_samples = [out]
        return out

    def close(self) -> None:
        pass
