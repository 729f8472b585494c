"""Episodes as OpenTelemetry traces: GenAI spans in OTLP JSON, for the observability tools that read them.

    halo-data export --format otel out/traces.jsonl
    halo-data export episodes out/failures.jsonl --format otel --where "not success"

One line per episode, each an OTLP ``ExportTraceServiceRequest`` in its JSON encoding (what the OpenTelemetry
Collector's file exporter writes and its ``otlpjsonfile`` receiver reads; trace and span ids in hex, times and
64-bit integers as strings). An episode is one trace, following the GenAI semantic conventions (development
status, the ``gen_ai.*`` names of semantic-conventions v1.37 and later):

- ``invoke_agent halo`` (internal): the episode; ``gen_ai.agent.name`` ``halo``, ``gen_ai.agent.id`` the policy,
  ``gen_ai.conversation.id`` the episode id, ``gen_ai.request.model`` the model, and ``halo.*`` the run, task,
  env, success and rewards. Status ERROR with the episode's error, if any.
- ``chat {model}`` (client), a child, for each step a model produced (action_source model, worker or manager,
  or a ``call_model``): ``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name`` the policy,
  ``gen_ai.request.temperature``, ``gen_ai.usage.input_tokens`` / ``output_tokens``, and the opt-in
  ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (the exact prompt and the model's output).
- ``execute_tool browser_action`` (internal), a child, for each action: ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments`` (the action), the step's reward components as
  ``halo.reward.*``; an action error sets ``error.type`` and status ERROR.

Spans are laid end to end from the episode's start: a step's chat span lasts its ``latency_ms``, its tool span
its ``env_ms``. Ids are derived from the episode id, so exporting twice gives the same traces.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from halo_data import __version__, prompts
from halo_data import schema as S
from halo_data.lake import Lake, LakeError

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_OK = 1
STATUS_ERROR = 2
TOOL = "browser_action"
MODEL_SOURCES = ("model", "worker", "manager")


def _id(text: str, hex_chars: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:hex_chars]


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attrs.items() if v is not None]


def _ns(when: dt.datetime | None) -> int:
    return int(when.timestamp() * 1_000_000) * 1000 if when is not None else 0


def _messages(prompt: str | None) -> str | None:
    """A stored prompt in the conventions' message shape: ``[{role, parts: [{type: text, content}]}]``."""
    if not prompt:
        return None
    out = []
    for m in prompts.loads(prompt):
        content = m.get("content")
        parts = ([{"type": "text", "content": content}] if isinstance(content, str) else
                 [{"type": "text", "content": p.get("text", "")} if p.get("type") == "text" else
                  {"type": "blob", "modality": "image", "content": f"sha256:{p.get('hash')}"} for p in content or []])
        out.append({"role": m.get("role"), "parts": parts})
    return json.dumps(out, ensure_ascii=False)


def _span(trace_id: str, span_id: str, parent: str | None, name: str, kind: int, start: int, end: int,
          attrs: dict[str, Any], error: str | None = None) -> dict[str, Any]:
    span = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": kind,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(max(end, start + 1000)),
            "attributes": _attributes(attrs),
            "status": {"code": STATUS_ERROR, "message": error} if error else {"code": STATUS_OK}}
    if parent:
        span["parentSpanId"] = parent
    return span


