"""A HALO lake: one Delta table per table, plus ``meta/info.json``.

    lake = Lake.init("lake")            # creates meta/info.json and every table, once
    lake = Lake.open("lake")            # checks the format version
    lake.append("train_metrics", table) # one atomic commit, retried under contention
    con = lake.connect()                # DuckDB with every table and view registered
    con.sql("select * from grpo_groups").pl()

Readers go through each table's snapshot file list (never a folder glob, which
would also see files that compaction or a delete removed), so a query always
sees one whole version of every table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa

from halo_data import schema as S
from halo_data._version import __version__
from halo_data.errors import LakeError

log = logging.getLogger(__name__)

INFO_PATH = "meta/info.json"
# Measured: with the default of 15 retries, 8 processes appending at once gave up;
# commits are cheap to retry, so allow many.
MAX_COMMIT_RETRIES = 1000


# Delta properties of every table HALO creates (`halo-data compact` sets them on an older lake's tables).
# A checkpoint every 10 commits, not delta-rs's 100: opening a table reads the last checkpoint and every commit
# since, one GET each on an object store, and an online campaign commits to steps several times per iteration.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}
# A checkpoint's file name in a table's log: single-part or one part of a multi-part checkpoint.
DELTA_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet")

# Per table, the columns of long free text: no dictionary, no statistics.
LONG_TEXT_COLUMNS = {
    "steps": ("observation", "prompt", "model_output", "extra"),
    "candidates": ("prompt", "model_output"),
    "mcts_nodes": ("prompt", "model_output", "goal"),
}
# Per table, columns no read filters on (reads prune by run_id; hashes are join keys, whose file-level min and max
# span the whole range) whose min/max would still fill every file's entry in the Delta log, which every reader
# replays and every checkpoint repeats: no statistics, dictionary kept (an episode's steps repeat their goal and
# URLs). In steps, goal, url and the screenshot hashes were 27% of each file's entry.
UNFILTERED_COLUMNS = {
    "steps": ("url", "goal", "screenshot_hash", "screenshot_after_hash", "prompt_hash", "state_hash"),
    "candidates": ("prompt_hash", "state_hash"),
    "mcts_nodes": ("url", "screenshot_hash", "prompt_hash", "state_hash"),
}


def unindexed_columns(table: str | None) -> set[str]:
    """The columns of ``table`` written without statistics."""
    return set(LONG_TEXT_COLUMNS.get(table or "", ())) | set(UNFILTERED_COLUMNS.get(table or "", ()))


# Compaction packs many runs into one file of a table partitioned by env; a run-scoped read then skips the row
# groups whose run_id statistics exclude its runs, so row groups stay a fraction of a file (parquet-rs's default
# is 1M rows: a whole compacted file read for one run).
RUN_ROW_GROUP_ROWS = 16384


def writer_properties(table: str | None = None):
    """Parquet settings of the files HALO writes to ``table``.

    zstd level 3: the text columns (AXTree, prompts that repeat most of it) come out ~3x
    smaller than with delta-rs's default snappy, at the same write speed (measured on
    synthetic rollouts). Screenshots are PNG/WebP, already compressed: compressing them
    again only costs time, and min/max statistics of image bytes are useless.
    """
    from deltalake import ColumnProperties, WriterProperties

    if table == "screenshots":
        return WriterProperties(
            compression="UNCOMPRESSED",
            column_properties={"image": ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")},
        )
    if table in LONG_TEXT_COLUMNS or table in UNFILTERED_COLUMNS:
        # Long unique texts: trying a dictionary first and falling back costs time and saves nothing, and their
        # min/max statistics (whole prompts) would go into every file's entry in the Delta log, which every reader
        # replays: candidates' entries were ~10 kB each with them.
        plain = ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
        unfiltered = ColumnProperties(statistics_enabled="NONE")
        return WriterProperties(
            compression="ZSTD",
            compression_level=3,
            max_row_group_size=RUN_ROW_GROUP_ROWS,
            column_properties={**{c: unfiltered for c in UNFILTERED_COLUMNS.get(table, ())},
                               **{c: plain for c in LONG_TEXT_COLUMNS.get(table, ())}},
        )
    return WriterProperties(compression="ZSTD", compression_level=3)


class LakeNotFound(LakeError):
    pass


class LakeVersionError(LakeError):
    pass


@dataclasses.dataclass
class LakeInfo:
    """The content of ``meta/info.json``."""

    format_version: int
    tables: dict[str, dict[str, Any]]
    created_at: str
    created_by: str

    @classmethod
    def current(cls) -> "LakeInfo":
        return cls(
            format_version=S.FORMAT_VERSION,
            tables={
                name: {
                    "partition_by": list(spec.partition_by),
                    "doc": spec.doc,
                    "columns": {c.name: {"type": str(c.type), "doc": c.doc} for c in spec.columns},
                }
                for name, spec in S.TABLES.items()
            },
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            created_by=f"halo {__version__}",
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False)


# S3 itself does not stop two writers committing the same table version: delta-rs needs
# conditional puts (S3, MinIO, R2, moto) or a DynamoDB lock for that. These variables
# (delta-rs's names) say which; they carry no secret, so HALO passes them on explicitly.
# Credentials stay in the environment, where delta-rs and pyarrow read them: a Lake never holds them.
S3_COMMIT_ENV = ("AWS_CONDITIONAL_PUT", "AWS_S3_LOCKING_PROVIDER", "DELTA_DYNAMO_TABLE_NAME", "AWS_ALLOW_HTTP")
S3_SAFE_COMMIT_OPTIONS = ("aws_conditional_put", "aws_s3_locking_provider")


def _scheme(root: str) -> str:
    return urllib.parse.urlparse(root).scheme.lower()


def storage_options_from_env(root: str) -> dict[str, str] | None:
    """The commit options of an ``s3://`` lake from the environment; None for other lakes."""
    if _scheme(root) not in ("s3", "s3a"):
        return None
    return {k.lower(): os.environ[k] for k in S3_COMMIT_ENV if os.environ.get(k)}


