"""The hierarchical policy: a worker acting every step, under a manager, a verified action cache, macros and recovery.

    policy = make_policy("hierarchy", worker="openai", model="qwen_worker_bc",
                         manager={"model": "gpt-4o"}, cache=True, lake="lake", cache_version=12, macros=True)

Each step, in order:

1. the manager (any OpenAI-compatible model) is consulted at the start, when a loop
   is detected, after ``error_threshold`` invalid actions in a row, every
   ``manager_every`` steps, and when the worker asks (its output says
   ``ask_manager``); its plan and sub-goal go into the worker's prompt
   (``halo_data.prompts.render_messages(plan=...)``), its call is its own step row
   (``action_source = 'manager'``);
2. on a loop or repeated errors, a recovery policy acts (``'recovery'``);
3. a macro under way takes its next step (``'macro'``, with the macro's name);
4. the verified action cache, read from the lake once as of ``cache_version`` of
   ``steps``, replays the action that worked from this state (``'cache'``); an
   entry whose replay fails (an invalid action, or a page left as it was without
   progress) is invalidated and never used again;
5. a macro whose goal words and precondition fit the page starts (``'macro'``);
6. otherwise the worker (any HALO policy) acts (``'worker'``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Mapping

from halo_data import ids, prompts

from halo_agent.hierarchy.cache import CacheHit, VerifiedActionCache
from halo_agent.hierarchy.macros import MACROS, MacroRefused
from halo_agent.hierarchy.manager import Advice, Manager
from halo_agent.hierarchy.recovery import LoopDetector, Recovery
from halo_agent.types import ModelCall, Observation, PolicyOutput, StepFeedback

log = logging.getLogger(__name__)

ASK_MANAGER = "ask_manager"
_BID = re.compile(r"^\w+\(\s*['\"]([^'\"]*)['\"]")


@dataclasses.dataclass
class _EpisodeState:
    """What the orchestrator remembers within one episode."""

    plan: str | None = None
    start_url: str | None = None
    steps: int = 0
    errors_in_a_row: int = 0
    macro_name: str | None = None
    macro_queue: list[str] = dataclasses.field(default_factory=list)
    macros_run: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (macro, state) started
    tried: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # state -> actions taken there
    last_hit: CacheHit | None = None
    loop_consulted: str | None = None  # the state whose loop the manager was told of


class HierarchicalPolicy:
    """Implements ``halo_agent.types.Policy`` around a worker policy."""

    name = "hierarchy"

    def __init__(
        self,
        worker: str = "random",
        worker_options: Mapping[str, Any] | None = None,
        manager: Mapping[str, Any] | None = None,
        cache: bool = False,
        lake: str | None = None,
        cache_version: int | None = None,
        cache_scopes: tuple[str, ...] | list[str] = ("task",),
        cache_min_support: int = 1,
        cache_min_success_rate: float = 0.5,
        macros: bool = False,
        recovery: bool = True,
        manager_every: int | None = None,
        manager_at_start: bool = True,
        error_threshold: int = 2,
        loop_repeats: int = 2,
        model: str | None = None,
        adapter: str | None = None,
        temperature: float = 1.0,
        seed: int = 0,
        **options: Any,
    ):
        from halo_agent.policies import make_policy

        if worker == self.name:
            raise ValueError("the worker of a hierarchical policy cannot be another hierarchical policy")
        if manager is not None and not (isinstance(manager, Mapping) and manager.get("model")):
            raise ValueError(f"manager must be a mapping with at least a model, e.g. manager='{{\"model\": \"gpt-4o\"}}', got {manager!r}")
        if manager_every is not None and int(manager_every) < 1:
            raise ValueError("manager_every must be at least 1 (or unset)")
        self.worker = make_policy(worker, model=model, adapter=adapter, temperature=temperature, seed=seed,
                                  **{**options, **dict(worker_options or {})})
        self.manager = Manager(**dict(manager)) if manager else None
        self.cache = _open_cache(lake, cache_version, scopes=tuple(cache_scopes), min_support=int(cache_min_support),
                                 min_success_rate=float(cache_min_success_rate)) if cache else None
        self.macros = bool(macros)
        self.recovery = Recovery() if recovery else None
        self.manager_every = int(manager_every) if manager_every else None
        self.manager_at_start = bool(manager_at_start)
        self.error_threshold = int(error_threshold)
        self.loops = LoopDetector(repeats=int(loop_repeats))
        self.model = getattr(self.worker, "model", model)
        self.adapter = getattr(self.worker, "adapter", adapter)
        self.policy_version = getattr(self.worker, "policy_version", None)
        self.uses_screenshot = bool(getattr(self.worker, "uses_screenshot", False))
        self.last_samples: list[PolicyOutput] = []
        self.episode = _EpisodeState()

    # ------------------------------------------------------------------ policy protocol
    def reset(self, seed: int) -> None:
        self.worker.reset(seed)
        self.loops.reset()
        self.episode = _EpisodeState()

    def act(self, obs: Observation) -> PolicyOutput:
        ep = self.episode
        ep.start_url = ep.start_url or obs.url
        state = ids.state_hash(obs.url, obs.axtree)
        calls: list[ModelCall] = []
        looping = self.loops.looping(state)
        struggling = looping or ep.errors_in_a_row >= self.error_threshold
        reason = self._manager_reason(ep, state, looping)
        if reason:
            self._consult(obs, reason, calls)
        out = (self._recover(obs, state) if struggling else None) or self._next_macro_step(obs) \
            or self._from_cache(obs, state) or self._start_macro(obs, state) or self._work(obs, calls)
        out.calls = calls + out.calls
        ep.tried.setdefault(state, set()).add(out.action or "")
        ep.steps += 1
        self.last_samples = [out]
        return out

    def observe(self, feedback: StepFeedback) -> None:
        """What the last action did: loop and error counts, and the verdict on a cache replay."""
        ep = self.episode
        self.loops.record(feedback.state_before, feedback.action, feedback.state_after)
        failed = not feedback.action_valid
        stayed = feedback.state_after == feedback.state_before and feedback.progress <= 0 and feedback.env_reward <= 0
        ep.errors_in_a_row = ep.errors_in_a_row + 1 if failed else 0
        if feedback.action_source == "recovery":
            self.loops.broken()
        if ep.last_hit is not None and feedback.action_source == "cache" and (failed or stayed):
            self.cache.invalidate(ep.last_hit.entry)
        if failed and ep.macro_queue:
            log.info("macro %s stopped: its step %s failed", ep.macro_name, feedback.action)
            ep.macro_queue.clear()
        ep.last_hit = None

    def close(self) -> None:
        self.worker.close()
        if self.manager is not None:
            self.manager.close()

    # ------------------------------------------------------------------ the manager
    def _manager_reason(self, ep: _EpisodeState, state: str, looping: bool) -> str | None:
        if self.manager is None:
            return None
        if ep.steps == 0 and self.manager_at_start:
            return "start"
        if looping and ep.loop_consulted != state:
            ep.loop_consulted = state
            return "loop: the same action keeps being taken on this page"
        if ep.errors_in_a_row >= self.error_threshold:
            return f"{ep.errors_in_a_row} invalid actions in a row"
        if self.manager_every and ep.steps > 0 and ep.steps % self.manager_every == 0:
            return f"periodic check every {self.manager_every} steps"
        return None

    def _consult(self, obs: Observation, reason: str, calls: list[ModelCall], question: str | None = None) -> None:
        advice, call = self.manager.consult(obs, list(obs.history), reason, macros=sorted(MACROS) if self.macros else (),
                                            question=question)
        calls.append(call)
        if advice is None:
            return
        self.episode.plan = advice.for_worker() or self.episode.plan
        if advice.macro:
            self._queue_macro(obs, advice, ids.state_hash(obs.url, obs.axtree))

    def _queue_macro(self, obs: Observation, advice: Advice, state: str) -> None:
        macro = MACROS.get(advice.macro or "")
        if macro is None or not self.macros:
            log.warning("manager asked for macro %r, which is not available; ignored", advice.macro)
            return
        try:
            plan = macro.plan(obs)
        except MacroRefused as e:
            log.info("manager asked for macro %s, which does not fit this page: %s", macro.name, e)
            return
        self.episode.macros_run.add((macro.name, state))
        self.episode.macro_name, self.episode.macro_queue = macro.name, list(plan.actions)

    # ------------------------------------------------------------------ the sources of an action
    def _recover(self, obs: Observation, state: str) -> PolicyOutput | None:
        if self.recovery is None:
            return None
        found = self.recovery.action(obs, self.episode.tried.get(state, set()), self.episode.start_url)
        if found is None:
            return None
        name, action = found
        self.episode.macro_queue.clear()
        self.episode.errors_in_a_row = 0
        return _scripted(action, "recovery", name)

    def _next_macro_step(self, obs: Observation) -> PolicyOutput | None:
        ep = self.episode
        if not ep.macro_queue:
            return None
        action = ep.macro_queue.pop(0)
        bid = _BID.match(action)
        if bid and bid.group(1) not in {e.bid for e in obs.elements}:
            log.info("macro %s stopped: the element of %s is gone", ep.macro_name, action)
            ep.macro_queue.clear()
            return None
        return _scripted(action, "macro", ep.macro_name)

    def _from_cache(self, obs: Observation, state: str) -> PolicyOutput | None:
        if self.cache is None:
            return None
        hit = self.cache.lookup(obs, state)
        if hit is None:
            return None
        self.episode.last_hit = hit
        return _scripted(hit.action, "cache", None)

    def _start_macro(self, obs: Observation, state: str) -> PolicyOutput | None:
        if not self.macros:
            return None
        for macro in MACROS.values():
            if (macro.name, state) in self.episode.macros_run or not macro.goal.search(obs.goal or ""):
                continue
            try:
                plan = macro.plan(obs)
            except MacroRefused:
                continue
            self.episode.macros_run.add((macro.name, state))
            self.episode.macro_name, self.episode.macro_queue = macro.name, list(plan.actions)
            return self._next_macro_step(obs)
        return None

    def _work(self, obs: Observation, calls: list[ModelCall]) -> PolicyOutput:
        """The worker's action, on a prompt that carries the manager's plan; once more after it asked the manager."""
        out = self._worker_act(obs)
        if self.manager is not None and ASK_MANAGER in (out.model_output or "").lower():
            self._consult(obs, "the worker asked", calls, question=out.model_output)
            out = self._worker_act(obs)
        return out

    def _worker_act(self, obs: Observation) -> PolicyOutput:
        obs.messages = prompts.render_messages(obs.goal, obs.url, obs.axtree, obs.history, screenshot_hash=obs.screenshot_hash,
                                               use_screenshot=self.uses_screenshot, plan=self.episode.plan)
        out = self.worker.act(obs)
        return dataclasses.replace(out, action_source="worker", calls=list(out.calls))


def _open_cache(lake: str | None, version: int | None, **options: Any) -> VerifiedActionCache:
    if not lake:
        raise ValueError("the verified action cache needs the lake to read it from (lake=...)")
    from halo_data.lake import Lake

    return VerifiedActionCache.from_lake(Lake.open(lake), version, **options)


def _scripted(action: str, source: str, name: str | None) -> PolicyOutput:
    """An action chosen without a model call."""
    return PolicyOutput(model_output=action, action=action, action_source=source, macro=name)


def make_policy(**options: Any) -> HierarchicalPolicy:
    return HierarchicalPolicy(**options)
