"""Data access for the dashboard: aggregate queries in DuckDB over one lake snapshot.

Every page asks for small results (aggregates, one episode's steps, one image) and
never pulls a whole table into pandas. Results are cached per *snapshot*: the
cache key holds the version of every lake table, so a query is re-run exactly
when new files land (``Lake.versions()`` is cheap and itself re-read at most every
``HALO_DASHBOARD_REFRESH_SECONDS``, default 2 s).

    snap = current_snapshot()              # None when the lake is missing (message shown)
    df = snap.df("select run_id, count(*) as n from steps group by 1")
    png = snap.screenshot(hash_)           # one image, by hash
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any, Mapping

import duckdb
import pandas as pd
import streamlit as st

from halo_data.config import ViewParams
from halo_data.lake import Lake, LakeError
from halo_data.reader import cursor as reader_cursor
from halo_data.reader import set_params

log = logging.getLogger(__name__)

REFRESH_SECONDS = float(os.environ.get("HALO_DASHBOARD_REFRESH_SECONDS", "2"))
LAKE_ROOT_KEY = "halo_lake_root"


def lake_root_from_argv(argv: list[str] | None = None) -> str:
    """``streamlit run dashboards/app.py -- --lake PATH``; else $HALO_LAKE; else ``lake``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lake")
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.lake or os.environ.get("HALO_LAKE") or "lake"


@dataclasses.dataclass(frozen=True)
class LakeStatus:
    root: str
    ok: bool
    message: str
    has_steps: bool = False


@st.cache_data(ttl=REFRESH_SECONDS, show_spinner=False, max_entries=8)
def _versions(root: str) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(Lake.open(root).versions().items()))


@st.cache_resource(max_entries=4, show_spinner=False)
def _connection(root: str, versions: tuple[tuple[str, int], ...], runs: tuple[str, ...] | None = None) -> duckdb.DuckDBPyConnection:
    # Pinned to the versions in the key, so every query under this key sees one snapshot
    # even if a writer commits meanwhile. Queries run on cursors (one per query) because
    # Streamlit serves sessions from several threads. With ``runs``: those runs' rows alone, from their files alone.
    log.info("opening lake %s at %s%s", root, dict(versions), f" for {len(runs)} runs" if runs else "")
    return Lake.open(root).connect(as_of=dict(versions), runs=list(runs) if runs is not None else None)


def _cursor(root: str, versions: tuple[tuple[str, int], ...], runs: tuple[str, ...] | None = None) -> duckdb.DuckDBPyConnection:
    cursor = reader_cursor(_connection(root, versions, runs))
    # DuckDB variables belong to a connection, not its database: the views' weights and
    # parameters must be set on every cursor (the dashboard shows the default weights).
    set_params(cursor, ViewParams())
    return cursor


