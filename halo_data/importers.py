"""Import older trajectories into the lake: agisdk result folders and per-episode JSONL files.

    halo-data import results/                       # every agisdk result folder under results/
    halo-data import old_runs/*.jsonl --run-id halo-v0
    report = import_sources(Lake.open("lake"), ["results/"])   # the same from Python

Every imported step gets what a step collected today has: a prompt from
``halo_data.prompts.render_messages`` (as a text policy would have seen the page),
``state_hash`` from ``halo_data.ids``, and its screenshot stored once in
``screenshots``. Episode ids are deterministic, so importing the same source twice
adds nothing the second time.

A source that is malformed is reported as ``FILE:LINE: what is wrong`` (``FILE``
alone where no line applies) and nothing of that episode is imported; the other
episodes still are, and the report's ``failures`` lists what was left out.

agisdk result folders
---------------------
What agisdk 0.3.5's harness (``agisdk.REAL.harness`` and
``browsergym.experiments.loop``) writes for one experiment, in a folder named
``{date}_{agent}_on_{task_name}_{task_seed}_{uuid}``:

- ``summary_info.json`` (required): ``task_name`` (``v2.omnizon-1``),
  ``model_name``, ``agent_type``, ``run_uuid``, ``n_steps``, ``cum_reward``,
  ``cum_raw_reward``, ``success``, ``err_msg``, ``terminated``, ``truncated``,
  ``agent_response``.
- ``finish_state.json`` (optional): the task's final ``task_info``
  (``{"env_state": ..., "local_reward": ...}``); kept in the last step's ``extra``.
- ``step_N.pkl.gz`` (optional; written with ``save_step_info_pkl``): a gzip
  pickle of ``StepInfo`` (``obs`` after the agent's preprocessor, ``action``,
  ``reward``, ``agent_info``, ``profiling``, ...). ``StepInfo`` N holds the page
  the N-th action was chosen on; the last one holds the final page and no action.
  Pickles are read with a restricted unpickler that builds plain records instead
  of importing classes, so no code in them runs and agisdk need not be installed.
- ``screenshot_step_N.png`` (optional; written with ``save_screenshot``).
- ``goal_object.pkl.gz`` (optional): the goal as chat content parts.

A folder without step pickles becomes a one-step episode carrying the result
(and the agent's final answer as its output), so its outcome is still counted.

Per-episode JSONL trajectories
------------------------------
One file per episode (``*.jsonl``), one JSON object per line:

1. ``{"type": "episode_start", "task_id": "...", ...}`` — required first.
   Optional provenance: ``run_id`` (or ``run``), ``env`` (default ``real``, or
   ``miniwob`` for ``miniwob.*`` tasks), ``site``, ``task_version``,
   ``task_seed``, ``attempt_idx``, ``seed``, ``worker_temperature`` (or
   ``temperature``), ``model``, ``policy``, ``policy_version``, ``mode``,
   ``goal``, ``started_at`` (ISO 8601 or Unix seconds).
2. One record per step, in order, ``{"type": "step", "step": 0, ...}`` (``type``
   may be left out): ``step`` (required, 0, 1, 2, ...), ``url``, ``goal``,
   ``axtree`` (or ``observation``), ``model_output`` (or ``output``),
   ``action``, ``action_error``, ``reward`` (number: the reward recorded then),
   ``progress`` (cumulative progress 0..1), ``screenshot`` (base64 PNG),
   ``done``, ``success``, ``latency_ms``, ``prompt_tokens``,
   ``completion_tokens``, and any raw reward component ``r_progress``,
   ``r_novelty``, ``r_loop``, ``r_validity``, ``r_success``.
3. Optionally ``{"type": "episode_end", "success": ..., "reward": ...,
   "error": ..., "ended_at": ...}``.

The episode's success is ``episode_end.success``, else the last step's
``success``/``done``-with-positive-reward. Unknown fields go to ``extra``.

ATIF documents
--------------
Harbor's trajectory format (``halo_data.atif``): a ``.json`` file holding one
document, or a ``.jsonl`` file of one document per line, recognised by its
``"schema_version": "ATIF-..."``. Each document is one episode; one that is not
valid ATIF is reported (``FILE:LINE:`` in JSONL) and the file's others still land.

ART trajectory logs
-------------------
OpenPipe ART's Parquet files (``halo_data.art``), one trajectory per row,
recognised by their columns; a row that cannot be read is reported as
``FILE:row N:`` and the file's other rows still land.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import gzip
import io
import json
import logging
import pickle
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from halo_data import ids
from halo_data import schema as S
from halo_data.imported import (
    ImportedEpisode,
    ImportFormatError,
    build_record,
    parse_time,
    read_json_file,
    safe_run_id,
    site_and_version,
    text_prompt,
)
from halo_data.lake import Lake, LakeError
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.runs import RunRecord, provenance, upsert_runs, utc_now
from halo_data.writer import EpisodeWriter, Screenshot

log = logging.getLogger(__name__)

FLUSH_EPISODES = 50
IMPORT_FORMATS = ("auto", "agisdk", "jsonl", "atif", "art")
_AGISDK_DIR = re.compile(r"_on_(?P<task>.+)_(?P<seed>\d+)_[0-9a-f]{32}(?:_\d+)?$")
_STEP_PICKLE = re.compile(r"^step_(\d+)\.pkl\.gz$")
# agisdk records only the environment's reward: the other components are unknown (NULL), not 0.
_ONLY_SUCCESS_KNOWN = dict.fromkeys(S.REWARD_COMPONENTS)


@dataclasses.dataclass
class ImportReport:
    episodes: int = 0
    steps: int = 0
    screenshots: int = 0
    skipped: int = 0  # already in the lake (same deterministic episode id)
    failures: list[str] = dataclasses.field(default_factory=list)
    run_ids: list[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------- discovery
def find_sources(paths: Iterable[str | Path], fmt: str = "auto") -> list[tuple[str, Path]]:
    """(format, path) of every episode source under ``paths``: agisdk folders and JSONL files, sorted."""
    from halo_data import art
    from halo_data.atif import sniff

    if fmt not in IMPORT_FORMATS:
        raise LakeError(f"unknown import format {fmt!r}: use {', '.join(IMPORT_FORMATS)}")
    found: list[tuple[str, Path]] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise LakeError(f"{path} does not exist")
        if path.is_file():
            if fmt == "agisdk" or (fmt == "auto" and path.name == "summary_info.json"):
                found.append(("agisdk", path.parent))
            elif fmt == "art" or (fmt == "auto" and path.suffix == ".parquet"):
                found.append(("art", path))
            elif fmt == "atif" or (fmt == "auto" and (path.suffix == ".json" or sniff(path))):
                found.append(("atif", path))
            else:
                found.append(("jsonl", path))
            continue
        if fmt in ("auto", "agisdk"):
            found += [("agisdk", p.parent) for p in path.rglob("summary_info.json")]
        if fmt in ("auto", "art"):
            found += [("art", p) for p in path.rglob("*.parquet") if art.sniff(p)]
        atif: set[Path] = set()
        if fmt in ("auto", "atif"):
            atif = {p for pattern in ("*.json", "*.jsonl") for p in path.rglob(pattern) if sniff(p)}
            found += [("atif", p) for p in atif]
        if fmt in ("auto", "jsonl"):
            found += [("jsonl", p) for p in path.rglob("*.jsonl") if p not in atif]
    unique = sorted(set(found), key=lambda fp: (str(fp[1]), fp[0]))
    if not unique:
        raise LakeError(
            f"nothing to import in {', '.join(map(str, paths))}: expected agisdk result folders "
            "(summary_info.json) or per-episode .jsonl files"
        )
    return unique


# ---------------------------------------------------------------------- agisdk pickles
class PickledRecord:
    """Stands in for any class found in an agisdk pickle: its state becomes attributes; no code runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)


