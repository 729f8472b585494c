"""Critics: how the K candidate actions expanded at a state are ranked before any of them is tried deeper.

- ``progress``: each candidate is executed once from the restored state and scored with
  the rollout's dense reward (``halo_agent.candidates.score_candidates``); no model.
- an AI self-critique (Agent Q): a chat model sees the goal, the page, the actions so far
  and the numbered candidates, and answers with the numbers best first. ``policy`` asks
  the policy's own endpoint and model; any other name is a model served by an
  OpenAI-compatible engine (``--critic-base-url``; HALO's chat server in tests, vLLM or
  a hosted API elsewhere).

Both give a rank per candidate (1 = best; equal scores share a rank) and
``Q_critic = 1 - (rank - 1) / (K - 1)``, so the two critics blend with Q_mcts on one scale.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Protocol, Sequence

from halo_agent.candidates import score_candidates
from halo_agent.envs.base import PageState
from halo_agent.restore import NotReproducible, StatePath
from halo_agent.rewards import RewardConfig
from halo_agent.types import PolicyOutput

log = logging.getLogger(__name__)

PROGRESS = "progress"
POLICY = "policy"
CRITIC_PROMPT_VERSION = "critic-v1"
MAX_PAGE_CHARS = 6000
CRITIC_SYSTEM = (
    "You are the critic of a web agent. You judge which of the candidate next actions brings the agent "
    "closest to completing its goal. Answer with the candidate numbers only, best first, separated by spaces."
)


class CriticError(ValueError):
    """The critic cannot be used (unknown, unreachable) or gave an answer that does not rank the candidates."""


@dataclasses.dataclass(frozen=True)
class Ranking:
    """One rank per candidate (1 = best) and its Q_critic in [0, 1]; ``unreproducible`` when the state did not restore."""

    ranks: tuple[int, ...]
    unreproducible: NotReproducible | None = None
    outcomes: tuple = ()  # where a critic executed the candidates: the environment's StepOutcome of each

    @property
    def values(self) -> tuple[float, ...]:
        k = len(self.ranks)
        return tuple(1.0 if k == 1 else 1.0 - (r - 1) / (k - 1) for r in self.ranks)


def ranks_of_scores(scores: Sequence[float]) -> tuple[int, ...]:
    """Competition ranks of ``scores``, highest first: equal scores share the better rank."""
    return tuple(1 + sum(1 for other in scores if other > s) for s in scores)


class Critic(Protocol):
    name: str

    def rank(self, env, path: StatePath, page: PageState, history: Sequence[str], samples: Sequence[PolicyOutput]) -> Ranking:
        ...


class ProgressCritic:
    """Dense reward of each candidate, executed from the restored state."""

    name = PROGRESS

    def __init__(self, reward_config: RewardConfig):
        self.reward_config = reward_config

    def rank(self, env, path: StatePath, page: PageState, history: Sequence[str], samples: Sequence[PolicyOutput]) -> Ranking:
        group = score_candidates(env, path, samples, self.reward_config)
        if not group.trainable:
            return Ranking((len(samples),) * len(samples), group.unreproducible)
        return Ranking(ranks_of_scores([float(s) for s in group.scores]), outcomes=group.outcomes)


def critic_messages(goal: str, url: str, page_text: str, history: Sequence[str], candidates: Sequence[str]) -> list[dict[str, str]]:
    """The critic's prompt (version ``CRITIC_PROMPT_VERSION``)."""
    page_text = page_text if len(page_text) <= MAX_PAGE_CHARS else page_text[:MAX_PAGE_CHARS] + "\n[... truncated]"
    done = "\n".join(f"- {a}" for a in history) or "(none)"
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(candidates, start=1))
    text = (
        f"Goal: {goal}\nURL: {url}\nActions so far:\n{done}\nPage:\n{page_text}\n"
        f"Candidate next actions:\n{numbered}\n"
        f"Rank all {len(candidates)} candidates, best first (for example: {' '.join(str(i) for i in range(len(candidates), 0, -1))})."
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": text}]


def parse_ranking(answer: str, k: int) -> tuple[int, ...]:
    """Ranks from an answer that lists the candidate numbers best first; ``CriticError`` unless it names all ``k``."""
    order: list[int] = []
    for number in re.findall(r"\d+", answer or ""):
        n = int(number)
        if 1 <= n <= k and n not in order:
            order.append(n)
    if len(order) != k:
        shown = " ".join((answer or "").split())[:120]
        raise CriticError(f"the critic's answer does not rank the {k} candidates (it named {len(order)}): {shown!r}")
    ranks = [0] * k
    for position, n in enumerate(order, start=1):
        ranks[n - 1] = position
    return tuple(ranks)


class ChatCritic:
    """An AI self-critique through an OpenAI-compatible engine: one chat call ranks the K candidates."""

    def __init__(self, name: str, engine, model: str, temperature: float = 0.0, max_tokens: int = 32):
        self.name = name
        self.engine = engine
        self.model = model
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)

    def rank(self, env, path: StatePath, page: PageState, history: Sequence[str], samples: Sequence[PolicyOutput]) -> Ranking:
        from halo_agent.serving import EngineError

        if len(samples) == 1:
            return Ranking((1,))
        candidates = [s.action or s.model_output or "" for s in samples]
        messages = critic_messages(page.goal, page.url, page.axtree, history, candidates)
        try:
            answer = self.engine.chat(self.model, messages, temperature=self.temperature, max_tokens=self.max_tokens)
        except EngineError as e:
            raise CriticError(f"the critic {self.model!r} failed: {e}") from None
        return Ranking(parse_ranking(answer, len(samples)))


def make_critic(name: str, reward_config: RewardConfig, policy=None, base_url: str | None = None, api_key: str | None = None) -> Critic:
    """The critic named ``name``: ``progress``, ``policy``, or a model the engine at ``base_url`` serves."""
    from halo_agent.serving import EngineClient, EngineError

    if name == PROGRESS:
        return ProgressCritic(reward_config)
    if not name:
        raise CriticError("--critic is empty: use progress, policy or a model name")
    if name == POLICY:
        url, model = getattr(policy, "base_url", None), getattr(policy, "request_model", None)
        if not url or not model:
            raise CriticError(f"--critic policy needs a model policy served over HTTP (--policy openai), not {getattr(policy, 'name', policy)!r}")
    else:
        url, model = base_url or _default_url(), name
        if not url:
            raise CriticError(f"unknown critic {name!r}: use progress or policy, or serve the model and pass --critic-base-url")
    engine = EngineClient(url, api_key=api_key or os.environ.get("OPENAI_API_KEY"), retries=2)
    try:
        served = engine.models()
    except EngineError as e:
        raise CriticError(f"critic {name!r}: no engine answered at {url}: {e}") from None
    if model not in served:
        raise CriticError(f"unknown critic {model!r}: the engine at {url} serves {', '.join(sorted(served)) or 'nothing'}; use progress, policy or one of those")
    return ChatCritic(name, engine, model)


def _default_url() -> str | None:
    from halo_agent.policies.openai_policy import BASE_URL_ENV_VARS

    return next((os.environ[v] for v in BASE_URL_ENV_VARS if os.environ.get(v)), None)
