"""State restore: bring an environment back to a state an episode visited, verified by ``state_hash``.

A state is restored by resetting the task with the same task seed and replaying the
actions the episode took before it, checking the page's ``state_hash`` before every
action and at the end against the hashes the episode recorded::

    from halo_agent.restore import StatePath, restore_state

    path = StatePath.from_steps(task, task_seed=7, steps=episode_steps, step_idx=2)
    result = restore_state(env, path, reward_config)
    if result.restored:
        outcome = env.step("click('12')")      # acts from the restored page
        result.rewards                         # the episode's reward tracker as it stood there
    else:
        result.diverged_at, result.reason      # where replay left the recorded path, and why

A state that does not reproduce (the page differs, the episode ended early, the
environment failed) comes back as ``NotReproducible``; nothing here raises for it.
Online GRPO's per-state candidates (``halo_agent.candidates``) and MCTS build on this.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence, Union

from halo_data import ids

from halo_agent.envs.base import PageState, TaskSpec, element_for_action
from halo_agent.rewards import EpisodeRewards, RewardConfig, task_share

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StatePath:
    """How to reach a state: a task instance, the actions taken from its reset, and the states on the way.

    ``state_hashes`` holds the hash of the page before each action and, last, the hash of
    the state to restore: one more than ``actions``. An action of ``None`` (a model output
    that did not parse) was never applied, and is skipped on replay. ``goal``, where known,
    is checked too: ``state_hash`` covers the page, and a MiniWoB page need not show the goal
    (enter-text looks the same for every task seed).
    """

    task: TaskSpec
    task_seed: int
    actions: tuple[str | None, ...]
    state_hashes: tuple[str, ...]
    goal: str | None = None

    def __post_init__(self) -> None:
        if len(self.state_hashes) != len(self.actions) + 1:
            raise ValueError(f"a state path needs one state hash more than actions, got {len(self.state_hashes)} for {len(self.actions)}")

    @property
    def target(self) -> str:
        return self.state_hashes[-1]

    @property
    def step_idx(self) -> int:
        return len(self.actions)

    @classmethod
    def from_steps(cls, task: TaskSpec, task_seed: int, steps: Sequence[Any], step_idx: int) -> "StatePath":
        """The path to the state of step ``step_idx`` from an episode's steps (``StepRecord``s or ``steps`` rows)."""
        ordered = sorted(steps, key=lambda s: _field(s, "step_idx"))[: step_idx + 1]
        if len(ordered) != step_idx + 1:
            raise ValueError(f"the episode has no step {step_idx}")
        return cls(
            task=task,
            task_seed=int(task_seed),
            actions=tuple(_field(s, "action") for s in ordered[:-1]),
            state_hashes=tuple(_field(s, "state_hash") for s in ordered),
            goal=_field(ordered[0], "goal"),
        )


def _field(step: Any, name: str) -> Any:
    return step[name] if isinstance(step, Mapping) else getattr(step, name)


@dataclasses.dataclass
class Restored:
    """The environment shows the state: ``page`` is it, ``rewards`` the episode's reward tracker at it."""

    page: PageState
    state_hash: str
    rewards: EpisodeRewards | None = None
    restored: bool = dataclasses.field(default=True, init=False)


@dataclasses.dataclass(frozen=True)
class NotReproducible:
    """Replay left the recorded path at step ``diverged_at`` (``len(actions)``: at the state itself)."""

    diverged_at: int
    reason: str
    restored: bool = dataclasses.field(default=False, init=False)


RestoreResult = Union[Restored, NotReproducible]


def restore_state(env, path: StatePath, reward_config: RewardConfig | None = None) -> RestoreResult:
    """Reset ``env`` to ``path.task`` with its task seed and replay ``path.actions``, checking every state hash.

    With ``reward_config``, the replayed steps are fed to an ``EpisodeRewards`` so that a
    step taken from the restored state is scored as the episode would have scored it
    (novelty and loop remember the states and actions before it).
    """
    step_idx = 0
    try:
        page = env.reset(path.task, path.task_seed)
        if path.goal is not None and page.goal != path.goal:
            return _diverged(path, 0, f"the task instance differs: goal {page.goal!r} where the episode had {path.goal!r}")
        state = ids.state_hash(page.url, page.axtree)
        rewards = EpisodeRewards(reward_config, path.task.site, start_url=page.url, start_state=state,
                                 task_share=task_share(page.extra)) if reward_config else None
        for step_idx, action in enumerate(path.actions):
            if state != path.state_hashes[step_idx]:
                return _diverged(path, step_idx, f"state {state} where the episode saw {path.state_hashes[step_idx]}")
            if action is None:
                continue
            outcome = env.step(action)
            after = ids.state_hash(outcome.page.url, outcome.page.axtree)
            if rewards is not None:
                rewards.step(
                    state_hash=state, action=action, action_valid=outcome.action_error is None,
                    action_error=outcome.action_error, target=element_for_action(action, page.elements),
                    url_after=outcome.page.url, page_after=outcome.page.axtree, state_hash_after=after,
                    env_reward=float(outcome.reward), task_share=task_share(outcome.info),
                )
            if outcome.terminated or outcome.truncated:
                return _diverged(path, step_idx, f"the episode ended after {action!r}")
            page, state = outcome.page, after
        step_idx = path.step_idx
        if state != path.target:
            return _diverged(path, step_idx, f"state {state} where the episode saw {path.target}")
    except Exception as e:  # an environment failure is one more way for a state not to reproduce
        return _diverged(path, step_idx, f"environment error: {error_line(e)}")
    return Restored(page, state, rewards)


def error_line(e: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _diverged(path: StatePath, step_idx: int, reason: str) -> NotReproducible:
    log.info("state %s of %s (task seed %d) does not reproduce at step %d: %s", path.target, path.task.task_id, path.task_seed, step_idx, reason)
    return NotReproducible(step_idx, reason)
