"""Import ART's Parquet trajectory logs (OpenPipe ART, ``art.utils.trajectory_logging``) as episodes.

    halo-data import .art/my-project/models/agent-001/trajectories/train/ --lake lake

ART writes one Parquet file per training step (``trajectories/{split}/{step:04d}.parquet``), one row per
trajectory: ``group_index`` (the GRPO group it was sampled in), ``group_metadata``, ``group_metrics``,
``group_logs``, ``reward``, ``metrics``, ``metadata``, ``tools`` (JSON strings; the logs lists of strings), and
``messages``, a list of ``{role, content, tool_calls (JSON), tool_call_id, trainable}``, ``trainable`` marking the
model's own completions (its ``Choice`` objects).

Each trajectory becomes one episode, each completion one step: the prompt is the chat history before it (the
exact messages, as HALO stores a prompt), the model's output its content (its tool calls, ``name(arguments)``, the
action), the observation the last tool or user message before it, the goal the first user message. The
trajectory's reward is the task reward and the last step's success component; the other reward components are
unknown (NULL). A group's trajectories are attempts at one task: ``metadata.task_id`` (or ``task``,
``scenario_id``) names it, else ``{file}-group-{group_index}``. The run is ``art-{model}-{split}`` for a file in
ART's layout, else ``art-{folder}``; the policy version is the training step (the file's name).

Recognised by its columns (``messages``, ``reward``, ``group_index``). A row that cannot be read is reported as
``FILE:row N: what is wrong`` and nothing of that trajectory lands.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from halo_data import ids, prompts
from halo_data import schema as S
from halo_data.imported import ImportedEpisode, ImportFormatError, build_record, safe_run_id
from halo_data.records import EpisodeRecord, StepRecord

COLUMNS = ("group_index", "reward", "messages")
_TASK_KEYS = ("task_id", "task", "scenario_id")


def sniff(path: Path) -> bool:
    """Whether a .parquet file has ART's trajectory columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):  # not Parquet at all: not ART's
        return False
    return set(COLUMNS) <= names


def _json(value: Any, where: str, name: str) -> Any:
    if value is None or value == "":
        return {}
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        raise ImportFormatError(f"{where}: {name} is not JSON") from None


def _run_and_version(path: Path) -> tuple[str, str]:
    """(run, policy version) from ART's layout ``.../models/{model}/trajectories/{split}/{step}.parquet``."""
    parts = path.parts
    if len(parts) >= 5 and parts[-3] == "trajectories" and parts[-5] == "models":
        return f"art-{parts[-4]}-{parts[-2]}", path.stem
    return f"art-{path.parent.name}", path.stem


def _tool_calls(raw: Any, where: str) -> str | None:
    calls = _json(raw, where, "tool_calls") if raw else []
    if not calls:
        return None
    out = []
    for call in calls if isinstance(calls, list) else []:
        fn = (call or {}).get("function") or {}
        out.append(f"{fn.get('name', 'tool')}({fn.get('arguments', '')})")
    return "\n".join(out) or None


def read_art_source(path: Path, run_id: str | None, failures: list[str]) -> Iterator[ImportedEpisode]:
    """The episodes of one ART Parquet file; a bad row is reported in ``failures`` and skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:  # a broken file: the whole file is unreadable
        failures.append(f"{path}: cannot read Parquet: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        failures.append(f"{path}: not an ART trajectory log: no {', '.join(missing)} column")
        return
    default_run, version = _run_and_version(path)
    run = run_id or safe_run_id(default_run)
    model = path.parts[-4] if len(path.parts) >= 5 and path.parts[-5] == "models" else None
    for n, row in enumerate(table.to_pylist()):
        where = f"{path}:row {n}"
        try:
            yield _episode(row, where, path, run, model, version)
        except ImportFormatError as e:
            failures.append(str(e))


def _episode(row: dict[str, Any], where: str, path: Path, run: str, model: str | None, version: str) -> ImportedEpisode:
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ImportFormatError(f"{where}: no messages")
    reward = row["reward"]
    if reward is not None and not isinstance(reward, (int, float)):
        raise ImportFormatError(f"{where}: reward must be a number, got {reward!r}")
    metadata = _json(row.get("metadata"), where, "metadata")
    metrics = _json(row.get("metrics"), where, "metrics")
    trainable = [i for i, m in enumerate(messages) if m.get("trainable")]
    chosen = trainable or [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not chosen:
        raise ImportFormatError(f"{where}: no assistant message: nothing to land as a step")
    goal = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    history: list[dict[str, Any]] = []
    steps: list[StepRecord] = []
    actions: list[str] = []
    for i, message in enumerate(messages):
        if i in chosen:
            observation = next((m.get("content") for m in reversed(history) if m.get("role") in ("tool", "user")), None)
            output = message.get("content")
            action = _tool_calls(message.get("tool_calls"), where) or output
            last = i == chosen[-1]
            steps.append(build_record(f"{where}: message {i}", StepRecord,
                                      step_idx=len(steps), goal=goal, observation=observation,
                                      prompt=prompts.dumps([{k: v for k, v in m.items() if v is not None} for m in history]),
                                      prompt_version="art-messages", model_output=output, action=action,
                                      action_source="model", action_valid=action is not None,
                                      rewards={**dict.fromkeys(S.REWARD_COMPONENTS), "success": float(reward) if last and reward is not None else None},
                                      state_hash=ids.state_hash("", observation or ""),
                                      extra=json.dumps({"art_metrics": metrics, "art_metadata": metadata}, sort_keys=True)
                                      if last and (metrics or metadata) else None))
            if action:
                actions.append(action)
        history.append({"role": message.get("role"), "content": message.get("content"),
                        **({"tool_calls": json.loads(message["tool_calls"])} if message.get("tool_calls") else {}),
                        **({"tool_call_id": message["tool_call_id"]} if message.get("tool_call_id") else {})})
    task = next((str(metadata[k]) for k in _TASK_KEYS if metadata.get(k) is not None), None)
    task = task or f"{path.stem}-group-{row['group_index']}"
    success = metadata.get("success")
    episode = build_record(where, EpisodeRecord, run_id=run, env="art", task_id=task, mode="imported", policy="art",
                           model=model, policy_version=version, success=success if isinstance(success, bool) else None,
                           task_reward=float(reward) if reward is not None else None, n_steps=len(steps))
    run_fields = {"run_id": run, "kind": "rollout", "mode": "imported", "env": "art", "policy": "art", "model": model}
    return ImportedEpisode(where, episode, steps, [], run_fields)