def check_safe_commits(root: str, storage_options: Mapping[str, str] | None) -> None:
    """Refuse to write an S3 lake whose commits could overwrite each other."""
    if _scheme(root) not in ("s3", "s3a"):
        return
    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    if any(options.get(k) for k in S3_SAFE_COMMIT_OPTIONS):
        return
    raise LakeError(
        f"{root}: writers to an S3 lake need safe commits: export AWS_CONDITIONAL_PUT=etag "
        "(S3, MinIO, R2), or AWS_S3_LOCKING_PROVIDER=dynamodb with DELTA_DYNAMO_TABLE_NAME"
    )


def _is_local(root: str) -> bool:
    scheme = urllib.parse.urlparse(root).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def _local_path(root: str) -> Path:
    if root.startswith("file://"):
        return Path(urllib.parse.urlparse(root).path)
    return Path(root)


def conform(table: pa.Table, spec: S.TableSpec) -> pa.Table:
    """Cast ``table`` to the spec's schema: missing columns become NULL, unknown ones are an error."""
    unknown = [n for n in table.column_names if n not in spec.column_names]
    if unknown:
        raise LakeError(f"unknown column(s) for table {spec.name}: {', '.join(unknown)}")
    cols = []
    for c in spec.columns:
        if c.name in table.column_names:
            col = table.column(c.name)
            cols.append(col if col.type == c.type else col.cast(c.type))
        else:
            cols.append(pa.nulls(table.num_rows, c.type))
    return pa.Table.from_arrays(cols, schema=spec.schema)


