"""ATIF, the Agent Trajectory Interchange Format, version ATIF-v1.8: the spec's schema, transcribed, and a validator.

ATIF is Harbor's RFC 0001 (``docs/rfcs/0001-trajectory-format.md`` in the Harbor repository, whose reference
models are ``src/harbor/models/trajectories/``). This module transcribes its tables field by field: which fields
each object has, which are required, and their types; the reference models forbid fields they do not name, and
so does :func:`validate`. Beyond the tables, the rules the spec states in prose (and its models enforce) are
checked too: step ids run 1, 2, 3, ...; ``model_name``, ``reasoning_effort``, ``reasoning_content``,
``tool_calls`` and ``metrics`` appear on agent steps only; an observation result's ``source_call_id`` names a tool
call of its step; tool call ids are unique in their step; a content part of type ``text`` has ``text`` and no
``source``, one of type ``image`` or ``audio`` a ``source`` of that kind and no ``text``; an agent step with
``llm_call_count`` 0 has no ``metrics`` and no ``reasoning_content``; an embedded subagent trajectory has a
unique ``trajectory_id``, and a subagent reference names a ``trajectory_id`` or a ``trajectory_path``.

v1.8 over v1.7: audio content parts (``type: "audio"`` with an ``AudioSource``: ``media_type``, ``path`` and an
optional ``duration_sec`` >= 0). Every earlier ``schema_version`` (ATIF-v1.0 .. v1.7) is accepted on import, as
the reference models accept it.

    problems = validate(document)        # [] when valid; else "steps[2].metrics.logprobs: expected array, got string"
"""

from __future__ import annotations

import datetime as dt
from typing import Any

SPEC_VERSION = "ATIF-v1.8"
SCHEMA_VERSIONS = tuple(f"ATIF-v1.{i}" for i in range(9))
SOURCES = ("system", "user", "agent")
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
AUDIO_MEDIA_TYPES = ("audio/wav", "audio/mpeg", "audio/mp4", "audio/aac", "audio/ogg", "audio/flac", "audio/webm", "audio/aiff")
# The spellings the reference models accept for an audio type and normalise to the registered one.
AUDIO_MEDIA_ALIASES = {
    "audio/mp3": "audio/mpeg", "audio/mpga": "audio/mpeg", "audio/x-mpeg": "audio/mpeg", "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav", "audio/vnd.wave": "audio/wav", "audio/x-m4a": "audio/mp4", "audio/m4a": "audio/mp4",
    "audio/x-aac": "audio/aac", "audio/x-flac": "audio/flac", "audio/x-aiff": "audio/aiff",
}

# A field: (JSON types it may have, required). Types: string, integer, number, boolean, object, array, and a
# "#Name" for an object of schema Name; "array:X" for an array of X. Null is allowed for every optional field
# (the reference models default them to None), never for a required one.
Field = tuple[tuple[str, ...], bool]

SCHEMA: dict[str, dict[str, Field]] = {
    "Trajectory": {
        "schema_version": (("string",), True),
        "session_id": (("string",), False),
        "trajectory_id": (("string",), False),
        "agent": (("#Agent",), True),
        "steps": (("array:#Step",), True),
        "notes": (("string",), False),
        "final_metrics": (("#FinalMetrics",), False),
        "continued_trajectory_ref": (("string",), False),
        "extra": (("object",), False),
        "subagent_trajectories": (("array:#Trajectory",), False),
    },
    "Agent": {
        "name": (("string",), True),
        "version": (("string",), True),
        "model_name": (("string",), False),
        "tool_definitions": (("array:object",), False),
        "extra": (("object",), False),
    },
    "FinalMetrics": {
        "total_prompt_tokens": (("integer",), False),
        "total_completion_tokens": (("integer",), False),
        "total_cached_tokens": (("integer",), False),
        "total_cost_usd": (("number",), False),
        "total_steps": (("integer",), False),
        "extra": (("object",), False),
    },
    "Step": {
        "step_id": (("integer",), True),
        "timestamp": (("string",), False),
        "source": (("string",), True),
        "model_name": (("string",), False),
        "reasoning_effort": (("string", "number"), False),
        "message": (("string", "array:#ContentPart"), True),
        "reasoning_content": (("string",), False),
        "tool_calls": (("array:#ToolCall",), False),
        "observation": (("#Observation",), False),
        "metrics": (("#Metrics",), False),
        "is_copied_context": (("boolean",), False),
        "llm_call_count": (("integer",), False),
        "extra": (("object",), False),
    },
    "ToolCall": {
        "tool_call_id": (("string",), True),
        "function_name": (("string",), True),
        "arguments": (("object",), True),
        "extra": (("object",), False),
    },
    "Metrics": {
        "prompt_tokens": (("integer",), False),
        "completion_tokens": (("integer",), False),
        "cached_tokens": (("integer",), False),
        "cost_usd": (("number",), False),
        "prompt_token_ids": (("array:integer",), False),
        "completion_token_ids": (("array:integer",), False),
        "logprobs": (("array:number",), False),
        "extra": (("object",), False),
    },
    "Observation": {
        "results": (("array:#ObservationResult",), True),
    },
    "ObservationResult": {
        "source_call_id": (("string",), False),
        "content": (("string", "array:#ContentPart"), False),
        "subagent_trajectory_ref": (("array:#SubagentTrajectoryRef",), False),
        "extra": (("object",), False),
    },
    "SubagentTrajectoryRef": {
        "trajectory_id": (("string",), False),
        "session_id": (("string",), False),
        "trajectory_path": (("string",), False),
        "extra": (("object",), False),
    },
    "ContentPart": {
        "type": (("string",), True),
        "text": (("string",), False),
        "source": (("#ImageSource", "#AudioSource"), False),
    },
    "ImageSource": {
        "media_type": (("string",), True),
        "path": (("string",), True),
    },
    "AudioSource": {
        "media_type": (("string",), True),
        "path": (("string",), True),
        "duration_sec": (("number",), False),
    },
}

