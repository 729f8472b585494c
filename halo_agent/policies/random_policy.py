"""The random policy: uniform over the actions the current page offers; HALO's offline default.

Each step picks one of the page's clickable, fillable or selectable elements
(``Observation.elements``, read from the AXTree) and emits the BrowserGym action
for it: ``click('12')``, ``fill('7', 'word')`` with a short random word, or
``select_option('9', 'option')``. Sampling is seeded per episode, so the same
(seed, episode) gives the same actions. Temperature 0 is greedy in the sense a
model policy is: always the page's first offered action, whatever the seed.
With ``n > 1`` each call draws ``n`` actions, the first of which is taken; all of
them are in ``last_samples``, as a model policy's samples are (per-state candidates).
"""

from __future__ import annotations

import random
import time

from halo_agent.types import Element, Observation, PolicyOutput

# Short words for text fields: common MiniWoB answers and filler.
WORDS = (
    "yes", "no", "ok", "red", "blue", "green", "cat", "dog", "home", "mail", "alex", "kim", "sam",
    "data", "web", "test", "hello", "agent", "apple", "river", "stone", "seven", "12", "2024",
)

NO_ACTION = "noop(0)"


def action_for(element: Element, rng: random.Random) -> str:
    if element.kind == "fill":
        return f"fill({element.bid!r}, {rng.choice(WORDS)!r})"
    if element.kind == "select" and element.options:
        return f"select_option({element.bid!r}, {rng.choice(element.options)!r})"
    return f"click({element.bid!r})"


class RandomPolicy:
    """Implements ``halo_agent.types.Policy``."""

    name = "random"
    model = None
    adapter = None
    policy_version = "random-v1"
    uses_screenshot = False

    def __init__(self, temperature: float = 1.0, seed: int = 0, n: int = 1, **_: object):
        if int(n) < 1:
            raise ValueError("n must be at least 1")
        self.temperature = float(temperature)
        self.rng = random.Random(seed)
        self.n = int(n)
        self.last_samples: list[PolicyOutput] = []

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def act(self, obs: Observation) -> PolicyOutput:
        start = time.perf_counter()
        actions = [self._draw(list(obs.elements)) for _ in range(self.n)]
        latency_ms = (time.perf_counter() - start) * 1000.0
        self.last_samples = [
            PolicyOutput(model_output=action, action=action, action_source="random", latency_ms=latency_ms) for action in actions
        ]
        return self.last_samples[0]

    def _draw(self, elements: list[Element]) -> str:
        if not elements:
            return NO_ACTION
        if self.temperature <= 0:
            return action_for(elements[0], random.Random(0))
        return action_for(self.rng.choice(elements), self.rng)

    def close(self) -> None:
        pass