def episode_spans(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans of one episode from its ``steps`` rows, in step order: the agent span first."""
    first, last = rows[0], rows[-1]
    eid = first["episode_id"]
    trace_id = _id(eid, 32)
    root = _id(f"{eid}/agent", 16)
    start = _ns(first["started_at"])
    t = start
    children = []
    for row in rows:
        i = row["step_idx"]
        model = row["call_model"] or first["model"]
        if row["call_model"] is not None or row["action_source"] in MODEL_SOURCES:
            end = t + int((row["latency_ms"] or 0) * 1e6)
            children.append(_span(trace_id, _id(f"{eid}/{i}/chat", 16), root, f"chat {model}" if model else "chat",
                                  SPAN_KIND_CLIENT, t, end, {
                                      "gen_ai.operation.name": "chat", "gen_ai.provider.name": first["policy"],
                                      "gen_ai.request.model": model, "gen_ai.request.temperature": first["temperature"],
                                      "gen_ai.usage.input_tokens": row["prompt_tokens"],
                                      "gen_ai.usage.output_tokens": row["completion_tokens"],
                                      "gen_ai.input.messages": _messages(row["prompt"]),
                                      "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                                          {"type": "text", "content": row["model_output"] or ""}]}], ensure_ascii=False),
                                      "halo.step_idx": i, "halo.cost_usd": row["cost_usd"],
                                      "halo.logprob_sum": row["logprob_sum"]}, row["parse_error"]))
            t = max(end, t + 1000)
        if row["action"] is not None:
            end = t + int((row["env_ms"] or 0) * 1e6)
            rewards = {f"halo.reward.{c}": row[S.reward_column(c)] for c in S.REWARD_COMPONENTS}
            children.append(_span(trace_id, _id(f"{eid}/{i}/tool", 16), root, f"execute_tool {TOOL}", SPAN_KIND_INTERNAL,
                                  t, end, {
                                      "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": TOOL,
                                      "gen_ai.tool.type": "function", "gen_ai.tool.call.id": f"call_{i}",
                                      "gen_ai.tool.call.arguments": json.dumps({"action": row["action"]}, ensure_ascii=False),
                                      "error.type": "action_error" if row["action_error"] else None,
                                      "halo.step_idx": i, "halo.url": row["url"], "halo.reward": row["reward"], **rewards,
                                  }, row["action_error"]))
            t = max(end, t + 1000)
    agent = _span(trace_id, root, None, "invoke_agent halo", SPAN_KIND_INTERNAL, start, max(t, _ns(last["ended_at"])), {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "halo", "gen_ai.agent.id": first["policy"],
        "gen_ai.conversation.id": eid, "gen_ai.request.model": first["model"], "halo.run_id": first["run_id"],
        "halo.env": first["env"], "halo.task_id": first["task_id"], "halo.task_seed": first["task_seed"],
        "halo.attempt_idx": first["attempt_idx"], "halo.policy_version": first["policy_version"],
        "halo.success": first["success"], "halo.task_reward": first["task_reward"], "halo.n_steps": len(rows),
    }, first["error"])
    return [agent, *children]


def request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An OTLP ExportTraceServiceRequest (JSON encoding) carrying ``spans``."""
    return {"resourceSpans": [{
        "resource": {"attributes": _attributes({"service.name": "halo", "service.version": __version__})},
        "scopeSpans": [{"scope": {"name": "halo_data.otel", "version": __version__}, "spans": spans}],
    }]}


def export_otel(lake: Lake, output: str | Path, view: str | None = None, where: str | None = None, params: Any = None,
                as_of: Any = None) -> tuple[int, int]:
    """Write one OTLP JSON request per chosen episode to ``output`` (JSON Lines); returns (episodes, spans)."""
    from halo_data.atif import _write_atomic, select_episodes

    table = select_episodes(lake, view, where, params, as_of)
    if table.num_rows == 0:
        raise LakeError(f"no episodes to export: {view or 'steps'}" + (f" where {where}" if where else "") + " has no rows")
    output = Path(output)
    if output.is_dir():
        raise LakeError(f"{output} is a folder: --format otel writes one file (JSON Lines, one trace per episode)")
    episodes: dict[str, list[dict[str, Any]]] = {}
    for r in table.to_pylist():
        episodes.setdefault(r["episode_id"], []).append(r)
    lines, n_spans = [], 0
    for rows in episodes.values():
        spans = episode_spans(rows)
        n_spans += len(spans)
        lines.append(json.dumps(request(spans), ensure_ascii=False))
    output.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(output, ("\n".join(lines) + "\n").encode("utf-8"))
    return len(episodes), n_spans
