"""The random policy: uniform over the actions the current page offers; HALO's offline default.

In the os environment it draws from the commands the environment lists (``extra["commands"]``).

Each step picks one of the page's clickable, fillable or selectable elements
(``Observation.elements``, read from the AXTree) and emits the BrowserGym action
for it: ``click('12')``, ``fill('7', 'word')`` with a short random word, or
``select_option('9', 'option')``. Sampling is seeded per episode, so the same
(seed, episode) gives the same actions. Temperature 0 is greedy in the sense a
model policy is: always the page's first offered action, whatever the seed.
``constrain_actions=True`` draws uniformly from the closed list a constrained model answers from
(``halo_agent.actions.page_actions``: a click per element, one ``select_option`` per option; no fills),
so a random baseline shares a constrained policy's action interface.
With ``n > 1`` each call draws ``n`` actions, the first of which is taken; all of
them are in ``last_samples``, as a model policy's samples are (per-state candidates).

Where the environment ends an episode on an answer (REAL: ``send_msg_to_user``,
announced as ``Observation.extra["finish_action"]``), the policy answers with
probability ``finish_probability`` at each step, and always on the episode's last
step (``extra["steps_left"] == 1``), so the task's evaluator scores every episode.
"""

from __future__ import annotations

import random
import time

from halo_agent.actions import page_actions
from halo_agent.types import Element, Observation, PolicyOutput

# Short words for text fields: common MiniWoB answers and filler.
WORDS = (
    "yes", "no", "ok", "red", "blue", "green", "cat", "dog", "home", "mail", "alex", "kim", "sam",
    "data", "web", "test", "hello", "agent", "apple", "river", "stone", "seven", "12", "2024",
)

NO_ACTION = "noop(0)"
FINISH_ACTIONS = {"send_msg_to_user": "send_msg_to_user('Done.')"}


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

    def __init__(self, temperature: float = 1.0, seed: int = 0, n: int = 1, finish_probability: float = 0.05,
                 constrain_actions: bool = False, **_: object):
        if not isinstance(constrain_actions, bool):
            raise ValueError(f"constrain_actions must be true or false, got {constrain_actions!r}")
        self.constrain_actions = constrain_actions
        if int(n) < 1:
            raise ValueError("n must be at least 1")
        if not 0.0 <= float(finish_probability) <= 1.0:
            raise ValueError("finish_probability must be between 0 and 1")
        self.finish_probability = float(finish_probability)
        self.temperature = float(temperature)
        self.rng = random.Random(seed)
        self.n = int(n)
        self.last_samples: list[PolicyOutput] = []

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def act(self, obs: Observation) -> PolicyOutput:
        start = time.perf_counter()
        commands = obs.extra.get("commands")
        finish = FINISH_ACTIONS.get(obs.extra.get("finish_action") or "")
        if commands:
            actions = [self._draw_command(commands) for _ in range(self.n)]
        else:
            actions = [self._draw(list(obs.elements), finish, obs.extra.get("steps_left")) for _ in range(self.n)]
        latency_ms = (time.perf_counter() - start) * 1000.0
        self.last_samples = [
            PolicyOutput(model_output=action, action=action, action_source="random", latency_ms=latency_ms) for action in actions
        ]
        return self.last_samples[0]

    def _draw(self, elements: list[Element], finish: str | None = None, steps_left: int | None = None) -> str:
        if finish is not None and (steps_left == 1 or (self.temperature > 0 and self.rng.random() < self.finish_probability)):
            return finish
        if not elements:
            return NO_ACTION
        if self.constrain_actions:
            choices = page_actions(elements)
            return choices[0] if self.temperature <= 0 else self.rng.choice(choices)
        if self.temperature <= 0:
            return action_for(elements[0], random.Random(0))
        return action_for(self.rng.choice(elements), self.rng)

    def _draw_command(self, commands: list[str]) -> str:
        """An environment whose actions are commands (os) lists the ones a random policy may draw."""
        return commands[0] if self.temperature <= 0 else self.rng.choice(commands)

    def close(self) -> None:
        pass