_SAFE_GLOBALS = {
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray, ("builtins", "slice"): slice, ("builtins", "range"): range,
    ("datetime", "datetime"): dt.datetime, ("datetime", "date"): dt.date, ("datetime", "time"): dt.time,
    ("datetime", "timedelta"): dt.timedelta, ("datetime", "timezone"): dt.timezone,
}
_NUMPY_NAMES = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}


class RecordUnpickler(pickle.Unpickler):
    """Allows plain data, datetimes, paths and numpy arrays; every other class becomes a ``PickledRecord``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[module, name]
        if module == "collections" and name in ("OrderedDict", "defaultdict", "deque"):
            import collections

            return getattr(collections, name)
        if module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
            import pathlib

            return getattr(pathlib, name)
        if module == "copyreg" and name == "_reconstructor":
            return _reconstruct_record
        if module.split(".")[0] == "numpy" and name in _NUMPY_NAMES:
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                pass
        return type(name, (PickledRecord,), {"__module__": f"halo_import.{module}"})


def _reconstruct_record(cls: type, base: type, state: Any) -> Any:
    obj = cls.__new__(cls) if isinstance(cls, type) and issubclass(cls, PickledRecord) else PickledRecord()
    if state is not None and hasattr(obj, "__setstate__"):
        obj.__setstate__(state)
    return obj


def load_pickle(path: Path) -> Any:
    with gzip.open(path, "rb") as f:
        return RecordUnpickler(io.BytesIO(f.read())).load()


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default) if obj is not None else default


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # chat content parts
        return "\n".join(p.get("text", "") for p in value if isinstance(p, dict) and p.get("type") == "text") or None
    return str(value)


def _goal_from(obs: dict, goal_object: Any) -> str | None:
    if obs.get("goal"):
        return _text(obs["goal"])
    if goal_object:
        return _text(goal_object)
    for m in obs.get("chat_messages") or []:
        if isinstance(m, dict) and m.get("role") == "user" and m.get("message"):
            return str(m["message"])
    return None


def _url_from(obs: dict) -> str | None:
    if obs.get("url"):
        return str(obs["url"])
    urls, index = obs.get("open_pages_urls"), obs.get("active_page_index")
    try:
        return str(urls[int(index[0] if hasattr(index, "__len__") else index)])
    except (TypeError, IndexError, ValueError, KeyError):
        return None


def _model_output(agent_info: Any, action: str | None) -> str | None:
    for m in reversed(_attr(agent_info, "chat_messages") or []):
        if isinstance(m, dict) and m.get("role") == "assistant":
            content = m.get("message", m.get("content"))
            if content:
                return _text(content)
    return _text(_attr(agent_info, "model_response")) or action


def _agisdk_step_infos(folder: Path) -> list[tuple[int, Any]]:
    """(N, StepInfo) of each ``step_N.pkl.gz``, in step order."""
    infos = []
    for p in folder.glob("step_*.pkl.gz"):
        m = _STEP_PICKLE.match(p.name)
        if m:
            infos.append((int(m.group(1)), p))
    infos.sort()
    return [(n, _load_pickle_checked(p)) for n, p in infos]


def _agisdk_screenshots(folder: Path) -> dict[int, Screenshot]:
    shots: dict[int, Screenshot] = {}
    for p in folder.glob("screenshot_step_*.png"):
        m = re.match(r"^screenshot_step_(\d+)\.png$", p.name)
        if m:
            data = p.read_bytes()
            if data[:8] != b"\x89PNG\r\n\x1a\n":
                raise ImportFormatError(f"{p}: not a PNG file")
            shots[int(m.group(1))] = Screenshot.from_bytes(data)
    return shots


def _agisdk_steps(folder: Path, step_infos: list[tuple[int, Any]], shots: dict[int, Screenshot], goal_object: Any) -> list[StepRecord]:
    """One step per StepInfo with an action: StepInfo N holds the page the N-th action was chosen on."""
    steps: list[StepRecord] = []
    history: list[str] = []
    for i, (n, info) in enumerate(step_infos):
        action = _text(_attr(info, "action"))
        if action is None:
            continue  # the final page, after the last action
        obs = _attr(info, "obs") or {}
        if not isinstance(obs, dict):
            raise ImportFormatError(f"{folder / f'step_{n}.pkl.gz'}: obs is not a dict")
        nxt = step_infos[i + 1][1] if i + 1 < len(step_infos) else None
        next_obs = _attr(nxt, "obs") or {}
        url = _url_from(obs)
        observation = _text(obs.get("axtree_txt")) or _text(obs.get("pruned_html")) or ""
        goal = _goal_from(obs, goal_object)
        shot = shots.get(n)
        after = shots.get(step_infos[i + 1][0]) if nxt is not None else None
        action_error = _text(next_obs.get("last_action_error")) if isinstance(next_obs, dict) else None
        profiling = _attr(info, "profiling")
        agent_ms = None
        if _attr(profiling, "agent_stop") and _attr(profiling, "agent_start"):
            agent_ms = 1000.0 * (float(_attr(profiling, "agent_stop")) - float(_attr(profiling, "agent_start")))
        next_profiling = _attr(nxt, "profiling")
        env_ms = None
        if _attr(next_profiling, "env_stop") and _attr(next_profiling, "env_start"):
            env_ms = 1000.0 * (float(_attr(next_profiling, "env_stop")) - float(_attr(next_profiling, "env_start")))
        step_reward = float(_attr(nxt, "reward") or 0.0) if nxt is not None else 0.0
        steps.append(build_record(
            str(folder / f"step_{n}.pkl.gz"), StepRecord,
            step_idx=len(steps),
            url=url,
            goal=goal,
            observation=observation,
            screenshot_hash=shot.hash if shot else None,
            screenshot_after_hash=after.hash if after else None,
            prompt=text_prompt(goal, url, observation, history, shot.hash if shot else None),
            model_output=_model_output(_attr(info, "agent_info"), action),
            action=action,
            action_source="model",
            action_valid=not action_error,
            action_error=action_error or None,
            rewards={**_ONLY_SUCCESS_KNOWN, "success": step_reward},
            reward=step_reward,
            state_hash=ids.state_hash(url or "", observation),
            latency_ms=agent_ms,
            env_ms=env_ms,
            extra=json.dumps({"agisdk_step": n}),
        ))
        history.append(action)
    return steps


def read_agisdk_folder(folder: Path, run_id: str | None) -> ImportedEpisode:
    summary_path = folder / "summary_info.json"
    summary = read_json_file(summary_path)
    if not isinstance(summary, dict):
        raise ImportFormatError(f"{summary_path}:1: expected a JSON object")
    match = _AGISDK_DIR.search(folder.name)
    task_id = summary.get("task_name") or (match.group("task") if match else None)
    if not task_id:
        raise ImportFormatError(f"{summary_path}: no task_name, and the folder name does not say the task")
    task_seed = int(match.group("seed")) if match else 0
    finish_path = folder / "finish_state.json"
    finish_state = read_json_file(finish_path) if finish_path.exists() else summary.get("finish_state") or None

    goal_object = None
    if (folder / "goal_object.pkl.gz").exists():
        goal_object = _load_pickle_checked(folder / "goal_object.pkl.gz")
    step_infos = _agisdk_step_infos(folder)
    shots = _agisdk_screenshots(folder)
    steps = _agisdk_steps(folder, step_infos, shots, goal_object)

    success = bool(summary.get("success"))
    cum_reward = float(summary.get("cum_reward") or 0.0)
    err = summary.get("err_msg")
    error = str(err).strip().splitlines()[-1] if err else None
    if not steps:
        # No step pickles: one step carrying the outcome, so the episode still counts.
        goal = _text(goal_object)
        answer = summary.get("agent_response") or None
        steps.append(build_record(
            str(summary_path), StepRecord,
            step_idx=0,
            goal=goal,
            prompt=text_prompt(goal, "", "", [], None),
            model_output=answer,
            action=f"send_msg_to_user({json.dumps(answer)})" if answer else None,
            action_source="model",
            action_valid=bool(answer),
            rewards={**_ONLY_SUCCESS_KNOWN, "success": cum_reward},
            reward=cum_reward,
        ))
    steps[-1] = steps[-1].replace(
        cumulative_progress=1.0 if success else None,
        extra=json.dumps({
            "agisdk": {"folder": folder.name, "run_uuid": summary.get("run_uuid"), "finish_state": finish_state,
                       "agent_response": summary.get("agent_response"), "max_steps": summary.get("max_steps")},
        }, default=str),
    )
    site, version = site_and_version(task_id)
    run = run_id or safe_run_id(f"agisdk-{summary.get('run_uuid') or folder.parent.name}")
    model = summary.get("model_name")
    episode = build_record(
        str(summary_path), EpisodeRecord,
        run_id=run, env="real", task_id=task_id, site=site, task_version=version,
        mode="agisdk", policy="agisdk", model=None if model in (None, "unknown") else model,
        task_seed=task_seed, success=success, task_reward=cum_reward,
        raw_reward=float(summary.get("cum_raw_reward") or summary.get("score") or 0.0),
        n_steps=len(steps), terminated=summary.get("terminated"), truncated=summary.get("truncated"),
        error=error, error_kind="env" if error else None,
    )
    run_fields = {"run_id": run, "kind": "rollout", "mode": "agisdk", "env": "real", "policy": "agisdk",
                  "model": episode.model, "task_version": version}
    screenshots = list({s.hash: s for s in shots.values()}.values())
    return ImportedEpisode(str(folder), episode, steps, screenshots, run_fields)


def _load_pickle_checked(path: Path) -> Any:
    try:
        return load_pickle(path)
    except Exception as e:  # a truncated gzip, a broken pickle: all mean this file is unusable
        raise ImportFormatError(f"{path}: cannot read pickle: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------- JSONL
def _number(record: dict, key: str, where: str, kind: type = float) -> Any:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise ImportFormatError(f"{where}: {key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _string(record: dict, key: str, where: str) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ImportFormatError(f"{where}: {key} must be a string, got {type(value).__name__}")


_START_KEYS = {"type", "task_id", "run_id", "run", "env", "site", "task_version", "task_seed", "attempt_idx", "seed",
               "worker_temperature", "temperature", "model", "policy", "policy_version", "mode", "goal", "started_at"}
_STEP_KEYS = {"type", "step", "url", "goal", "axtree", "observation", "model_output", "output", "action",
              "action_error", "reward", "progress", "screenshot", "done", "success", "latency_ms", "prompt_tokens",
              "completion_tokens", *S.REWARD_COLUMNS}


def _jsonl_records(path: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """The episode_start record, the step records with their line numbers, and the episode_end record ({} if none)."""
    start: dict[str, Any] | None = None
    end: dict[str, Any] = {}
    records: list[tuple[int, dict[str, Any]]] = []
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as e:
            raise ImportFormatError(f"{path}: not UTF-8 text ({e.reason})") from None
    for lineno, line in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ImportFormatError(f"{where}: invalid JSON: {e.msg}") from None
        if not isinstance(record, dict):
            raise ImportFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
        kind = record.get("type", "step")
        if start is None:
            if kind != "episode_start":
                raise ImportFormatError(f"{where}: the first record must be {{\"type\": \"episode_start\", ...}}")
            if not isinstance(record.get("task_id"), str) or not record["task_id"]:
                raise ImportFormatError(f"{where}: episode_start needs a task_id string")
            start = {**record, "_line": lineno}
        elif kind == "step":
            records.append((lineno, record))
        elif kind == "episode_end":
            end = {**record, "_line": lineno}
        else:
            raise ImportFormatError(f"{where}: unknown record type {kind!r} (episode_start, step or episode_end)")
    if start is None:
        raise ImportFormatError(f"{path}:1: empty file: expected an episode_start record")
    if not records:
        raise ImportFormatError(f"{path}:{start['_line']}: no step records")
    return start, records, end


def _jsonl_screenshot(record: dict[str, Any], where: str) -> Screenshot | None:
    raw = record.get("screenshot")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ImportFormatError(f"{where}: screenshot must be a base64 string")
    try:
        data = base64.b64decode(raw.split(",", 1)[1] if raw.startswith("data:") else raw, validate=True)
    except (binascii.Error, ValueError):
        raise ImportFormatError(f"{where}: screenshot is not valid base64") from None
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ImportFormatError(f"{where}: screenshot is not a PNG image")
    return Screenshot.from_bytes(data)


def _jsonl_step_fields(path: Path, start: dict[str, Any], records: list[tuple[int, dict[str, Any]]],
                       screenshots: dict[str, Screenshot]) -> list[tuple[str, dict[str, Any]]]:
    """(FILE:LINE, StepRecord fields) of each step record; ``extra`` is left a dict of the unknown keys."""
    where0 = f"{path}:{start['_line']}"
    steps: list[tuple[str, dict[str, Any]]] = []
    history: list[str] = []
    previous_progress = 0.0
    for expected_idx, (lineno, record) in enumerate(records):
        where = f"{path}:{lineno}"
        idx = _number(record, "step", where, int)
        if idx is None:
            raise ImportFormatError(f"{where}: step record needs \"step\" (0, 1, 2, ...)")
        if idx != expected_idx:
            raise ImportFormatError(f"{where}: step {idx} out of order, expected step {expected_idx}")
        url = _string(record, "url", where) or ""
        goal = _string(record, "goal", where) or _string(start, "goal", where0) or ""
        observation = _string(record, "axtree", where) or _string(record, "observation", where) or ""
        action = _string(record, "action", where)
        output = _string(record, "model_output", where) or _string(record, "output", where) or action
        action_error = _string(record, "action_error", where)
        shot = _jsonl_screenshot(record, where)
        if shot:
            screenshots[shot.hash] = shot
        progress = _number(record, "progress", where)
        rewards = {c: _number(record, S.reward_column(c), where) for c in S.REWARD_COMPONENTS}
        if rewards["progress"] is None and progress is not None:
            rewards["progress"] = progress - previous_progress
        if progress is not None:
            previous_progress = progress
        steps.append((where, {
            "step_idx": idx,
            "url": url or None,
            "goal": goal or None,
            "observation": observation or None,
            "screenshot_hash": shot.hash if shot else None,
            "prompt": text_prompt(goal, url, observation, history, shot.hash if shot else None),
            "model_output": output,
            "action": action,
            "action_source": "model",
            "action_valid": bool(action) and not action_error,
            "action_error": action_error,
            "rewards": rewards,
            "reward": _number(record, "reward", where),
            "cumulative_progress": progress,
            "state_hash": ids.state_hash(url, observation),
            "latency_ms": _number(record, "latency_ms", where),
            "prompt_tokens": _number(record, "prompt_tokens", where, int),
            "completion_tokens": _number(record, "completion_tokens", where, int),
            "extra": {k: v for k, v in record.items() if k not in _STEP_KEYS},
        }))
        if action:
            history.append(action)
    return steps


def read_jsonl_episode(path: Path, run_id: str | None) -> ImportedEpisode:
    start, records, end = _jsonl_records(path)
    screenshots: dict[str, Screenshot] = {}
    step_fields = _jsonl_step_fields(path, start, records, screenshots)
    where0 = f"{path}:{start['_line']}"
    end_where = f"{path}:{end.get('_line', '?')}"
    task_id = start["task_id"]
    site, version = site_and_version(task_id)
    last_record = records[-1][1]
    if "success" in end:
        success = bool(end["success"])
    elif "success" in last_record:
        success = bool(last_record["success"])
    else:
        success = bool(last_record.get("done")) and (_number(last_record, "reward", where0) or 0) > 0
    task_reward = _number(end, "reward", end_where) if end else None
    if task_reward is None:
        task_reward = 1.0 if success else 0.0
    unknown_start = {k: v for k, v in start.items() if k not in _START_KEYS and k != "_line"}
    steps = []
    for i, (where, fields) in enumerate(step_fields):
        last = i == len(step_fields) - 1
        if fields["rewards"]["success"] is None:
            fields["rewards"]["success"] = task_reward if last else 0.0
        if last and success and fields["cumulative_progress"] is None:
            fields["cumulative_progress"] = 1.0
        extra = fields["extra"]
        if i == 0 and unknown_start:
            fields["extra"] = json.dumps({**extra, "episode_start": unknown_start}, default=str)
        else:
            fields["extra"] = json.dumps(extra) if extra else None
        steps.append(build_record(where, StepRecord, **fields))
    run = run_id or _string(start, "run_id", where0) or _string(start, "run", where0)
    run = safe_run_id(run) if run else safe_run_id(f"import-{path.parent.name}")
    temperature = _number(start, "worker_temperature", where0)
    if temperature is None:
        temperature = _number(start, "temperature", where0)
    env = _string(start, "env", where0) or ("miniwob" if task_id.startswith("miniwob.") else "real")
    error = _string(end, "error", end_where) if end else None
    attempt_idx = _number(start, "attempt_idx", where0, int)
    episode = build_record(
        where0, EpisodeRecord,
        run_id=run, env=env, task_id=task_id, site=_string(start, "site", where0) or site,
        task_version=_string(start, "task_version", where0) or version,
        mode=_string(start, "mode", where0) or "imported",
        policy=_string(start, "policy", where0), model=_string(start, "model", where0),
        policy_version=_string(start, "policy_version", where0),
        task_seed=_number(start, "task_seed", where0, int) or 0,
        attempt_idx=attempt_idx or 0,
        seed=_number(start, "seed", where0, int), temperature=temperature,
        success=success, task_reward=task_reward, n_steps=len(steps),
        terminated=bool(last_record.get("done")) or success, truncated=False,
        error=error, error_kind="env" if error else None,
        started_at=parse_time(start.get("started_at"), where0),
        ended_at=parse_time(end.get("ended_at"), end_where) if end else None,
    )
    run_fields = {"run_id": run, "kind": "rollout", "mode": episode.mode, "env": env, "policy": episode.policy,
                  "model": episode.model, "policy_version": episode.policy_version}
    return ImportedEpisode(str(path), episode, steps, list(screenshots.values()), run_fields, attempt_given=attempt_idx is not None)


# ---------------------------------------------------------------------- the import
def _read(kind: str, path: Path, run_id: str | None) -> ImportedEpisode:
    return read_agisdk_folder(path, run_id) if kind == "agisdk" else read_jsonl_episode(path, run_id)


def iter_episodes(sources: list[tuple[str, Path]], run_id: str | None, failures: list[str]) -> Iterator[ImportedEpisode]:
    for kind, path in sources:
        if kind in ("atif", "art"):  # a file may hold many episodes, each landing or failing alone
            from halo_data.art import read_art_source
            from halo_data.atif import read_atif_source

            yield from (read_atif_source if kind == "atif" else read_art_source)(path, run_id, failures)
            continue
        try:
            yield _read(kind, path, run_id)
        except ImportFormatError as e:
            # reported once, by the caller (the CLI prints each failure as its own Error line)
            log.info("not imported: %s", e)
            failures.append(str(e))


def import_sources(lake: Lake, sources: list[str | Path], run_id: str | None = None, fmt: str = "auto") -> ImportReport:
    """Import every episode found under ``sources``; malformed ones are reported in ``failures``, not imported."""
    from tqdm import tqdm

    if run_id is not None:
        ids.check_run_id(run_id)
    found = find_sources(sources, fmt)
    report = ImportReport()
    existing: dict[str, set[str]] = {}
    attempts: dict[tuple[str, str, int], int] = {}
    runs: dict[str, dict[str, Any]] = {}
    writer = EpisodeWriter(lake, flush_episodes=FLUSH_EPISODES, flush_seconds=30.0)
    bar = tqdm(total=len(found), unit="episode", desc="import", disable=None, leave=False)
    try:
        for episode in iter_episodes(found, run_id, report.failures):
            bar.update(1)
            record = episode.episode
            key = (record.run_id, record.task_id, record.task_seed)
            if not episode.attempt_given:
                # Sources are sorted, so re-importing gives each episode the same attempt (and id) again.
                record = record.replace(attempt_idx=attempts.get(key, 0))
            attempts[key] = max(attempts.get(key, 0), record.attempt_idx + 1)
            if record.run_id not in existing:
                existing[record.run_id] = lake.episode_ids(record.run_id)
            if record.episode_id in existing[record.run_id] or record.episode_id in writer.pending_episodes:
                report.skipped += 1
                continue
            runs.setdefault(record.run_id, episode.run_fields)
            writer.write_episode(record, episode.steps, episode.screenshots)
            report.episodes += 1
            report.steps += len(episode.steps)
        writer.close()
    finally:
        bar.close()
    report.screenshots = sum(f.screenshots for f in writer.flushes)
    _record_runs(lake, runs, [str(s) for s in sources])
    report.run_ids = sorted(runs)
    log.info("imported %d episodes (%d steps, %d screenshots); %d already there, %d failed",
             report.episodes, report.steps, report.screenshots, report.skipped, len(report.failures))
    return report


def _record_runs(lake: Lake, runs: dict[str, dict[str, Any]], sources: list[str]) -> None:
    """A ``runs`` row for each new run; an existing run's row is left as it is."""
    if not runs:
        return
    known = {r["run_id"] for r in lake.query_arrow("select run_id from runs").to_pylist()}
    now = utc_now()
    records = [
        RunRecord(**fields, status="finished", started_at=now, ended_at=now, config={"imported_from": sources},
                  provenance=provenance(imported_by="halo-data import"))
        for run, fields in runs.items() if run not in known
    ]
    upsert_runs(lake, records)