# Enumerations and lower bounds the spec gives for single fields.
ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("Trajectory", "schema_version"): SCHEMA_VERSIONS,
    ("Step", "source"): SOURCES,
    ("ContentPart", "type"): ("text", "image", "audio"),
    ("ImageSource", "media_type"): IMAGE_MEDIA_TYPES,
    ("AudioSource", "media_type"): AUDIO_MEDIA_TYPES + tuple(AUDIO_MEDIA_ALIASES),
}
MINIMUMS: dict[tuple[str, str], float] = {
    ("Step", "step_id"): 1, ("Step", "llm_call_count"): 0, ("FinalMetrics", "total_steps"): 0,
    ("AudioSource", "duration_sec"): 0,
}
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")

_JSON_TYPES = {"string": str, "object": dict, "array": list, "boolean": bool}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), type(value).__name__)


def _matches(value: Any, kind: str) -> bool:
    """Whether ``value`` has the JSON type ``kind`` (shape only; a ``#Name`` or ``array:`` is checked by _check)."""
    if kind.startswith("#"):
        return isinstance(value, dict)
    if kind.startswith("array:"):
        return isinstance(value, list)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[kind])


def _describe(kinds: tuple[str, ...]) -> str:
    return " or ".join(k[1:] if k.startswith("#") else k.replace("array:#", "array of ").replace("array:", "array of ")
                       for k in kinds)


def _check(value: Any, kind: str, path: str, out: list[str]) -> None:
    if kind.startswith("#"):
        _check_object(value, kind[1:], path, out)
    elif kind.startswith("array:"):
        item = kind[len("array:"):]
        for i, v in enumerate(value):
            if not _matches(v, item):
                out.append(f"{path}[{i}]: expected {_describe((item,))}, got {_type_name(v)}")
            else:
                _check(v, item, f"{path}[{i}]", out)


def _check_object(obj: dict, name: str, path: str, out: list[str]) -> None:
    fields = SCHEMA[name]
    prefix = f"{path}." if path else ""
    for key in obj:
        if key not in fields:
            out.append(f"{prefix}{key}: unknown field of {name} (fields: {', '.join(fields)})")
    for key, (kinds, required) in fields.items():
        where = f"{prefix}{key}"
        value = obj.get(key)
        if value is None:
            if required:
                out.append(f"{where}: required field missing" if key not in obj else f"{where}: required, got null")
            continue
        if name == "ContentPart" and key == "source":
            continue  # its kind follows the part's type: _check_content_part
        fitting = [k for k in kinds if _matches(value, k)]
        if not fitting:
            out.append(f"{where}: expected {_describe(kinds)}, got {_type_name(value)}")
            continue
        allowed = ENUMS.get((name, key))
        if allowed and value not in allowed:
            out.append(f"{where}: must be one of {', '.join(allowed)}, got {value!r}")
        minimum = MINIMUMS.get((name, key))
        if minimum is not None and value < minimum:
            out.append(f"{where}: must be >= {minimum:g}, got {value!r}")
        _check(value, fitting[0], where, out)
    rule = _RULES.get(name)
    if rule:
        rule(obj, path, out)


