"""The manager: any OpenAI-compatible chat model, asked for a plan and a sub-goal for the worker.

    manager = Manager(model="gpt-4o")                      # or base_url= a vLLM or HALO chat server
    advice, call = manager.consult(obs, history, reason="loop", macros=["log_in", ...])
    advice.plan, advice.subgoal, advice.macro              # None when the answer had neither PLAN nor SUBGOAL
    call                                                   # ModelCall: the step row of this consultation

Its prompt comes from ``halo_data.prompts.render_manager_messages``. An answer that
is empty or malformed (neither a ``PLAN:`` nor a ``SUBGOAL:`` line), or an endpoint
that fails, gives no advice and one warning: the worker goes on as it was.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Sequence

from halo_data import prompts

from halo_agent.policies.openai_policy import OpenAIPolicy, PolicyAPIError
from halo_agent.types import ModelCall, Observation

log = logging.getLogger(__name__)

_FIELD = re.compile(r"^\s*[*#>-]*\s*(PLAN|SUBGOAL|SUB-GOAL|MACRO)\s*[*]*\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
MAX_ADVICE_CHARS = 400


@dataclasses.dataclass(frozen=True)
class Advice:
    plan: str | None
    subgoal: str | None
    macro: str | None = None

    def for_worker(self) -> str:
        """The text that goes into the worker's prompt."""
        return " ".join(p for p in (self.plan, f"Next: {self.subgoal}" if self.subgoal else None) if p)


def parse_advice(text: str | None) -> Advice | None:
    """The manager's answer as advice, or None when it has neither a plan nor a sub-goal."""
    found: dict[str, str] = {}
    for m in _FIELD.finditer(text or ""):
        key = m.group(1).upper().replace("-", "")
        found.setdefault(key, m.group(2)[:MAX_ADVICE_CHARS])
    if not found.get("PLAN") and not found.get("SUBGOAL"):
        return None
    macro = found.get("MACRO", "").strip().strip("`'\".").lower() or None
    return Advice(found.get("PLAN"), found.get("SUBGOAL"), None if macro in (None, "none") else macro)


class Manager:
    """Consults one chat model; ``base_url``, ``api_key`` and the rest as for the ``openai`` policy."""

    def __init__(self, model: str, temperature: float = 0.0, max_tokens: int = 128, **client_options: Any):
        self.model = model
        self._client = OpenAIPolicy(model=model, temperature=temperature, max_tokens=max_tokens, logprobs=False, **client_options)

    def consult(self, obs: Observation, history: Sequence[str], reason: str, macros: Sequence[str] = (),
                question: str | None = None) -> tuple[Advice | None, ModelCall]:
        messages = prompts.render_manager_messages(obs.goal, obs.url, obs.axtree, history, reason=reason, macros=macros, question=question)
        try:
            answer = self._client.chat(messages, step_idx=obs.step_idx)
        except PolicyAPIError as e:
            log.warning("manager %s failed (%s); the worker goes on without new advice", self.model, e)
            return None, ModelCall(messages, None, self.model, error=f"manager call failed: {e}")
        call = ModelCall(messages, answer.text, self.model, latency_ms=answer.latency_ms, prompt_tokens=answer.prompt_tokens,
                         completion_tokens=answer.completion_tokens, cost_usd=answer.cost_usd)
        advice = parse_advice(answer.text)
        if advice is None:
            what = "empty" if not (answer.text or "").strip() else "malformed (no PLAN or SUBGOAL line)"
            log.warning("manager %s answered %s at step %d; the worker goes on without new advice", self.model, what, obs.step_idx)
            call = dataclasses.replace(call, error=f"manager answer {what}")
        return advice, call

    def close(self) -> None:
        self._client.close()
