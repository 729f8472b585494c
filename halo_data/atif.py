"""Episodes as ATIF documents (Harbor's Agent Trajectory Interchange Format, ATIF-v1.8), out of the lake and in.

    halo-data export --format atif out/atif/                       # one <episode_id>.json per episode, images/
    halo-data export --format atif out/atif.jsonl --where "run_id = 'eval-1'"
    halo-data import out/atif/ --lake other-lake                   # ATIF files, folders or JSONL of documents

An exported document (``halo_data.atif_schema`` transcribes the spec and checks every document written):

- ``session_id`` is the run, ``trajectory_id`` the episode; ``agent`` is HALO (``name`` "halo", ``version`` HALO's)
  with the model as ``model_name`` and the policy, adapter, policy version and mode in ``agent.extra``.
- step 1 (``user``): the goal. Step 2 (``system``): the environment's reset, its observation the first page
  (``content``: the page's text and its screenshot as an image part, ``extra.url``).
- one ``agent`` step per lake step: ``message`` the model's output, one ``tool_calls`` entry
  (``browser_action``, ``arguments.action``: the BrowserGym action), ``observation`` the page the action led to
  (the next step's page, or the screenshot after the last action; ``extra.error`` the action's error);
  ``metrics`` the token counts, cost, ``completion_token_ids`` and ``logprobs`` where the lake has them (and in
  ``metrics.extra`` their ``logprobs_mode``, ``draw``, ``choices`` and ``logprob_sum``); ``extra`` the reward
  components (``rewards``), the weighted ``reward``, ``done`` and, on the last step, ``success``, and under
  ``extra.halo`` the step's other columns (the exact prompt, its version, the state hash, ...).
- ``final_metrics``: token and cost totals, ``total_steps``, and in ``extra`` the episode's outcome (success,
  task and raw reward, terminated, truncated, error).
- root ``extra.halo``: the episode's fields (env, task, seeds, attempt, times), so a HALO import restores them.

Screenshots are files next to the documents (``images/<sha256>.<format>``, the spec's convention), referenced by
relative path. An import reads any valid ATIF document: the first user message is the goal, a step's page the
observation (or later user message) before it, its action the tool call (``name(arguments)`` for tools other than ``browser_action``), and a document of another producer
gets ``env`` "atif", its ``extra.task_id`` (or ``task_name``, ``trajectory_id``, ``session_id``, the file's name)
as the task, and rewards only where its ``extra`` gives them.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from halo_data import __version__, ids, imported
from halo_data import schema as S
from halo_data.atif_schema import SPEC_VERSION, validate
from halo_data.imported import ImportedEpisode, ImportFormatError
from halo_data.lake import Lake, LakeError
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.writer import Screenshot

AGENT_NAME = "halo"
TOOL = "browser_action"
ENV = "atif"  # the env of an episode imported from another producer's document
MEDIA_TYPES = {"png": "image/png", "webp": "image/webp", "jpeg": "image/jpeg", "jpg": "image/jpeg", "gif": "image/gif"}
FORMATS = {v: k for k, v in MEDIA_TYPES.items() if k != "jpg"}
_SNIFF = re.compile(rb'"schema_version"\s*:\s*"ATIF-')
# Episode columns a document carries in its root extra.halo (run_id and episode_id are session and trajectory).
_EPISODE_FIELDS = tuple(c for c in S.EPISODE_COLUMNS if c not in ("run_id", "episode_id", "policy", "model", "adapter",
                                                                    "policy_version", "mode"))
# Step columns kept under an agent step's extra.halo: everything the rest of the document does not say.
_STEP_EXTRA = ("step_idx", "url", "goal", "prompt", "prompt_version", "action_source", "macro", "action_valid", "parse_error",
               "reward_weights", "cumulative_progress", "state_hash", "latency_ms", "env_ms", "call_model",
               "screenshot_hash", "screenshot_after_hash", "extra")
_TOKEN_EXTRA = ("logprobs_mode", "draw", "choices", "logprob_sum")


# ---------------------------------------------------------------------- export
def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _image_part(shot_hash: str | None, formats: dict[str, str]) -> list[dict[str, Any]]:
    if not shot_hash or shot_hash not in formats:
        return []
    fmt = formats[shot_hash]
    return [{"type": "image", "source": {"media_type": MEDIA_TYPES.get(fmt, "image/png"), "path": image_path(shot_hash, fmt)}}]


def image_path(shot_hash: str, fmt: str) -> str:
    return f"images/{shot_hash}.{fmt}"


def _content(text: str | None, shot_hash: str | None, formats: dict[str, str]) -> str | list[dict[str, Any]] | None:
    image = _image_part(shot_hash, formats)
    if not image:
        return text
    return ([{"type": "text", "text": text}] if text else []) + image


def episode_document(rows: list[dict[str, Any]], formats: dict[str, str]) -> dict[str, Any]:
    """The ATIF document of one episode from its ``steps`` rows (in step order); ``formats``: screenshot hash -> format."""
    first, last = rows[0], rows[-1]
    agent = _drop_none({"name": AGENT_NAME, "version": __version__, "model_name": first["model"],
                        "extra": {k: first[k] for k in ("policy", "adapter", "policy_version", "mode")}})
    page0 = _drop_none({"content": _content(first["observation"], first["screenshot_hash"], formats),
                        "extra": _drop_none({"url": first["url"]}) or None})
    steps: list[dict[str, Any]] = [
        _drop_none({"step_id": 1, "source": "user", "message": first["goal"] or "", "timestamp": _json_value(first["started_at"])}),
        {"step_id": 2, "source": "system", "message": "environment reset", "observation": {"results": [page0]}},
    ]
    for i, row in enumerate(rows):
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        steps.append(_agent_step(len(steps) + 1, row, nxt, last, formats))
    metric_rows = [s.get("metrics") or {} for s in steps]
    final = _drop_none({
        "total_prompt_tokens": _total(metric_rows, "prompt_tokens"),
        "total_completion_tokens": _total(metric_rows, "completion_tokens"),
        "total_cost_usd": _total(metric_rows, "cost_usd"),
        "total_steps": len(steps),
        "extra": {k: last[k] for k in ("success", "task_reward", "raw_reward", "n_steps", "terminated", "truncated", "error")},
    })
    return {
        "schema_version": SPEC_VERSION,
        "session_id": first["run_id"],
        "trajectory_id": first["episode_id"],
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": {"halo": {k: _json_value(first[k]) for k in _EPISODE_FIELDS}},
    }


def _total(metrics: list[dict[str, Any]], key: str) -> Any:
    values = [m[key] for m in metrics if m.get(key) is not None]
    return sum(values) if values else None


def _agent_step(step_id: int, row: dict[str, Any], nxt: dict[str, Any] | None, last: dict[str, Any], formats: dict[str, str]) -> dict[str, Any]:
    call_id = f"call_{row['step_idx']}"
    after_hash = nxt["screenshot_hash"] if nxt is not None else row["screenshot_after_hash"]
    result = _drop_none({
        "source_call_id": call_id if row["action"] is not None else None,
        "content": _content(nxt["observation"] if nxt is not None else None, after_hash, formats),
        "extra": _drop_none({"url": nxt["url"] if nxt is not None else None, "error": row["action_error"]}) or None,
    })
    metrics = _drop_none({
        "prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"], "cost_usd": row["cost_usd"],
        "completion_token_ids": row["completion_token_ids"], "logprobs": row["logprobs"],
        "extra": _drop_none({k: row[k] for k in _TOKEN_EXTRA}) or None,
    })
    components = {c: row[S.reward_column(c)] for c in S.REWARD_COMPONENTS}
    extra: dict[str, Any] = {"rewards": components, "reward": row["reward"], "done": bool(row["is_last"]),
                             "halo": {k: row[k] for k in _STEP_EXTRA}}
    if row["is_last"]:
        extra["success"] = last["success"]
    step = {
        "step_id": step_id,
        "source": "agent",
        "message": row["model_output"] or "",
        "model_name": row["call_model"] if row["call_model"] and row["call_model"] != row["model"] else None,
        "tool_calls": [{"tool_call_id": call_id, "function_name": TOOL, "arguments": {"action": row["action"]}}]
        if row["action"] is not None else None,
        "observation": {"results": [result]} if result else None,
        "metrics": metrics or None,
        "extra": extra,
    }
    return _drop_none(step)


def select_episodes(lake: Lake, view: str | None = None, where: str | None = None, params: Any = None, as_of: Any = None) -> pa.Table:
    """Every ``steps`` row of the episodes chosen: those with a row in ``view`` (default ``steps``) matching ``where``."""
    from halo_data.query import run_query
    from halo_data.views import get_view

    source = view or "steps"
    if source != "steps":
        get_view(source)
    chosen = f'select distinct episode_id from "{source}"' + (f" where {where}" if where else "")
    try:
        return run_query(lake, f"select * from steps where episode_id in ({chosen}) order by run_id, episode_id, step_idx",
                         as_of=as_of, params=params)
    except LakeError as e:
        if "episode_id" in str(e) and source != "steps":
            raise LakeError(f"view {source} has no episode_id column: ATIF exports episodes (use steps or episodes)") from None
        raise


def _screenshots(lake: Lake, hashes: set[str], as_of: Any = None) -> dict[str, tuple[bytes, str]]:
    if not hashes:
        return {}
    con = lake.connect(as_of=as_of, views="screenshots")
    try:
        con.register("wanted", pa.table({"hash": sorted(hashes)}))
        rows = con.execute("select hash, image, format from screenshots where hash in (select hash from wanted)").fetchall()
    finally:
        con.close()
    return {h: (bytes(img), fmt or "png") for h, img, fmt in rows}


def export_atif(lake: Lake, output: str | Path, view: str | None = None, where: str | None = None, params: Any = None,
                as_of: Any = None) -> tuple[int, int]:
    """Write one ATIF document per chosen episode: into folder ``output`` (``<episode_id>.json``) or, for a
    ``.jsonl`` output, one document per line; screenshots go to ``images/`` beside them. Returns (episodes, images)."""
    table = select_episodes(lake, view, where, params, as_of)
    if table.num_rows == 0:
        what = f"{view or 'steps'}" + (f" where {where}" if where else "")
        raise LakeError(f"no episodes to export: {what} has no rows")
    output = Path(output)
    as_jsonl = output.suffix == ".jsonl"
    folder = output.parent if as_jsonl else output
    if not as_jsonl and output.is_file():
        raise LakeError(f"{output} is a file: ATIF export writes a folder of documents (or give a .jsonl file)")
    rows = table.to_pylist()
    hashes = {h for r in rows for h in (r["screenshot_hash"], r["screenshot_after_hash"]) if h}
    shots = _screenshots(lake, hashes, as_of)
    formats = {h: fmt for h, (_, fmt) in shots.items()}
    episodes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        episodes.setdefault(r["episode_id"], []).append(r)
    documents = []
    for eid, ep_rows in episodes.items():
        doc = episode_document(ep_rows, formats)
        problems = validate(doc)
        if problems:  # HALO's own output: a bug, never the user's
            raise RuntimeError(f"episode {eid}: the ATIF document is invalid: {problems[0]}")
        documents.append((eid, doc))
    folder.mkdir(parents=True, exist_ok=True)
    if shots:
        (folder / "images").mkdir(exist_ok=True)
        for h, (data, fmt) in shots.items():
            path = folder / image_path(h, fmt)
            if not path.exists():
                _write_atomic(path, data)
    if as_jsonl:
        text = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for _, doc in documents)
        _write_atomic(output, text.encode("utf-8"))
    else:
        for eid, doc in documents:
            _write_atomic(folder / f"{eid}.json", json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8"))
    return len(documents), len(shots)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# ---------------------------------------------------------------------- import
def sniff(path: Path) -> bool:
    """Whether a .json or .jsonl file looks like ATIF (its first 64 KiB name an ATIF schema_version)."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    return bool(_SNIFF.search(head))


