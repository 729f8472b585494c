"""Buffered episode writer: whole episodes, one Delta commit per flush.

    with EpisodeWriter(lake) as writer:
        writer.write_episode(EpisodeRecord(...), [StepRecord(...), ...], screenshots)

Screenshots are appended before the steps that reference them, so a reader never
sees a step whose screenshot is missing. Steps of all buffered episodes go in one
``steps`` commit: a flush is all there or all absent, even if the process is
killed during it. A flush that fails (disk full, permission denied) raises
``LakeWriteError`` naming the episodes that were not written; nothing already in
the lake changes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import operator
import time
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from halo_data import ids
from halo_data import schema as S
from halo_data.lake import Lake, LakeError, conform
from halo_data.records import EpisodeRecord, StepRecord

log = logging.getLogger(__name__)


_STEP_ONLY_COLUMNS = tuple(c for c in S.STEPS.column_names if c not in S.EPISODE_COLUMNS)
_step_values = operator.itemgetter(*_STEP_ONLY_COLUMNS)


def _step_from_mapping(step: Mapping[str, Any], position: int) -> StepRecord:
    # A mapping may leave step_idx out, as writers before the records did: its position says it.
    return StepRecord.from_row(step if "step_idx" in step else {**step, "step_idx": position})


class LakeWriteError(LakeError):
    def __init__(self, message: str, episode_ids: Sequence[str]):
        super().__init__(message)
        self.episode_ids = list(episode_ids)


@dataclasses.dataclass(frozen=True)
class Screenshot:
    hash: str
    image: bytes
    format: str = "png"
    width: int | None = None
    height: int | None = None

    @classmethod
    def from_bytes(cls, image: bytes, format: str = "png", width: int | None = None, height: int | None = None) -> "Screenshot":
        if (width is None or height is None) and format == "png" and image[:8] == b"\x89PNG\r\n\x1a\n":
            width = int.from_bytes(image[16:20], "big")
            height = int.from_bytes(image[20:24], "big")
        return cls(ids.image_hash(image), image, format, width, height)


def _epoch_us(when: dt.datetime) -> int:
    return int(when.timestamp() * 1_000_000)


def screenshots_table(shots: Sequence[Screenshot], created_at: dt.datetime | None = None) -> pa.Table:
    """Rows of the ``screenshots`` table for these images."""
    now = created_at or dt.datetime.now(dt.timezone.utc)
    return pa.table(
        {
            "hash_prefix": [s.hash[0] for s in shots],
            "hash": [s.hash for s in shots],
            "image": pa.array([s.image for s in shots], pa.binary()),
            "format": [s.format for s in shots],
            "width": pa.array([s.width for s in shots], pa.int32()),
            "height": pa.array([s.height for s in shots], pa.int32()),
            # from integers: converting tz-aware datetimes makes pyarrow import pandas (~0.4 s)
            "created_at": pa.array([_epoch_us(now)] * len(shots), pa.int64()).cast(S.TS),
        }
    )


@dataclasses.dataclass
class FlushResult:
    episode_ids: list[str]
    steps: int
    screenshots: int
    steps_version: int | None
    seconds: float


class EpisodeWriter:
    """Buffers finished episodes and appends them in one transaction per flush.

    A flush happens after ``flush_episodes`` episodes, or at the first episode
    written ``flush_seconds`` after the previous flush, and on ``close()``.
    """

    def __init__(self, lake: Lake, flush_episodes: int = 8, flush_seconds: float = 10.0, known_screenshots: Iterable[str] | None = None):
        self.lake = lake
        self.flush_episodes = max(1, int(flush_episodes))
        self.flush_seconds = float(flush_seconds)
        self._episodes: dict[str, None] = {}  # ordered, O(1) membership (bulk writers buffer thousands)
        self._columns: dict[str, list[Any]] = {c: [] for c in S.STEPS.column_names}
        self._n_rows = 0
        self._shots: dict[str, Screenshot] = {}
        self._known: set[str] | None = set(known_screenshots) if known_screenshots is not None else None
        self._last_flush = time.monotonic()
        self.flushes: list[FlushResult] = []

    # ------------------------------------------------------------------ buffering
    def write_episode(
        self,
        episode: EpisodeRecord | Mapping[str, Any],
        steps: Sequence[StepRecord | Mapping[str, Any]],
        screenshots: Iterable[Screenshot] = (),
    ) -> str:
        """Buffer one finished episode; returns its id. May flush.

        ``episode`` and ``steps`` are records (``halo_data.records``); a plain mapping is
        built into one first, so its fields are checked the same way (a step mapping
        without ``step_idx`` takes its position).
        """
        if not isinstance(episode, EpisodeRecord):
            episode = EpisodeRecord.from_row(episode)
        eid = episode.episode_id
        if not steps:
            raise LakeError(f"episode {eid} has no steps: record at least the step on which it failed")
        if eid in self._episodes:
            raise LakeError(f"episode {eid} is already buffered")
        rows = [(s if isinstance(s, StepRecord) else _step_from_mapping(s, i)).row() for i, s in enumerate(steps)]
        n = len(rows)
        fields = episode.row()
        if fields["n_steps"] is None:
            fields["n_steps"] = n
        # Column by column, not row by row: this loop is most of a writer's Python cost per step
        # (a record's row has every step column, so itemgetter and zip transpose them in C).
        cols = self._columns
        for c in S.EPISODE_COLUMNS:
            cols[c].extend([fields[c]] * n)
        for c, values in zip(_STEP_ONLY_COLUMNS, zip(*map(_step_values, rows))):
            if c == "is_last":
                cols[c].extend([v if v is not None else i == n - 1 for i, v in enumerate(values)])
            else:
                cols[c].extend(values)
        self._n_rows += n
        for shot in screenshots:
            if self._known is not None and shot.hash in self._known:
                continue
            self._shots.setdefault(shot.hash, shot)
        self._episodes[eid] = None
        if len(self._episodes) >= self.flush_episodes or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
        return eid

    @property
    def pending_episodes(self) -> list[str]:
        return list(self._episodes)

    def steps_table(self) -> pa.Table:
        """The buffered episodes' steps as one Arrow table in the ``steps`` schema (what a flush appends)."""
        return pa.Table.from_pydict(self._columns, schema=S.STEPS.schema)

    # ------------------------------------------------------------------ committing
    def _load_known(self) -> None:
        if self._known is not None:
            return
        con = self.lake.connect(views=False, tables=("screenshots",))  # opening every table costs a run ~0.1 s more
        try:
            self._known = {r[0] for r in con.execute("select distinct hash from screenshots_all").fetchall()}
        finally:
            con.close()
        for h in list(self._shots):
            if h in self._known:
                del self._shots[h]

    def flush(self) -> FlushResult | None:
        if not self._episodes:
            return None
        t0 = time.perf_counter()
        episodes = list(self._episodes)
        try:
            self._load_known()
            now = dt.datetime.now(dt.timezone.utc)
            shots = list(self._shots.values())
            if shots:
                self.lake.append("screenshots", screenshots_table(shots, now))
                assert self._known is not None
                self._known.update(s.hash for s in shots)
                self._shots.clear()
            version = self.lake.append("steps", self.steps_table())
        except LakeError:
            raise
        except Exception as e:
            raise LakeWriteError(
                f"could not write {len(episodes)} episode(s) to {self.lake.root}: {e}", episodes
            ) from e
        result = FlushResult(episodes, self._n_rows, len(shots), version, time.perf_counter() - t0)
        log.debug("flushed %d episodes, %d steps, %d screenshots in %.3fs", len(episodes), self._n_rows, len(shots), result.seconds)
        self._episodes.clear()
        self._columns = {c: [] for c in S.STEPS.column_names}
        self._n_rows = 0
        self._last_flush = time.monotonic()
        self.flushes.append(result)
        return result

    def discard(self) -> list[str]:
        """Drop buffered episodes without writing them; returns their ids."""
        dropped = list(self._episodes)
        self._episodes.clear()
        self._columns = {c: [] for c in S.STEPS.column_names}
        self._n_rows = 0
        self._shots.clear()
        return dropped

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or exc_type is KeyboardInterrupt:
            self.close()


def append_rows(lake: Lake, table: str, rows: Sequence[Mapping[str, Any]]) -> int:
    """Append plain rows (dicts) to a table in one commit: candidates, mcts_nodes, train_metrics."""
    spec = S.TABLES[table]
    data = pa.Table.from_pylist([dict(r) for r in rows], schema=spec.schema) if rows else spec.schema.empty_table()
    return lake.append(table, conform(data, spec))
