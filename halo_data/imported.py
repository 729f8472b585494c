"""An imported episode and what every import format shares: its error, the record it builds, the run id, site and
version it derives, timestamps and the prompt a text policy would have seen. ``halo_data.importers`` (agisdk folders,
JSONL), ``halo_data.atif`` and ``halo_data.art`` read their sources into ``ImportedEpisode``; the import writes them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from halo_data import ids, prompts
from halo_data.lake import LakeError
from halo_data.records import EpisodeRecord, RecordError, StepRecord
from halo_data.writer import Screenshot

_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ImportFormatError(LakeError):
    """A source that cannot be imported; its message starts with ``FILE:LINE:``."""


@dataclasses.dataclass
class ImportedEpisode:
    source: str
    episode: EpisodeRecord
    steps: list[StepRecord]
    screenshots: list[Screenshot]
    run_fields: dict[str, Any]
    attempt_given: bool = False  # else the import numbers the attempts of a (run, task, task_seed)


def build_record(where: str, record: type, **fields: Any) -> Any:
    """``record(**fields)``; a field the record refuses is reported at ``where`` like any malformed source."""
    try:
        return record(**fields)
    except RecordError as e:
        raise ImportFormatError(f"{where}: {e}") from None


def safe_run_id(text: str) -> str:
    """A run id HALO accepts, made from any text (a source's uuid, folder or session name)."""
    cleaned = _RUN_ID_UNSAFE.sub("-", text).strip("-._")[:120] or "import"
    return ids.check_run_id(cleaned if cleaned[0].isalnum() else "i" + cleaned)


def site_and_version(task_id: str) -> tuple[str | None, str | None]:
    """``v2.omnizon-1`` -> (omnizon, v2); ``miniwob.click-button`` -> (miniwob, None)."""
    head, _, rest = task_id.partition(".")
    if head == "miniwob":
        return "miniwob", None
    version = head if re.fullmatch(r"v\d+", head) and rest else None
    name = rest if version else task_id
    return re.sub(r"-\d+$", "", name) or None, version


def parse_time(value: Any, where: str) -> dt.datetime | None:
    """ISO 8601 or Unix seconds as an aware UTC time (a naive ISO time is taken as UTC); None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(float(value), dt.timezone.utc)
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ImportFormatError(f"{where}: {value!r} is not an ISO 8601 time or Unix seconds") from None
        return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
    raise ImportFormatError(f"{where}: {value!r} is not an ISO 8601 time or Unix seconds")


def text_prompt(goal: str | None, url: str | None, observation: str | None, history: list[str], screenshot_hash: str | None) -> str:
    """The prompt a text policy would have seen; the record adds its version and hash."""
    return prompts.dumps(prompts.render_messages(goal or "", url or "", observation or "", history=history,
                                                 screenshot_hash=screenshot_hash))


def read_json_file(path: Path) -> Any:
    """The JSON in ``path``, or ``ImportFormatError`` saying why it cannot be read (``FILE:LINE:`` for bad JSON)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ImportFormatError(f"{path}: cannot read: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ImportFormatError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
