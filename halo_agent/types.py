"""What environments hand to policies and what policies hand back: the contract between them.

Environments (``halo_agent.envs``) build an ``Observation`` per step; a policy's
``act`` returns a ``PolicyOutput``; the episode loop (``halo_agent.rollout``) turns both into one row of the
lake's ``steps`` table (see ``halo_data.schema.STEPS``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Element:
    """An element of the page a policy may act on, from the AXTree."""

    bid: str  # BrowserGym element id
    role: str  # button, link, textbox, combobox, checkbox, ...
    name: str  # accessible name
    kind: str  # "click" | "fill" | "select"
    options: tuple[str, ...] = ()  # for "select"
    # The bid of an element inside this one with the same accessible name (a tab wrapping its link): the page
    # offers one thing twice, and compact views (the elements observation, constrained choices) list the inner one.
    wraps: str | None = None
    # For an element without an accessible name (an icon drawn by CSS, a list item): what its markup calls it and
    # the text it holds or sits in, ``trash; in 'Hazel Nibh nisl.'`` (``halo_agent.envs.base.describe_unnamed``).
    description: str = ""


@dataclasses.dataclass
class Observation:
    goal: str
    url: str
    axtree: str  # the AXTree text the policy sees (BrowserGym's flatten_axtree_to_str)
    elements: Sequence[Element]  # actions the page offers
    screenshot: bytes | None  # PNG
    screenshot_hash: str | None
    messages: list[dict[str, Any]]  # chat messages from halo_data.prompts.render_messages
    history: Sequence[str]  # actions taken so far in the episode
    step_idx: int
    task_id: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    site: str | None = None


@dataclasses.dataclass
class ModelCall:
    """A model call made while choosing an action that is not the action itself (the manager's): its own step row."""

    messages: list[dict[str, Any]]  # the prompt, as rendered by halo_data.prompts
    output: str | None
    model: str
    action_source: str = "manager"
    latency_ms: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    error: str | None = None  # the endpoint failed, or the answer was unusable


@dataclasses.dataclass
class PolicyOutput:
    model_output: str | None  # raw model text (or the canonical action text for non-model policies)
    action: str | None  # parsed BrowserGym action string; None when the output did not parse
    action_source: str = "model"  # worker | manager | cache | macro | recovery | random | model
    parse_error: str | None = None
    latency_ms: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[float] | None = None  # one per token of completion_token_ids where those are known
    logprob_sum: float | None = None
    completion_token_ids: list[int] | None = None  # the tokens the engine generated (EOS included where it returned it)
    logprobs_mode: str | None = None  # processed_logprobs | raw_logprobs (halo_data.schema.LOGPROBS_MODES)
    draw: str | None = None  # masked_choice | sequence_choice | sample | greedy (halo_data.schema.DRAWS)
    choices: list[str] | None = None  # the answers decoding was constrained to, if it was
    api_error: str | None = None  # the model endpoint failed (not the environment, not a wrong answer)
    macro: str | None = None  # the macro this action was expanded from (action_source 'macro')
    call_model: str | None = None  # the model called for this action, if one was
    cost_usd: float | None = None  # that call's estimated cost
    calls: list[ModelCall] = dataclasses.field(default_factory=list)  # other calls made first (each its own step row)


@dataclasses.dataclass(frozen=True)
class StepFeedback:
    """What the environment did with a policy's action; given to ``Policy.observe`` where a policy has it."""

    action: str | None
    action_source: str
    action_valid: bool
    action_error: str | None
    state_before: str
    state_after: str | None
    progress: float  # the progress reward component of the step
    env_reward: float


@runtime_checkable
class Policy(Protocol):
    name: str  # random | openai | hf
    model: str | None
    adapter: str | None
    policy_version: str | None
    uses_screenshot: bool

    def reset(self, seed: int) -> None:
        """Start an episode; ``seed`` makes sampling reproducible."""

    def act(self, obs: Observation) -> PolicyOutput:
        """Choose the next action."""

    def close(self) -> None:
        ...