class Lake:
    """An opened lake. Cheap to create; holds no open files."""

    def __init__(self, root: str | os.PathLike[str], info: LakeInfo, storage_options: dict[str, str] | None = None):
        self.root = str(root).rstrip("/")
        self.info = info
        self.storage_options = storage_options if storage_options is not None else storage_options_from_env(self.root)
        # Tables this object appends to, kept open between appends: re-opening one replays its
        # log, which was ~40% of a writer's flush (measured); the cache is brought up to date
        # incrementally before each append.
        self._append_tables: dict[str, Any] = {}
        # The snapshot of each table last opened here: a read that pins the versions it just looked up
        # (``connect(as_of=lake.versions())``, as training jobs do) reuses them instead of replaying each log again.
        self._snapshots: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_append_tables": {}, "_snapshots": {}}

    # ------------------------------------------------------------------ open / init
    @classmethod
    def init(cls, root: str | os.PathLike[str], storage_options: dict[str, str] | None = None) -> "Lake":
        """Create the lake (idempotent): ``meta/info.json`` and every table, before any writer starts."""
        from deltalake import DeltaTable

        root = str(root).rstrip("/")
        if storage_options is None:
            storage_options = storage_options_from_env(root)
        check_safe_commits(root, storage_options)
        existing = cls._read_info(root, storage_options)
        if existing is not None:
            lake = cls._from_info(root, existing, storage_options)
        else:
            lake = cls(root, LakeInfo.current(), storage_options)
        for name, spec in S.TABLES.items():
            uri = lake.table_uri(name)
            if DeltaTable.is_deltatable(uri, storage_options=storage_options):
                lake._evolve_schema(name)
                continue
            DeltaTable.create(
                uri,
                schema=spec.schema,
                configuration=dict(TABLE_PROPERTIES),
                mode="ignore",
                partition_by=lake.layout(name) or None,
                name=name,
                description=spec.doc,
                storage_options=storage_options,
            )
        if existing is None:
            lake._write_info()
        return lake

    @classmethod
    def open(cls, root: str | os.PathLike[str] | None = None, storage_options: dict[str, str] | None = None) -> "Lake":
        root = str(root or os.environ.get("HALO_LAKE") or "lake").rstrip("/")
        info = cls._read_info(root, storage_options)
        if info is None:
            raise LakeNotFound(f"no HALO lake at {root}: create one with `halo-data init {root}` or pass --lake PATH")
        return cls._from_info(root, info, storage_options)

    @classmethod
    def _from_info(cls, root: str, info: LakeInfo, storage_options) -> "Lake":
        if info.format_version > S.FORMAT_VERSION:
            raise LakeVersionError(
                f"lake {root} has format version {info.format_version}, this HALO reads up to "
                f"{S.FORMAT_VERSION}: upgrade HALO (pip install -U halo) to read it"
            )
        return cls(root, info, storage_options)

    @classmethod
    def _read_info(cls, root: str, storage_options) -> LakeInfo | None:
        raw = cls._read_text(root, INFO_PATH, storage_options)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return LakeInfo(
                format_version=int(data["format_version"]),
                tables=dict(data.get("tables", {})),
                created_at=str(data.get("created_at", "")),
                created_by=str(data.get("created_by", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise LakeError(f"{root}/{INFO_PATH} is not a HALO lake info file ({e}): restore it or re-run `halo-data init`") from None

    @staticmethod
    def _read_text(root: str, rel: str, storage_options) -> str | None:
        if _is_local(root):
            p = _local_path(root) / rel
            return p.read_text() if p.exists() else None
        import pyarrow.fs as pafs

        fs, base = pafs.FileSystem.from_uri(root)
        path = f"{base}/{rel}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as f:
            return f.read().decode()

    def list_files(self, rel: str) -> dict[str, int]:
        """The files directly in the lake's folder ``rel``: name -> bytes."""
        if _is_local(self.root):
            folder = _local_path(self.root) / rel
            return {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()} if folder.is_dir() else {}
        import pyarrow.fs as pafs

        fs, base = pafs.FileSystem.from_uri(self.root)
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/{rel}", allow_not_found=True))
        return {i.base_name: i.size for i in infos if i.type == pafs.FileType.File}

    def _write_info(self) -> None:
        self.write_meta(INFO_PATH, (LakeInfo.current() if self.info is None else self.info).to_json())

    def read_meta(self, rel: str) -> str | None:
        """A file of the lake's own (under ``meta/``), None where there is none."""
        return self._read_text(self.root, rel, self.storage_options)

    def write_meta(self, rel: str, text: str) -> None:
        """Write a file of the lake's own whole: a reader sees the old text or the new, never part of it."""
        if _is_local(self.root):
            p = _local_path(self.root) / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, p)
        else:
            import pyarrow.fs as pafs

            fs, base = pafs.FileSystem.from_uri(self.root)
            with fs.open_output_stream(f"{base}/{rel}") as f:
                f.write(text.encode())

    def delete_meta(self, rel: str) -> None:
        """Delete a file of the lake's own, or of a table's log (``TABLE/_delta_log/NAME``); gone already is fine."""
        if _is_local(self.root):
            (_local_path(self.root) / rel).unlink(missing_ok=True)
        else:
            import pyarrow.fs as pafs

            fs, base = pafs.FileSystem.from_uri(self.root)
            if fs.get_file_info(f"{base}/{rel}").type != pafs.FileType.NotFound:
                fs.delete_file(f"{base}/{rel}")

    def _evolve_schema(self, name: str) -> None:
        """Add columns this HALO knows and the table lacks (an older lake); never drops or retypes."""
        from deltalake import DeltaTable, write_deltalake

        spec = S.TABLES[name]
        dtab = DeltaTable(self.table_uri(name), storage_options=self.storage_options)
        have = {f.name for f in pa.schema(dtab.schema().to_arrow())}
        if set(spec.column_names) <= have:
            return
        log.info("adding columns %s to %s", sorted(set(spec.column_names) - have), name)
        write_deltalake(
            dtab,
            spec.schema.empty_table(),
            mode="append",
            schema_mode="merge",
            partition_by=dtab.metadata().partition_columns or None,
            storage_options=self.storage_options,
        )

    # ------------------------------------------------------------------ tables
    def layout(self, name: str) -> list[str]:
        """The partition columns of table ``name`` in this lake's format: an older lake keeps its own layout (what its
        info file records) until ``halo-data upgrade`` rewrites it; a new one has this HALO's."""
        recorded = self.info.tables.get(name, {}).get("partition_by") if self.info.format_version < S.FORMAT_VERSION else None
        return list(recorded) if recorded is not None else list(S.TABLES[name].partition_by)

    @property
    def is_local(self) -> bool:
        return _is_local(self.root)

    def check_writable(self) -> None:
        """Raise ``LakeError`` before a write that could lose another writer's commit."""
        check_safe_commits(self.root, self.storage_options)

    def table_uri(self, name: str) -> str:
        if name not in S.TABLES:
            raise LakeError(f"unknown table {name!r}; tables are {', '.join(S.TABLES)}")
        return f"{self.root}/{name}"

    def table(self, name: str, version: int | dt.datetime | None = None):
        from deltalake import DeltaTable

        if isinstance(version, int):
            cached = self._snapshots.get(name)
            if cached is not None and cached.version() == version:  # a caller's commit through it moved its version
                return cached
        try:
            if isinstance(version, int):  # opened at the version: the log is replayed once, not to its end and back
                dtab = DeltaTable(self.table_uri(name), version=version, storage_options=self.storage_options)
            else:
                dtab = DeltaTable(self.table_uri(name), storage_options=self.storage_options)
                if version is not None:
                    dtab.load_as_version(version)
        except LakeError:
            raise
        except Exception as e:  # delta-rs raises several types for a missing table/version
            raise LakeError(f"cannot open table {name} of {self.root}{'' if version is None else f' at {version}'}: {e}") from None
        if version is None:
            self._snapshots[name] = dtab
        return dtab

    def versions(self) -> dict[str, int]:
        """Current version of every table (what a training run records as lineage)."""
        return {name: self.table(name).version() for name in S.TABLES}

    def checkpoints(self, name: str) -> dict[int, list[str]]:
        """Table ``name``'s Delta checkpoints: version -> the log's files of it (one, or the parts of one)."""
        out: dict[int, list[str]] = {}
        for f in sorted(self.list_files(f"{name}/_delta_log")):
            m = DELTA_CHECKPOINT.fullmatch(f)
            if m:
                out.setdefault(int(m.group(1)), []).append(f)
        return out

    def files(self, name: str, version: int | dt.datetime | None = None) -> list[str]:
        uris = self.table(name, version).file_uris()
        return [_local_path(u).as_posix() if u.startswith("file://") else u for u in uris]

    def append(self, name: str, data: pa.Table, retries: int = MAX_COMMIT_RETRIES) -> int:
        """Append rows in one commit; returns the new table version."""
        from deltalake import CommitProperties, write_deltalake

        self.check_writable()
        spec = S.TABLES[name]
        data = conform(data, spec)
        dtab = self._append_tables.get(name)
        try:
            if dtab is not None:
                dtab.update_incremental()
        except Exception:  # the table changed under us in a way an incremental update cannot follow
            dtab = None
        if dtab is None:
            dtab = self._append_tables[name] = self.table(name)
        if data.num_rows == 0:
            return dtab.version()
        write_deltalake(
            dtab,
            data,
            mode="append",
            partition_by=dtab.metadata().partition_columns or None,
            storage_options=self.storage_options,
            commit_properties=CommitProperties(max_commit_retries=retries),
            writer_properties=writer_properties(name),
        )
        return dtab.version()

    def upsert_runs(self, rows: list[Mapping[str, Any]]) -> None:
        """Insert or update ``runs`` rows by run_id (a resumed run keeps one row)."""
        from deltalake import CommitProperties

        if not rows:
            return
        self.check_writable()
        # Rows may name different columns; from_pylist alone would keep only the first row's.
        columns = list(dict.fromkeys(k for r in rows for k in r))
        data = conform(pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows]), S.RUNS)
        for attempt in range(20):
            try:
                (
                    self.table("runs")
                    .merge(
                        data,
                        predicate="t.run_id = s.run_id",
                        source_alias="s",
                        target_alias="t",
                        commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES),
                    )
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
                return
            except Exception as e:  # a concurrent merge on the same rows is a conflict, not a failure
                # delta-rs says either "conflict" or "a concurrent transactions added new data" (another
                # process's merge into runs, e.g. a rollout beside a training job): the upsert is rerun.
                message = str(e).lower()
                if ("conflict" not in message and "concurrent transaction" not in message) or attempt == 19:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def update_run(self, run_id: str, **fields: Any) -> None:
        current = self.query_arrow("select * from runs where run_id = $run_id", {"run_id": run_id}).to_pylist()
        if not current:
            raise LakeError(f"no run {run_id!r} in {self.root}")
        row = {**current[0], **fields}
        self.upsert_runs([row])

    # ------------------------------------------------------------------ reading
    def connect(self, as_of: Any = None, params: Any = None, views: bool | str = True, tables: tuple[str, ...] | None = None,
                runs: list[str] | None = None):
        """A DuckDB connection with every table (as of a snapshot) and every view registered; ``tables`` (with
        ``views=False``): only those tables; ``runs``: only those runs' rows (``halo_data.reader.connect``)."""
        from halo_data.reader import connect

        return connect(self, as_of=as_of, params=params, views=views, tables=tables, runs=runs)

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None, **connect_kw: Any) -> pa.Table:
        # Only the views the query names are created unless the caller says otherwise.
        connect_kw.setdefault("views", sql)
        con = self.connect(**connect_kw)
        try:
            from halo_data.reader import sql_arrow

            return sql_arrow(con, sql, dict(parameters or {}))
        finally:
            con.close()

    def episode_ids(self, run_id: str) -> set[str]:
        """Episode ids already committed for a run (what ``--resume`` skips)."""
        con = self.connect(views=False, tables=("steps",))
        try:
            rows = con.execute(
                "select distinct episode_id from steps where run_id = $r", {"r": run_id}
            ).fetchall()
        finally:
            con.close()
        return {r[0] for r in rows}

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"


def open_lake(root: str | None = None) -> Lake:
    return Lake.open(root)


def iter_tables() -> Iterable[S.TableSpec]:
    return S.TABLES.values()