def _check_trajectory(doc: dict, path: str, out: list[str]) -> None:
    prefix = f"{path}." if path else ""
    steps = doc.get("steps")
    if isinstance(steps, list):
        if not steps:
            out.append(f"{prefix}steps: must have at least one step")
        for i, step in enumerate(steps):
            if isinstance(step, dict) and step.get("step_id") != i + 1 and isinstance(step.get("step_id"), int):
                out.append(f"{prefix}steps[{i}].step_id: expected {i + 1} (sequential from 1), got {step['step_id']}")
    embedded: set[str] = set()
    for i, sub in enumerate(doc.get("subagent_trajectories") or []):
        if not isinstance(sub, dict):
            continue
        tid = sub.get("trajectory_id")
        if tid is None:
            out.append(f"{prefix}subagent_trajectories[{i}].trajectory_id: required on an embedded subagent")
        elif tid in embedded:
            out.append(f"{prefix}subagent_trajectories[{i}].trajectory_id: {tid!r} is not unique")
        else:
            embedded.add(tid)
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        results = (step.get("observation") or {}).get("results") if isinstance(step, dict) else None
        for j, result in enumerate(results if isinstance(results, list) else []):
            refs = result.get("subagent_trajectory_ref") if isinstance(result, dict) else None
            for k, ref in enumerate(refs if isinstance(refs, list) else []):
                if isinstance(ref, dict) and not ref.get("trajectory_path") and ref.get("trajectory_id") not in embedded:
                    out.append(f"{prefix}steps[{i}].observation.results[{j}].subagent_trajectory_ref[{k}]: names no "
                               "trajectory_path and no trajectory_id of subagent_trajectories")


def _check_step(step: dict, path: str, out: list[str]) -> None:
    source = step.get("source")
    if source in SOURCES and source != "agent":
        for key in AGENT_ONLY:
            if step.get(key) is not None:
                out.append(f"{path}.{key}: only applicable when source is 'agent', but source is {source!r}")
    if step.get("llm_call_count") == 0 and source == "agent":
        for key in ("metrics", "reasoning_content"):
            if step.get(key) is not None:
                out.append(f"{path}.{key}: must be absent when llm_call_count is 0")
    timestamp = step.get("timestamp")
    if isinstance(timestamp, str):
        try:
            dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            out.append(f"{path}.timestamp: not an ISO 8601 time: {timestamp!r}")
    calls = step.get("tool_calls")
    ids: set[str] = set()
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        tid = call.get("tool_call_id") if isinstance(call, dict) else None
        if isinstance(tid, str):
            if tid in ids:
                out.append(f"{path}.tool_calls[{i}].tool_call_id: {tid!r} is not unique in its step")
            ids.add(tid)
    results = (step.get("observation") or {}).get("results") if isinstance(step.get("observation"), dict) else None
    for j, result in enumerate(results if isinstance(results, list) else []):
        call_id = result.get("source_call_id") if isinstance(result, dict) else None
        if isinstance(call_id, str) and call_id not in ids:
            out.append(f"{path}.observation.results[{j}].source_call_id: {call_id!r} names no tool call of this step")


def _check_content_part(part: dict, path: str, out: list[str]) -> None:
    kind, text, source = part.get("type"), part.get("text"), part.get("source")
    if kind == "text":
        if text is None:
            out.append(f"{path}.text: required when type is 'text'")
        if source is not None:
            out.append(f"{path}.source: not allowed when type is 'text'")
    elif kind in ("image", "audio"):
        if text is not None:
            out.append(f"{path}.text: not allowed when type is {kind!r}")
        if source is None:
            out.append(f"{path}.source: required when type is {kind!r}")
        elif not isinstance(source, dict):
            out.append(f"{path}.source: expected {'ImageSource' if kind == 'image' else 'AudioSource'}, got {_type_name(source)}")
        else:
            _check_object(source, "ImageSource" if kind == "image" else "AudioSource", f"{path}.source", out)


_RULES = {"Trajectory": _check_trajectory, "Step": _check_step, "ContentPart": _check_content_part}


def validate(document: Any) -> list[str]:
    """Every way ``document`` departs from ATIF (up to v1.8): ``path: what is wrong``; [] when it is valid."""
    if not isinstance(document, dict):
        return [f"expected an ATIF document (a JSON object), got {_type_name(document)}"]
    out: list[str] = []
    _check_object(document, "Trajectory", "", out)
    return out
