"""The episode loop: reset, then observe -> act -> apply -> reward until the task ends, into lake records.

One ``EpisodeRunner`` per worker holds an environment and a policy and runs
episodes one after another. Each step becomes a ``halo_data.records.StepRecord``
(raw reward components, their weights and the shaped reward); the episode an
``EpisodeRecord``. A failure of the environment, the policy or its API ends the
episode with the error recorded on it; the runner stays usable for the next one.
An environment that cannot start an episode (its reset fails ``RESET_ATTEMPTS``
times) stops the run instead, writing nothing for that episode: no policy was
tested on it (``ResetFailedError``).

With ``candidates_per_state`` set, the samples the policy drew in each step's one
call (``last_samples``) are, once the episode has ended, each executed from that
step's state restored by replay and scored (``halo_agent.candidates``): rows of the
``candidates`` table, handed back with the episode.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
from typing import Any, Sequence

from halo_data import ids, prompts
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.runs import utc_now
from halo_data.writer import Screenshot

from halo_agent.actions import compact_elements
from halo_agent.candidates import score_candidates
from halo_agent.envs.base import Element, EnvError, PageState, StepOutcome, element_for_action
from halo_agent.restore import StatePath
from halo_agent.restore import error_line as first_line
from halo_agent.rewards import EpisodeRewards, RewardConfig, StepRewards, task_share
from halo_agent.rollout.config import EpisodeResult, EpisodeSpec, RolloutConfig
from halo_agent.types import ModelCall, Observation, Policy, PolicyOutput, StepFeedback

log = logging.getLogger(__name__)

RESET_ATTEMPTS = 3  # a task's first page, tried this many times (each in a fresh page) before the run stops


class ResetFailedError(RuntimeError):
    """The environment could not start an episode: the run stops, writing nothing for it (``--resume`` runs it).

    An episode whose first page never loaded has not tested the policy: were it written as a failed attempt, an
    outage (a dead browser, a driver killed with its process group, a site down) would turn into failed
    attempts of whatever policy was being evaluated, each run in milliseconds.
    """


def build_observation(page: PageState, task_id: str, history: Sequence[str], step_idx: int, use_screenshot: bool,
                      screenshot_hash: str | None, site: str | None = None, observation_format: str = "axtree") -> Observation:
    """What the policy sees at a step; ``observation_format`` (``prompts.OBSERVATION_FORMATS``) picks the page text.
    Under ``elements-v2`` the elements carry no descriptions either, so a rule or a labelled choice knows no more
    than the page text says."""
    elements = page.elements
    if observation_format == "elements-v2":
        elements = [dataclasses.replace(e, description="") if e.description else e for e in elements]
    if observation_format == "axtree":
        text = page.axtree
    else:
        text = prompts.elements_text((e.bid, e.role, e.name, e.description) for e in compact_elements(elements))
    # An environment that keeps its own chat history (os) hands the prompt over whole.
    messages = page.extra.get("messages") or prompts.render_messages(
        goal=page.goal,
        url=page.url,
        observation=text,
        history=history,
        screenshot_hash=screenshot_hash,
        use_screenshot=use_screenshot,
        goal_last=prompts.GOAL_LAST[observation_format],
    )
    return Observation(
        goal=page.goal,
        url=page.url,
        axtree=page.axtree,
        elements=elements,
        screenshot=page.screenshot,
        screenshot_hash=screenshot_hash,
        messages=messages,
        history=list(history),
        step_idx=step_idx,
        task_id=task_id,
        extra=dict(page.extra),
        site=site,
    )


@dataclasses.dataclass
class _Episode:
    """What one episode has gathered so far."""

    spec: EpisodeSpec
    started: dt.datetime
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    shots: dict[str, Screenshot] = dataclasses.field(default_factory=dict)
    history: list[str] = dataclasses.field(default_factory=list)
    sampled: list[tuple[int, str, list[PolicyOutput]]] = dataclasses.field(default_factory=list)  # (step_idx, prompt, samples)
    error: str | None = None
    error_kind: str | None = None  # env | policy | api
    terminated: bool = False
    task_reward: float = 0.0
    raw_reward: float | None = None
    reset_ms: float = 0.0
    env_seconds: float = 0.0
    policy_seconds: float = 0.0

    def fail(self, kind: str, error: str) -> None:
        self.error, self.error_kind = error, kind


@dataclasses.dataclass(frozen=True)
class _PageAt:
    """A page an action is chosen on (or led to), with its screenshot hash and state hash."""

    page: PageState
    shot_hash: str | None
    state: str


@dataclasses.dataclass
class _Turn:
    """One step's action: what the policy said and what the environment did with it."""

    out: PolicyOutput
    policy_ms: float
    target: Element | None
    outcome: StepOutcome | None = None
    action_error: str | None = None
    env_ms: float = 0.0

    @property
    def action_valid(self) -> bool:
        return self.out.action is not None and self.outcome is not None and not self.action_error


