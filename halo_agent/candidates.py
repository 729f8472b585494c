"""Per-state candidate groups: n actions sampled in one policy call, each executed from the same restored state.

Online GRPO's ``--group-by state`` groups and DPO on scored candidates read the
``candidates`` table this module writes::

    from halo_agent.candidates import score_candidates, write_candidates
    from halo_agent.restore import StatePath

    path = StatePath.from_steps(task, task_seed=7, steps=episode_steps, step_idx=1)
    policy.act(observation)                             # n >= 2 samples in one call
    group = score_candidates(env, path, policy.last_samples, reward_config)
    rows = group.rows(run_id="r1", env="miniwob", episode_id=eid, task_id=task.task_id,
                      prompt=prompt, policy_version="policy-3")
    write_candidates(lake, rows)

Each candidate is scored with the rollout's dense reward (progress, novelty, loop,
validity) plus the environment's reward, weighted as the rollout weights them
(``RewardConfig.weights``), with the episode's history up to the state replayed into
the reward tracker. ``score_source`` is ``env``.

A state that does not reproduce (replay diverged, or the environment failed while a
candidate ran) is flagged: every candidate of it is written with ``score`` NULL and
``score_source`` ``unreproducible``, so no view ever pairs or groups it for training.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

from halo_data import ids
from halo_data.lake import Lake
from halo_data.runs import utc_now
from halo_data.writer import append_rows

from halo_agent.envs.base import StepOutcome, element_for_action
from halo_agent.restore import NotReproducible, Restored, StatePath, error_line, restore_state
from halo_agent.rewards import RewardConfig, task_share
from halo_agent.types import PolicyOutput

log = logging.getLogger(__name__)

SCORED = "env"
UNREPRODUCIBLE = "unreproducible"


@dataclasses.dataclass(frozen=True)
class CandidateGroup:
    """The candidates sampled at one state, with a score each (all None when the state did not reproduce)."""

    path: StatePath
    samples: tuple[PolicyOutput, ...]
    scores: tuple[float | None, ...]
    unreproducible: NotReproducible | None = None
    # what the environment showed after each sample (None: nothing was executed), for a search to reuse
    outcomes: tuple[StepOutcome | None, ...] = ()

    @property
    def trainable(self) -> bool:
        return self.unreproducible is None

    def rows(self, *, run_id: str, env: str, episode_id: str, task_id: str, prompt: str | None, policy_version: str | None,
             temperature: float | None = None) -> list[dict[str, Any]]:
        """Rows of the ``candidates`` table, one per sample, with its tokens and logprobs where the policy gave them."""
        source = SCORED if self.trainable else UNREPRODUCIBLE
        prompt_hash = ids.sha256_hex(prompt) if prompt is not None else None
        now = utc_now()
        return [
            dict(
                run_id=run_id, env=env, episode_id=episode_id, task_id=task_id, step_idx=self.path.step_idx,
                state_hash=self.path.target, candidate_idx=i, prompt=prompt, prompt_hash=prompt_hash,
                model_output=sample.model_output, action=sample.action, score=score, score_source=source,
                policy_version=policy_version, logprob_sum=sample.logprob_sum, created_at=now,
                logprobs=sample.logprobs, completion_token_ids=sample.completion_token_ids,
                logprobs_mode=sample.logprobs_mode, draw=sample.draw, choices=sample.choices, temperature=temperature,
            )
            for i, (sample, score) in enumerate(zip(self.samples, self.scores))
        ]


def score_candidates(env, path: StatePath, samples: Sequence[PolicyOutput], reward_config: RewardConfig) -> CandidateGroup:
    """Restore ``path``'s state once per sample, execute the sample there and score it.

    The first restore that does not reproduce flags the whole group. Never raises for
    the environment: its failures flag the group too.
    """
    samples = tuple(samples)
    scores: list[float | None] = []
    outcomes: list[StepOutcome | None] = []
    for sample in samples:
        restored = restore_state(env, path, reward_config)
        if isinstance(restored, Restored):
            score = _score(env, restored, sample, path.step_idx)
        else:
            score = restored
        if isinstance(score, NotReproducible):
            return CandidateGroup(path, samples, (None,) * len(samples), score)
        scores.append(score[0])
        outcomes.append(score[1])
    return CandidateGroup(path, samples, tuple(scores), outcomes=tuple(outcomes))


def _score(env, restored: Restored, sample: PolicyOutput, step_idx: int) -> tuple[float, StepOutcome | None] | NotReproducible:
    """The shaped reward of ``sample`` taken from the restored page (whose reward tracker it advances), and the outcome."""
    page, action = restored.page, sample.action
    outcome = None
    if action is not None:
        try:
            outcome = env.step(action)
        except Exception as e:  # the environment failed, not the candidate: its score would mean nothing
            return NotReproducible(step_idx, f"environment error running {action!r}: {error_line(e)}")
    after = outcome.page if outcome is not None else page
    action_error = outcome.action_error if outcome is not None else None
    scored = restored.rewards.step(
        state_hash=restored.state_hash,
        action=action,
        action_valid=outcome is not None and action_error is None,
        parse_error=sample.parse_error,
        action_error=action_error,
        target=element_for_action(action, page.elements),
        url_after=after.url,
        page_after=after.axtree,
        state_hash_after=ids.state_hash(after.url, after.axtree),
        env_reward=float(outcome.reward) if outcome is not None else 0.0,
        task_share=task_share(outcome.info) if outcome is not None else None,
    )
    return scored.reward, outcome


def write_candidates(lake: Lake, rows: Sequence[Mapping[str, Any]]) -> int:
    """Append candidate rows in one commit, leaving out the states whose candidates the lake already holds.

    A state is (run_id, episode_id, step_idx): a retried or resumed write adds nothing twice.
    Returns the number of rows written.
    """
    held = _states_held(lake, {r["run_id"] for r in rows})
    fresh = [r for r in rows if (r["run_id"], r["episode_id"], r["step_idx"]) not in held]
    if fresh:
        append_rows(lake, "candidates", fresh)
    return len(fresh)


def _states_held(lake: Lake, run_ids: set[str]) -> set[tuple[str, str, int]]:
    if not run_ids:
        return set()
    table = lake.query_arrow(
        "select distinct run_id, episode_id, step_idx from candidates where list_contains($runs, run_id)",
        {"runs": sorted(run_ids)}, views=False,
    )
    return {(r["run_id"], r["episode_id"], r["step_idx"]) for r in table.to_pylist()}