def read_atif_source(path: Path, run_id: str | None, failures: list[str]) -> Iterator[ImportedEpisode]:
    """The episodes of an ATIF file: one document (.json) or one per line (.jsonl). A malformed document is
    reported in ``failures`` (``FILE: what is wrong``, ``FILE:LINE:`` in JSONL) and nothing of it is returned."""
    if path.suffix == ".jsonl":
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            failures.append(f"{path}: cannot read: {e}")
            return
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ImportFormatError(f"{where}: invalid JSON: {e.msg}") from None
                yield read_document(doc, where, path.parent, run_id, default_task=f"{path.stem}-{lineno}")
            except ImportFormatError as e:
                failures.append(str(e))
        return
    try:
        doc = imported.read_json_file(path)
        yield read_document(doc, str(path), path.parent, run_id, default_task=path.stem)
    except ImportFormatError as e:
        failures.append(str(e))


def _text_of(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = [p["text"] for p in content if p.get("type") == "text"]
    return "\n".join(texts) if texts else None


def _image_of(content: Any, where: str, folder: Path, shots: dict[str, Screenshot]) -> str | None:
    """The hash of the first image of ``content`` (its file read and kept in ``shots``); None without an image."""
    if not isinstance(content, list):
        return None
    for part in content:
        if part.get("type") != "image":
            continue
        source = part["source"]
        ref, media = source["path"], source["media_type"]
        fmt = FORMATS.get(media, "png")
        if ref.startswith("data:"):
            try:
                data = base64.b64decode(ref.split(",", 1)[1], validate=True)
            except (binascii.Error, ValueError, IndexError):
                raise ImportFormatError(f"{where}: image {ref[:40]}... is not valid base64") from None
        elif re.match(r"^[a-z][a-z0-9+.-]*://", ref):
            return None  # a remote image is not fetched
        else:
            file = Path(ref) if Path(ref).is_absolute() else folder / ref
            try:
                data = file.read_bytes()
            except OSError:
                raise ImportFormatError(f"{where}: image {ref} not found (looked in {file})") from None
        shot = Screenshot.from_bytes(data, format=fmt)
        shots.setdefault(shot.hash, shot)
        return shot.hash
    return None


def _page(results: list[dict[str, Any]], where: str, folder: Path, shots: dict[str, Screenshot]) -> tuple[str | None, str | None, str | None]:
    """What observation results show: their texts joined, the last URL one names (``extra.url``), the first image."""
    texts = [t for r in results if (t := _text_of(r.get("content"))) is not None]
    urls = [u for r in results if isinstance(u := (r.get("extra") or {}).get("url"), str)]
    images = [h for r in results if (h := _image_of(r.get("content"), where, folder, shots))]
    return ("\n".join(texts) if texts else None), (urls[-1] if urls else None), (images[0] if images else None)


def _action(step: dict[str, Any]) -> str | None:
    calls = step.get("tool_calls") or []
    if not calls:
        return None
    out = []
    for call in calls:
        args = call["arguments"]
        if call["function_name"] == TOOL and isinstance(args.get("action"), str):
            out.append(args["action"])
        else:
            out.append(f"{call['function_name']}({json.dumps(args, sort_keys=True)})")
    return "\n".join(out)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_document(doc: Any, where: str, folder: Path, run_id: str | None, default_task: str = "atif") -> ImportedEpisode:
    """One ATIF document as an ``ImportedEpisode``; ``ImportFormatError`` (``where: what is wrong``) if it is not valid."""
    problems = validate(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ImportFormatError(f"{where}: not a valid ATIF document: {problems[0]}{more}")
    extra = doc.get("extra") or {}
    agent = doc["agent"]
    from_halo = agent["name"] == AGENT_NAME and isinstance(extra.get("halo"), dict)
    # What HALO keeps in the extras is read from HALO's documents only: another producer's extras mean their own.
    halo = extra["halo"] if from_halo else {}
    agent_extra = (agent.get("extra") or {}) if from_halo else {}
    shots: dict[str, Screenshot] = {}
    steps_in = doc["steps"]
    goal_step = next((s for s in steps_in if s["source"] == "user"), None)
    goal = _text_of(goal_step["message"]) if goal_step is not None else None
    # The page each agent step acts on: the latest observation before it.
    page_text: str | None = None
    page_url: str | None = None
    page_shot: str | None = None
    records: list[StepRecord] = []
    history: list[str] = []
    agent_steps = [s for s in steps_in if s["source"] == "agent"]
    if not agent_steps:
        raise ImportFormatError(f"{where}: no agent step: nothing to land as a step")
    if not any(not s.get("is_copied_context") for s in agent_steps):
        raise ImportFormatError(f"{where}: no agent step of its own (only copied context): nothing to land as a step")
    for s in steps_in:
        swhere = f"{where}: steps[{s['step_id'] - 1}]"
        results = (s.get("observation") or {}).get("results") or []
        if s["source"] != "agent":
            if any(r.get("content") is not None for r in results):
                page_text, page_url, page_shot = _page(results, swhere, folder, shots)
            elif s["source"] == "user" and s is not goal_step:  # a later user turn is what the agent reads next
                page_text, page_url = _text_of(s["message"]), None
                page_shot = _image_of(s["message"], swhere, folder, shots)
            continue
        if s.get("is_copied_context"):  # context from an earlier trajectory, not this one's step (the spec: never trained on)
            page_text, page_url, page_shot = _page(results, swhere, folder, shots)
            continue
        sx = s.get("extra") or {}
        kept = sx["halo"] if from_halo and isinstance(sx.get("halo"), dict) else {}
        metrics = s.get("metrics") or {}
        mx = (metrics.get("extra") or {}) if from_halo else {}
        action = _action(s)
        error = next(((r.get("extra") or {}).get("error") for r in results if (r.get("extra") or {}).get("error")), None)
        after_text, after_url, after_shot = _page(results, swhere, folder, shots)
        step_goal = kept.get("goal", goal)
        url = kept.get("url", page_url)
        observation = page_text
        shot = kept.get("screenshot_hash", page_shot)
        rewards = sx.get("rewards") if isinstance(sx.get("rewards"), dict) else {}
        rewards = {c: _number(rewards.get(c)) for c in S.REWARD_COMPONENTS}  # one not given is unknown, not 0
        weights = kept.get("reward_weights")
        step_extra = kept.get("extra")
        if not from_halo:
            foreign = {k: v for k, v in sx.items() if k not in ("rewards", "reward", "done", "success", "halo")}
            if s.get("reasoning_content"):
                foreign["reasoning_content"] = s["reasoning_content"]
            if metrics.get("prompt_token_ids") is not None:
                foreign["prompt_token_ids"] = metrics["prompt_token_ids"]
            step_extra = json.dumps(foreign, sort_keys=True) if foreign else None
        fields = {
            "step_idx": len(records),
            "url": url,
            "goal": step_goal,
            "observation": observation,
            "screenshot_hash": shot,
            "screenshot_after_hash": kept.get("screenshot_after_hash", after_shot),
            "prompt": kept.get("prompt") or imported.text_prompt(step_goal, url, observation, history, shot),
            "prompt_version": kept.get("prompt_version"),
            # no model output where no model ran (llm_call_count 0: a deterministic dispatch, never trained on)
            "model_output": None if s.get("llm_call_count") == 0 or (from_halo and s["message"] == "") else _text_of(s["message"]),
            "action": action,
            "action_source": kept.get("action_source", "model"),
            "macro": kept.get("macro"),
            "action_valid": kept.get("action_valid", bool(action) and not error),
            "parse_error": kept.get("parse_error"),
            "action_error": error,
            "rewards": rewards,
            "weights": json.loads(weights) if isinstance(weights, str) else None,
            "reward": _number(sx.get("reward")),
            "cumulative_progress": kept.get("cumulative_progress"),
            "state_hash": kept.get("state_hash") or ids.state_hash(url or "", observation or ""),
            "latency_ms": kept.get("latency_ms"),
            "env_ms": kept.get("env_ms"),
            "prompt_tokens": metrics.get("prompt_tokens"),
            "completion_tokens": metrics.get("completion_tokens"),
            "call_model": kept.get("call_model", s.get("model_name")),
            "cost_usd": _number(metrics.get("cost_usd")),
            "logprobs": [float(x) for x in metrics["logprobs"]] if metrics.get("logprobs") is not None else None,
            "completion_token_ids": metrics.get("completion_token_ids"),
            **{k: mx.get(k) for k in _TOKEN_EXTRA},
            "is_last": None,
            "extra": step_extra,
        }
        if fields["logprob_sum"] is None and fields["logprobs"]:
            fields["logprob_sum"] = float(sum(fields["logprobs"]))
        records.append(imported.build_record(swhere, StepRecord, **fields))
        if action:
            history.append(action)
        page_text, page_url, page_shot = after_text, after_url, after_shot
    final = doc.get("final_metrics") or {}
    outcome = {**(final.get("extra") or {}), **{k: v for k, v in extra.items() if k != "halo"}}
    last_extra = agent_steps[-1].get("extra") or {}
    success = halo.get("success", outcome.get("success", last_extra.get("success")))
    success = success if isinstance(success, bool) else None
    task_id = halo.get("task_id") or next((extra[k] for k in ("task_id", "task_name") if isinstance(extra.get(k), str) and extra[k]), None)
    task_id = task_id or doc.get("trajectory_id") or doc.get("session_id") or default_task
    site, version = imported.site_and_version(task_id)
    run = run_id or imported.safe_run_id(doc.get("session_id") or f"atif-{folder.name}")
    started = halo.get("started_at") or steps_in[0].get("timestamp")  # an ISO 8601 time: the schema checked it
    fields = {
        "run_id": run,
        "env": halo.get("env") or ENV,
        "task_id": task_id,
        "site": halo.get("site", site if not from_halo else None),
        "task_version": halo.get("task_version", version if not from_halo else None),
        "split": halo.get("split"),
        "mode": agent_extra.get("mode", "imported"),
        "policy": agent_extra.get("policy", None if from_halo else agent["name"]),
        "model": agent.get("model_name"),
        "adapter": agent_extra.get("adapter"),
        "policy_version": agent_extra.get("policy_version", None if from_halo else agent["version"]),
        "seed": halo.get("seed"),
        "task_seed": halo.get("task_seed", 0),
        "temperature": halo.get("temperature"),
        "success": success,
        "task_reward": _number(halo.get("task_reward", outcome.get("task_reward", outcome.get("reward")))),
        "raw_reward": _number(halo.get("raw_reward", outcome.get("raw_reward"))),
        "n_steps": len(records),
        "terminated": halo.get("terminated", _typed(outcome.get("terminated"), bool)),
        "truncated": halo.get("truncated", _typed(outcome.get("truncated"), bool)),
        "error": halo.get("error", _typed(outcome.get("error"), str)),
        "error_kind": halo.get("error_kind"),
        "started_at": imported.parse_time(started, where),
        "ended_at": imported.parse_time(halo.get("ended_at"), where),
    }
    attempt = halo.get("attempt_idx")
    if attempt is not None:
        fields["attempt_idx"] = attempt
    episode = imported.build_record(where, EpisodeRecord, **fields)
    run_fields = {"run_id": run, "kind": "rollout", "mode": episode.mode, "env": episode.env, "policy": episode.policy,
                  "model": episode.model, "adapter": episode.adapter, "policy_version": episode.policy_version}
    return ImportedEpisode(where, episode, records, list(shots.values()), run_fields, attempt_given=attempt is not None)


def _typed(value: Any, kind: type) -> Any:
    return value if isinstance(value, kind) else None