class EpisodeRunner:
    """Runs episodes of one environment and policy (one per worker) into lake records."""

    def __init__(self, config: RolloutConfig, run_id: str, env, policy: Policy, reward_config: RewardConfig):
        self.config = config
        self.run_id = run_id
        self.env = env
        self.policy = policy
        self.rewards = reward_config
        self.max_steps = config.effective_max_steps
        self._sent_screenshots: set[str] = set()

    def run(self, spec: EpisodeSpec) -> EpisodeResult:
        ep, start = self._start(spec)
        self.policy.reset(spec.policy_seed)
        rewards = EpisodeRewards(self.rewards, spec.task.site, start_url=start.page.url, start_state=start.state,
                                 task_share=task_share(start.page.extra))
        at: _PageAt | None = start
        for step_idx in range(self.max_steps):
            at = self._step(ep, at, step_idx, rewards)
            if at is None:
                break
        self._conclude(ep)
        self._sent_screenshots.update(ep.shots)
        episode = self._episode_record(ep)
        candidates = self._candidates(ep, episode)
        return EpisodeResult(episode, ep.steps, list(ep.shots.values()), ep.env_seconds, ep.policy_seconds, candidates)

    def _candidates(self, ep: _Episode, episode: EpisodeRecord) -> list[dict[str, Any]]:
        """Rows of ``candidates`` for each step whose policy call drew at least two samples."""
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for step_idx, prompt, samples in ep.sampled:
            path = StatePath.from_steps(ep.spec.task, ep.spec.task_seed, ep.steps, step_idx)
            group = score_candidates(self.env, path, samples, self.rewards)
            rows += group.rows(run_id=self.run_id, env=self.config.env, episode_id=episode.episode_id,
                               task_id=episode.task_id, prompt=prompt, policy_version=episode.policy_version,
                               temperature=episode.temperature)
        ep.env_seconds += time.perf_counter() - t0
        return rows

    def _conclude(self, ep: _Episode) -> None:
        """An episode the loop stopped unfinished, in an environment that judges at the end (os): its
        outcome is the episode's reward, on its last step's ``success`` component."""
        conclude = getattr(self.env, "conclude", None)
        if conclude is None or ep.terminated or ep.error is not None or not ep.steps:
            return
        try:
            outcome = conclude()
        except EnvError as e:
            ep.fail("env", first_line(e))
            return
        ep.task_reward = float(outcome.reward)
        ep.raw_reward = outcome.raw_reward
        ep.terminated = bool(outcome.terminated)
        last = ep.steps[-1]
        rewards = {**last.rewards, "success": float(outcome.reward)}
        ep.steps[-1] = last.replace(rewards=rewards, reward=self.rewards.weights.shaped({**last.components(), **rewards}))

    # ---------------------------------------------------------------------------------- the parts
    def _at(self, page: PageState, ep: _Episode) -> _PageAt:
        return _PageAt(page, self._shot(page.screenshot, ep.shots), ids.state_hash(page.url, page.axtree))

    def _shot(self, png: bytes | None, shots: dict[str, Screenshot]) -> str | None:
        if not png:
            return None
        shot = Screenshot.from_bytes(png)
        if shot.hash not in self._sent_screenshots:
            shots.setdefault(shot.hash, shot)
        return shot.hash

    def _start(self, spec: EpisodeSpec) -> tuple[_Episode, _PageAt]:
        """The episode and its first page, the reset tried up to ``RESET_ATTEMPTS`` times (the environment opens a
        fresh page, relaunching a dead browser, after a failed one); ResetFailedError when none succeeds."""
        for attempt in range(1, RESET_ATTEMPTS + 1):
            ep = _Episode(spec, started=utc_now())
            start = self._reset(ep)
            if start is not None:
                return ep, start
            log.warning("reset of %s (task seed %s) failed, attempt %d of %d: %s", spec.task.task_id, spec.task_seed,
                        attempt, RESET_ATTEMPTS, ep.error)
            time.sleep(0.2 * attempt)
        raise ResetFailedError(f"the environment could not start {spec.task.task_id} (task seed {spec.task_seed}) in "
                               f"{RESET_ATTEMPTS} attempts: {ep.error}. Nothing is written for it: fix the environment "
                               "and complete the run with --resume")

    def _reset(self, ep: _Episode) -> _PageAt | None:
        """The task's first page, or None (the error recorded on ``ep``) when the environment fails."""
        task = ep.spec.task
        t0 = time.perf_counter()
        page = None
        try:
            page = self.env.reset(task, ep.spec.task_seed)
        except EnvError as e:
            ep.fail("env", first_line(e))
        except Exception as e:  # an unexpected failure of the environment is still the environment's
            log.exception("reset of %s failed", task.task_id)
            ep.fail("env", first_line(e))
        ep.reset_ms = (time.perf_counter() - t0) * 1000.0
        ep.env_seconds += ep.reset_ms / 1000.0
        return None if page is None else self._at(page, ep)

    def _step(self, ep: _Episode, at: _PageAt, step_idx: int, rewards: EpisodeRewards) -> _PageAt | None:
        """One step on page ``at``, recorded on ``ep``; the page the next step starts from, or None when the episode ends."""
        task_id = ep.spec.task.task_id
        use_screenshot = bool(getattr(self.policy, "uses_screenshot", False))
        obs = build_observation(at.page, task_id, ep.history, step_idx, use_screenshot, at.shot_hash, ep.spec.task.site,
                                self.config.observation)
        obs.extra["steps_left"] = self.max_steps - step_idx  # this step included: a policy may answer before time runs out
        turn = self._act(ep, obs, step_idx)
        # Dumped after the call: a hierarchical policy puts its manager's plan into the prompt its worker sees.
        prompt = prompts.dumps(obs.messages)
        ep.steps += [self._call_record(len(ep.steps), at, call, rewards.cumulative_progress) for call in turn.out.calls]
        samples = list(getattr(self.policy, "last_samples", None) or ())
        if self.config.candidates_per_state and len(samples) >= 2 and ep.error is None:
            ep.sampled.append((step_idx, prompt, samples))
        self._apply(ep, turn, step_idx)
        after = self._at(turn.outcome.page, ep) if turn.outcome is not None else None
        step_rewards = rewards.step(
            state_hash=at.state,
            action=turn.out.action,
            action_valid=turn.action_valid,
            parse_error=turn.out.parse_error,
            action_error=turn.action_error,
            target=turn.target,
            url_after=(after or at).page.url,
            page_after=(after or at).page.axtree,
            state_hash_after=(after or at).state,
            env_reward=float(turn.outcome.reward) if turn.outcome is not None else 0.0,
            task_share=task_share(turn.outcome.info) if turn.outcome is not None else None,
        )
        ep.steps.append(self._step_record(ep, len(ep.steps), at, after, prompt, turn, step_rewards))
        ep.history.append(turn.out.action or (turn.out.model_output or ""))
        self._feedback(turn, at, after, step_rewards)
        outcome = turn.outcome
        if outcome is not None:
            ep.task_reward = float(outcome.reward)
            if outcome.raw_reward is not None:
                ep.raw_reward = float(outcome.raw_reward)
            if outcome.terminated or outcome.truncated:
                ep.terminated = bool(outcome.terminated)
                return None
        if ep.error is not None:
            return None
        return after or at

    def _act(self, ep: _Episode, obs: Observation, step_idx: int) -> _Turn:
        """The policy's action on ``obs``; a policy that raises, or whose API failed, ends the episode."""
        t0 = time.perf_counter()
        try:
            out = self.policy.act(obs)
        except Exception as e:
            log.exception("policy failed on %s step %d", obs.task_id, step_idx)
            out = PolicyOutput(model_output=None, action=None, parse_error=None, api_error=None)
            ep.fail("policy", first_line(e))
        policy_ms = (time.perf_counter() - t0) * 1000.0
        ep.policy_seconds += policy_ms / 1000.0
        if out.api_error and ep.error is None:
            ep.fail("api", str(out.api_error))
        return _Turn(out, policy_ms, element_for_action(out.action, obs.elements))

    def _apply(self, ep: _Episode, turn: _Turn, step_idx: int) -> None:
        """Runs the turn's action in the environment (when there is one and nothing has failed)."""
        if ep.error is not None or turn.out.action is None:
            return
        t0 = time.perf_counter()
        try:
            turn.outcome = self.env.step(turn.out.action)
            turn.action_error = turn.outcome.action_error
        except EnvError as e:
            ep.fail("env", first_line(e))
            turn.action_error = str(e)
        except Exception as e:
            log.exception("step of %s failed", ep.spec.task.task_id)
            ep.fail("env", first_line(e))
            turn.action_error = str(e)
        turn.env_ms = (time.perf_counter() - t0) * 1000.0
        if step_idx == 0:
            turn.env_ms += ep.reset_ms  # the first step's environment time includes the reset that led to it
        ep.env_seconds += turn.env_ms / 1000.0

    def _feedback(self, turn: _Turn, at: _PageAt, after: _PageAt | None, step_rewards: StepRewards) -> None:
        """Tells a policy that learns within the episode (the hierarchical one) what its action did."""
        observe = getattr(self.policy, "observe", None)
        if observe is None:
            return
        observe(StepFeedback(
            action=turn.out.action, action_source=turn.out.action_source, action_valid=turn.action_valid,
            action_error=turn.action_error, state_before=at.state, state_after=after.state if after is not None else None,
            progress=float(step_rewards.components.get("progress") or 0.0),
            env_reward=float(turn.outcome.reward) if turn.outcome is not None else 0.0,
        ))

    # ---------------------------------------------------------------------------------- records
    def _call_record(self, row_idx: int, at: _PageAt, call: ModelCall, cumulative_progress: float) -> StepRecord:
        """The row of a model call that chose no action itself (a manager's): its prompt and answer on the page it saw."""
        usage = {"prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens, "cost_usd": call.cost_usd}
        return StepRecord(step_idx=row_idx, **_page_fields(at), prompt=prompts.dumps(call.messages), model_output=call.output,
                          action_source=call.action_source, parse_error=call.error, weights=self.rewards.weights,
                          cumulative_progress=cumulative_progress, latency_ms=call.latency_ms, call_model=call.model, **usage)

    def _step_record(self, ep: _Episode, step_idx: int, at: _PageAt, after: _PageAt | None, prompt: str, turn: _Turn, step_rewards: StepRewards) -> StepRecord:
        out = turn.out
        extra: dict[str, Any] = {"policy_seed": ep.spec.policy_seed}
        target_bbox = at.page.extra.get("element_bboxes", {}).get(turn.target.bid) if turn.target is not None else None
        if target_bbox is not None:
            extra["action_bbox"] = target_bbox
        if step_rewards.milestones:
            extra["milestones"] = step_rewards.milestones
        if turn.outcome is not None and turn.outcome.info:
            extra["env_info"] = _jsonable(turn.outcome.info)
        return StepRecord(
            step_idx=step_idx,
            **_page_fields(at),
            screenshot_after_hash=after.shot_hash if after is not None else None,
            prompt=prompt,
            prompt_version=at.page.extra.get("prompt_version") or prompts.PROMPT_VERSIONS[self.config.observation],
            model_output=out.model_output,
            action=out.action,
            action_source=out.action_source,
            macro=out.macro,
            action_valid=turn.action_valid,
            parse_error=out.parse_error,
            action_error=turn.action_error,
            rewards=step_rewards.components,
            weights=self.rewards.weights,
            reward=step_rewards.reward,
            cumulative_progress=step_rewards.cumulative_progress,
            latency_ms=out.latency_ms or turn.policy_ms,
            env_ms=turn.env_ms,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            call_model=out.call_model,
            cost_usd=out.cost_usd,
            logprobs=out.logprobs,
            logprob_sum=out.logprob_sum,
            completion_token_ids=out.completion_token_ids,
            logprobs_mode=out.logprobs_mode,
            draw=out.draw,
            choices=out.choices,
            extra=extra,
        )

    def _episode_record(self, ep: _Episode) -> EpisodeRecord:
        cfg, spec, policy = self.config, ep.spec, self.policy
        n_steps = sum(1 for s in ep.steps if s.action_source != "manager")  # actions, not the manager's rows
        return EpisodeRecord(
            run_id=self.run_id,
            env=cfg.env,
            episode_id=spec.episode_id,
            task_id=spec.task.task_id,
            site=spec.task.site,
            task_version=spec.task.task_version,
            split=cfg.split,
            mode=cfg.effective_mode,
            policy=getattr(policy, "name", cfg.policy),
            model=cfg.model or getattr(policy, "model", None),
            adapter=cfg.adapter or getattr(policy, "adapter", None),
            policy_version=cfg.policy_version or getattr(policy, "policy_version", None) or cfg.adapter or cfg.model,
            attempt_idx=spec.attempt_idx,
            seed=cfg.seed,
            task_seed=spec.task_seed,
            temperature=float(cfg.temperature),
            success=bool(ep.terminated and ep.task_reward > 0 and ep.error is None),
            task_reward=ep.task_reward,
            raw_reward=ep.raw_reward,
            n_steps=n_steps,
            terminated=ep.terminated,
            truncated=ep.error is None and not ep.terminated and n_steps >= self.max_steps,
            error=ep.error,
            error_kind=ep.error_kind,
            started_at=ep.started,
            ended_at=utc_now(),
        )


def _page_fields(at: _PageAt) -> dict[str, Any]:
    """The step fields of the page an action (or a manager's call) was made on."""
    return {"url": at.page.url, "goal": at.page.goal, "observation": at.page.axtree, "screenshot_hash": at.shot_hash,
            "state_hash": at.state}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)
