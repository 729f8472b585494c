"""Rows of the ``runs`` table: one typed record for every kind of run, its provenance, and secret redaction.

    record = RunRecord(run_id="r1", kind="rollout", env="miniwob", config={"tasks": [...]},
                       command=sys.argv, planned_episodes=8, started_at=utc_now())
    upsert_runs(lake, [record])                                  # status running
    upsert_runs(lake, [record.replace(status="finished", ended_at=utc_now())])

Rollouts, evals, training jobs, imports and synthetic data sets all record
their run here, so every row carries the same provenance (package versions,
git sha, host, Python) and nothing that looks like a secret: the values of
secret-named keys and options, and key-like strings (``sk-…``, ``hf_…``,
``Bearer …``) anywhere in the config or the command line, are replaced by
``[REDACTED]`` before a row is built. AWS access key ids and the ``user:password@`` part
of a URI count as key-like; a lake's S3 credentials stay in the environment and are never read here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import platform
import re
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from halo_data import ids
from halo_data.lake import Lake, LakeError

REDACTED = "[REDACTED]"
RUN_KINDS = ("rollout", "eval", "train")
RUN_STATUSES = ("running", "finished", "failed", "interrupted")
# Versions recorded in every run's provenance (those installed; the rest are left out).
PROVENANCE_PACKAGES = (
    "halo", "agisdk", "playwright", "miniwob", "deltalake", "duckdb", "pyarrow", "openai",
    "transformers", "torch", "peft", "trl", "datasets", "accelerate", "unsloth",
)
# "token" but not "tokens": max_tokens, prompt_tokens and the like are counts, not credentials.
_SECRET_NAME = re.compile(r"(key|token(?!s)|secret|password|passwd|authorization)", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"\b(sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{8,}|Bearer\s+\S+|(?:AKIA|ASIA)[A-Z0-9]{16})"
    # the user:password part of a URI (s3://KEY:SECRET@bucket/lake, https://user:pass@host)
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"
)
_REPO_ROOT = Path(__file__).resolve().parent.parent


class RunRecordError(LakeError, ValueError):
    """A runs row with a missing or invalid field."""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# ------------------------------------------------------------------------------------- redaction
def redact_text(text: str) -> str:
    """``text`` with key-like strings hidden."""
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_mapping(data: Any) -> Any:
    """``data`` (nested dicts and lists) with the values of secret-named keys and key-like strings hidden."""
    if isinstance(data, dict):
        return {k: (REDACTED if _SECRET_NAME.search(str(k)) and v else redact_mapping(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_mapping(v) for v in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


def redact_argv(argv: Sequence[str]) -> str:
    """The command line with the values of secret-looking options (and key-like strings) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and _SECRET_NAME.search(arg):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return shlex.join(out)


# ------------------------------------------------------------------------------------ provenance
def git_sha(root: Path = _REPO_ROOT) -> str | None:
    """The commit HALO runs from, or None outside a git checkout (an installed package)."""
    # Without this check an installed HALO inside some other repository would record that repository's commit.
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


@functools.lru_cache(maxsize=1)
def _process_provenance() -> str:
    from importlib import metadata

    versions = {}
    for dist in PROVENANCE_PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return json.dumps({
        "packages": versions,
        "git_sha": git_sha(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    })


def provenance(**extra: Any) -> dict[str, Any]:
    """Package versions, git sha, host and Python of this process (plus ``extra``); never secrets."""
    # Computed once per process: a run upserts its row more than once, and git is a subprocess.
    return {**json.loads(_process_provenance()), **redact_mapping(extra)}


# ------------------------------------------------------------------------------------ the record
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One row of ``runs``. ``row()`` gives its columns, with secrets redacted and JSON fields serialised.

    ``config`` is a mapping (stored as JSON with secret-named values hidden) or JSON
    text; ``command`` an argv list or one string; ``provenance`` defaults to this
    process's; ``lineage`` maps each table a training run read to its version.
    """

    run_id: str
    kind: str
    status: str = "running"
    mode: str | None = None
    env: str | None = None
    policy: str | None = None
    model: str | None = None
    adapter: str | None = None
    policy_version: str | None = None
    split: str | None = None
    task_version: str | None = None
    config: Mapping[str, Any] | str | None = None
    command: Sequence[str] | str | None = None
    planned_episodes: int | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    provenance: Mapping[str, Any] | None = dataclasses.field(default_factory=provenance)
    job_type: str | None = None
    base_model: str | None = None
    source_view: str | None = None
    lineage: Mapping[str, int] | None = None
    output_dir: str | None = None

    def __post_init__(self) -> None:
        try:
            ids.check_run_id(self.run_id)
        except ValueError as e:
            raise RunRecordError(f"run field 'run_id': {e}") from None
        if self.kind not in RUN_KINDS:
            raise RunRecordError(f"run field 'kind' must be one of {', '.join(RUN_KINDS)}, got {self.kind!r}")
        if self.status not in RUN_STATUSES:
            raise RunRecordError(f"run field 'status' must be one of {', '.join(RUN_STATUSES)}, got {self.status!r}")
        for name in ("started_at", "ended_at"):
            when = getattr(self, name)
            if when is not None and (not isinstance(when, dt.datetime) or when.tzinfo is None):
                raise RunRecordError(f"run field {name!r} must be a timezone-aware datetime, got {when!r}")

    def row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        if isinstance(self.config, Mapping):
            row["config"] = json.dumps(redact_mapping(dict(self.config)), sort_keys=True, default=str)
        elif self.config is not None:
            row["config"] = redact_text(self.config)
        if self.command is not None:
            row["command"] = redact_text(self.command) if isinstance(self.command, str) else redact_argv(self.command)
        for name in ("provenance", "lineage"):
            value = getattr(self, name)
            row[name] = None if value is None else json.dumps(redact_mapping(dict(value)), sort_keys=True, default=str)
        return row

    def replace(self, **changes: Any) -> "RunRecord":
        return dataclasses.replace(self, **changes)


def upsert_runs(lake: Lake, records: Sequence[RunRecord]) -> None:
    """Insert or update these runs' rows by run_id (a resumed run keeps one row)."""
    lake.upsert_runs([r.row() for r in records])


def existing_run(lake: Lake, run_id: str) -> dict[str, Any] | None:
    """The stored ``runs`` row of ``run_id``, or None."""
    rows = lake.query_arrow("select * from runs where run_id = $r", {"r": run_id}, views=False, tables=("runs",)).to_pylist()
    return rows[0] if rows else None
