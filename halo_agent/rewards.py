"""Dense reward components for one episode: progress, novelty, loop, validity, success, task_progress.

    config = RewardConfig.load()                      # halo_agent/configs/rewards.yaml
    rewards = EpisodeRewards(config, site="gomail", start_url=page.url)
    step = rewards.step(state_hash=..., action="click('12')", action_valid=True, ...)
    step.components   # {"progress": 0.2, "novelty": 1.0, "loop": 0.0, "validity": 0.2, "success": 0.0, "task_progress": None}
    step.reward       # their weighted sum (halo_data.config.RewardWeights)

Components are stored raw on every step; ``reward`` is only the sum at
collection time. Progress rules are per site (GoMail, GoCalendar, Omnizon,
MiniWoB, generic), driven by the action, the element it targets, and the URL and
AXTree after it; all of it lives in the YAML file so a site's rules change
without code.

``task_progress`` is task-aware: the environment reports, after each action, the share of
the task's expectations (``halo_agent.task_progress``) that the site's state satisfies
(``StepOutcome.info["task_progress"]["share"]``); the component is that share's change since
the previous step, so an episode's values sum to its final share (and an action that undoes
progress is negative). Where the task has no expectations nothing is measured and the
component is None (NULL in the lake), not 0: "not measured" stays apart from "measured, no
progress", and the shaped reward counts it as 0.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from halo_data.config import RewardWeights, load_yaml_or_json
from halo_data.schema import REWARD_COMPONENTS

from halo_agent.types import Element

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "rewards.yaml"
GENERIC_SITE = "generic"
_RULE_FIELDS = ("action", "target", "url", "page", "url_changed")


class RewardConfigError(ValueError):
    """The reward config file is malformed; the message names the entry."""


@dataclasses.dataclass(frozen=True)
class Milestone:
    name: str
    weight: float
    action: re.Pattern | None = None
    target: re.Pattern | None = None
    url: re.Pattern | None = None
    page: re.Pattern | None = None
    url_changed: bool | None = None

    def matches(self, action: str, target: str, url: str, page: str, url_changed: bool) -> bool:
        if self.action is not None and not self.action.search(action):
            return False
        if self.target is not None and not self.target.search(target):
            return False
        if self.url is not None and not self.url.search(url):
            return False
        if self.page is not None and not self.page.search(page):
            return False
        if self.url_changed is not None and self.url_changed != url_changed:
            return False
        return True


def _milestone(site: str, raw: Any) -> Milestone:
    if not isinstance(raw, dict) or "name" not in raw:
        raise RewardConfigError(f"progress.{site}: each milestone needs a name, got {raw!r}")
    unknown = set(raw) - {"name", "weight", *_RULE_FIELDS}
    if unknown:
        raise RewardConfigError(f"progress.{site}.{raw['name']}: unknown field(s) {', '.join(sorted(unknown))}")
    if not any(k in raw for k in _RULE_FIELDS):
        raise RewardConfigError(f"progress.{site}.{raw['name']}: give at least one of {', '.join(_RULE_FIELDS)}")
    patterns = {}
    for key in ("action", "target", "url", "page"):
        if raw.get(key) is not None:
            try:
                patterns[key] = re.compile(str(raw[key]), re.IGNORECASE)
            except re.error as e:
                raise RewardConfigError(f"progress.{site}.{raw['name']}.{key}: bad regex: {e}") from None
    weight = float(raw.get("weight", 1.0))
    if weight <= 0:
        raise RewardConfigError(f"progress.{site}.{raw['name']}: weight must be positive")
    changed = raw.get("url_changed")
    return Milestone(str(raw["name"]), weight, url_changed=None if changed is None else bool(changed), **patterns)


@dataclasses.dataclass
class RewardConfig:
    weights: RewardWeights = dataclasses.field(default_factory=RewardWeights)
    progress: dict[str, tuple[Milestone, ...]] = dataclasses.field(default_factory=dict)
    new_state: float = 1.0
    repeated_action: float = -1.0
    valid_action: float = 0.2
    action_error: float = -0.5
    parse_error: float = -1.0
    source: str | None = None

    @classmethod
    def load(cls, path: str | Path | None = None) -> "RewardConfig":
        path = Path(path) if path else DEFAULT_CONFIG
        return cls.from_dict(load_yaml_or_json(path), source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "RewardConfig":
        weights = data.get("weights") or {}
        unknown = set(weights) - set(REWARD_COMPONENTS)
        if unknown:
            raise RewardConfigError(f"weights: unknown component(s) {', '.join(sorted(unknown))}; components are {', '.join(REWARD_COMPONENTS)}")
        progress = {
            str(site): tuple(_milestone(str(site), m) for m in (rules or []))
            for site, rules in (data.get("progress") or {}).items()
        }
        novelty = data.get("novelty") or {}
        loop = data.get("loop") or {}
        validity = data.get("validity") or {}
        defaults = cls()
        return cls(
            weights=RewardWeights(**{k: float(v) for k, v in weights.items()}),
            progress=progress,
            new_state=float(novelty.get("new_state", defaults.new_state)),
            repeated_action=float(loop.get("repeated_action", defaults.repeated_action)),
            valid_action=float(validity.get("valid_action", defaults.valid_action)),
            action_error=float(validity.get("action_error", defaults.action_error)),
            parse_error=float(validity.get("parse_error", defaults.parse_error)),
            source=source,
        )

    def milestones(self, site: str | None) -> tuple[Milestone, ...]:
        if site and site in self.progress:
            return self.progress[site]
        return self.progress.get(GENERIC_SITE, ())


@dataclasses.dataclass
class StepRewards:
    components: dict[str, float]
    reward: float
    cumulative_progress: float
    milestones: list[str]  # reached at this step


def task_share(info: dict[str, Any] | None) -> float | None:
    """The share of the task's expectations met, as an environment reports it in ``StepOutcome.info``
    or ``PageState.extra`` (``{"task_progress": {"share": ...}}``); None when it measures none."""
    measured = (info or {}).get("task_progress")
    if not isinstance(measured, dict) or measured.get("share") is None:
        return None
    return float(measured["share"])


class EpisodeRewards:
    """Tracks one episode's states, actions and milestones; scores each step.

    ``task_share``: the share of the task's expectations met when the episode starts, where the
    environment measures it (``task_share(page.extra)`` of the reset page), else None: the
    episode's ``task_progress`` components are then None.
    """

    def __init__(self, config: RewardConfig, site: str | None, start_url: str = "", start_state: str | None = None,
                 task_share: float | None = None):
        self.config = config
        self.site = site
        self.start_url = (start_url or "").split("#", 1)[0]
        self.milestones = config.milestones(site)
        self.total_weight = sum(m.weight for m in self.milestones) or 1.0
        self.reached: set[str] = set()
        self.seen_states: set[str] = {start_state} if start_state else set()
        self.seen_state_actions: set[tuple[str, str]] = set()
        # The share already credited: 0 at the start, so the components sum to the final share.
        self.measured = task_share is not None
        self.task_share = 0.0

    @property
    def cumulative_progress(self) -> float:
        return sum(m.weight for m in self.milestones if m.name in self.reached) / self.total_weight

    def step(
        self,
        *,
        state_hash: str,
        action: str | None,
        action_valid: bool,
        parse_error: str | None = None,
        action_error: str | None = None,
        target: Element | None = None,
        url_after: str = "",
        page_after: str = "",
        state_hash_after: str | None = None,
        env_reward: float = 0.0,
        task_share: float | None = None,
    ) -> StepRewards:
        """``task_share``: the share of the task's expectations met after this step (None: not measured at this
        step, e.g. no action ran; in an episode that is measured, the share is then taken as unchanged)."""
        c = self.config
        # progress: milestones reached by this (valid) action
        new: list[str] = []
        if action_valid and action:
            target_text = f"{target.role} {target.name}" if target is not None else ""
            url_changed = (url_after or "").split("#", 1)[0] != self.start_url
            for m in self.milestones:
                if m.name not in self.reached and m.matches(action, target_text, url_after or "", page_after or "", url_changed):
                    new.append(m.name)
            self.reached.update(new)
        weights = {m.name: m.weight for m in self.milestones}
        progress = sum(weights[n] for n in new) / self.total_weight

        novelty = 0.0
        if state_hash_after is not None and state_hash_after not in self.seen_states:
            novelty = c.new_state
        self.seen_states.add(state_hash)
        if state_hash_after is not None:
            self.seen_states.add(state_hash_after)

        loop = 0.0
        if action is not None:
            key = (state_hash, action)
            if key in self.seen_state_actions:
                loop = c.repeated_action
            self.seen_state_actions.add(key)

        if action is None or parse_error:
            validity = c.parse_error
        elif action_error or not action_valid:
            validity = c.action_error
        else:
            validity = c.valid_action

        task_progress: float | None = None
        if task_share is not None:
            self.measured = True
        if self.measured:
            share = self.task_share if task_share is None else float(task_share)
            task_progress, self.task_share = share - self.task_share, share

        components = {
            "progress": progress,
            "novelty": novelty,
            "loop": loop,
            "validity": validity,
            "success": float(env_reward or 0.0),
            "task_progress": task_progress,
        }
        return StepRewards(components, c.weights.shaped(components), self.cumulative_progress, new)