def _freeze(params: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    out = []
    for k, v in sorted((params or {}).items()):
        out.append((k, tuple(v) if isinstance(v, (list, tuple, set)) else v))
    return tuple(out)


def _thaw(params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params}


@st.cache_data(max_entries=512, show_spinner=False)
def _query_df(root: str, versions: tuple[tuple[str, int], ...], sql: str, params: tuple[tuple[str, Any], ...],
              runs: tuple[str, ...] | None = None) -> pd.DataFrame:
    cursor = _cursor(root, versions, runs)
    try:
        return cursor.execute(sql, _thaw(params) or None).df()
    finally:
        cursor.close()


@st.cache_data(max_entries=16, show_spinner=False)
def _steps_by_run(root: str, versions: tuple[tuple[str, int], ...]) -> pd.DataFrame:
    """Rows and files of ``steps`` per run, from the snapshot's log (file statistics); only files that hold several
    runs (compacted) are opened, for their run_id column alone."""
    from halo_data.ops import steps_per_run

    return steps_per_run(Lake.open(root), dict(versions)["steps"]).to_pandas()


@st.cache_data(max_entries=16, show_spinner=False)
def _run_starts(root: str, versions: tuple[tuple[str, int], ...]) -> pd.DataFrame:
    """run_id, started_at of every ``runs`` row, newest first (the runs table alone is opened)."""
    return Lake.open(root).query_arrow(
        "select run_id, started_at from runs order by started_at desc nulls last, run_id",
        as_of=dict(versions), views=False, tables=("runs",),
    ).to_pandas()


@st.cache_data(max_entries=64, show_spinner=False)
def _screenshot(root: str, versions: tuple[tuple[str, int], ...], image_hash: str) -> tuple[bytes, str] | None:
    cursor = _cursor(root, versions)
    try:
        # hash_prefix is the partition key: DuckDB reads only that partition's files.
        row = cursor.execute(
            "select image, format from screenshots where hash_prefix = $prefix and hash = $hash",
            {"prefix": image_hash[:1], "hash": image_hash},
        ).fetchone()
    finally:
        cursor.close()
    if row is None or row[0] is None:
        return None
    return bytes(row[0]), row[1] or "png"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One version of every table of a lake; queries against it are cached."""

    root: str
    versions: tuple[tuple[str, int], ...]

    @property
    def lake(self) -> Lake:
        return Lake.open(self.root)

    def df(self, sql: str, params: Mapping[str, Any] | None = None, runs: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
        """Run an aggregate query; the result must be small (it is cached and copied). ``runs``: over those runs'
        rows alone, reading their files alone (``halo_data.reader.connect``)."""
        return _query_df(self.root, self.versions, sql, _freeze(params), tuple(sorted(runs)) if runs is not None else None)

    def steps_by_run(self) -> pd.DataFrame:
        """run_id, steps, files of every run with steps, from the log alone."""
        return _steps_by_run(self.root, self.versions)

    def run_starts(self) -> pd.DataFrame:
        """run_id, started_at of every run with a ``runs`` row, newest first."""
        return _run_starts(self.root, self.versions)

    def has_steps(self) -> bool:
        return bool(self.steps_by_run()["steps"].sum() > 0)

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        frame = self.df(sql, params)
        return None if frame.empty else frame.iat[0, 0]

    def screenshot(self, image_hash: str | None) -> tuple[bytes, str] | None:
        """(image bytes, format) of one screenshot, or None when it is not stored."""
        if not image_hash:
            return None
        return _screenshot(self.root, self.versions, image_hash)

    def version_of(self, table: str) -> int:
        return dict(self.versions)[table]


def lake_status(root: str) -> tuple[LakeStatus, Snapshot | None]:
    try:
        versions = _versions(root)
    except LakeError as e:
        return LakeStatus(root, False, str(e)), None
    except Exception as e:  # a damaged table: say which lake, keep the app alive
        log.exception("cannot read lake %s", root)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return LakeStatus(root, False, f"cannot read the lake at {root}: {first}"), None
    snap = Snapshot(root, versions)
    try:
        has_steps = snap.has_steps()
    except Exception as e:
        log.exception("cannot query lake %s", root)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return LakeStatus(root, False, f"cannot query the lake at {root}: {first}"), None
    return LakeStatus(root, True, "", has_steps), snap


def refresh() -> None:
    """Forget the remembered table versions so the next run sees the newest snapshot."""
    _versions.clear()


def current_snapshot() -> Snapshot | None:
    """The snapshot of the lake the app was started on; shows a message and returns None if it cannot be read."""
    root = st.session_state.get(LAKE_ROOT_KEY) or lake_root_from_argv()
    status, snap = lake_status(root)
    if not status.ok:
        st.error(status.message)
        return None
    return snap


def require_steps(snap: Snapshot | None) -> bool:
    """True when the lake holds episodes; otherwise explains how to get some."""
    if snap is None:
        return False
    if not snap.has_steps():
        st.info(
            f"The lake at {snap.root} has no episodes yet. Collect some with "
            f"`halo-agent rollout --lake {snap.root} ...` or import them with "
            f"`halo-data import --lake {snap.root} ...`; this page updates when they land."
        )
        return False
    return True


@st.cache_data(max_entries=64, show_spinner=False)
def runs_in_steps_at(root: str, steps_version: int) -> pd.DataFrame:
    """Runs and their episode counts in the ``steps`` table at one version (a training run's lineage)."""
    lake = Lake.open(root)
    return lake.query_arrow(
        "select run_id, count(distinct episode_id) as episodes, count(*) as steps from steps group by run_id order by run_id",
        as_of={"steps": int(steps_version)},
        views=False,
    ).to_pandas()
