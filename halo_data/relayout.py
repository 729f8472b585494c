"""Rewrite a Delta table in another partitioning, streamed: what ``halo-data upgrade`` runs.

delta-rs's ``write_deltalake`` holds what it is given until the write ends (its memory grew with the table: 24 GB
for the 5M-step lake's ``steps`` before the kernel ended it), so the rewrite writes the Parquet files itself, one
row group at a time per partition, and commits them with their statistics. A rewrite stopped before its commits
leaves the table as it was (the files it wrote belong to no snapshot, and ``vacuum`` removes them); one stopped
between them is finished by the next ``halo-data upgrade``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import urllib.parse
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from halo_data.lake import LONG_TEXT_COLUMNS, MAX_COMMIT_RETRIES, RUN_ROW_GROUP_ROWS, Lake, LakeError, unindexed_columns

# A file is closed once this many bytes are written, as delta-rs's compaction target.
TARGET_FILE_BYTES = 100 * 1024 * 1024


def _filesystem(lake: Lake, uri: str) -> tuple[pafs.FileSystem, str]:
    if lake.is_local:
        return pafs.LocalFileSystem(), uri.removeprefix("file://")
    return pafs.FileSystem.from_uri(uri)


class _RollingWriter:
    """Parquet files of one partition under the table, each closed past ``TARGET_FILE_BYTES``."""

    def __init__(self, fs: pafs.FileSystem, table_path: str, name: str, partition: dict[str, str], schema: pa.Schema):
        self.fs, self.table_path, self.partition, self.schema = fs, table_path, partition, schema
        plain = set(LONG_TEXT_COLUMNS.get(name, ()))
        unindexed = unindexed_columns(name)
        self.options = {"compression": "zstd", "compression_level": 3, "data_page_version": "2.0",
                        "use_dictionary": [c for c in schema.names if c not in plain],
                        "write_statistics": [c for c in schema.names if c not in unindexed]}
        self.written: list[tuple[str, dict[str, str]]] = []
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._path = ""

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            folder = "/".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in self.partition.items())
            self._path = f"{folder}/part-00000-{uuid.uuid4()}-c000.zstd.parquet" if folder else \
                f"part-00000-{uuid.uuid4()}-c000.zstd.parquet"
            if folder:
                self.fs.create_dir(f"{self.table_path}/{folder}", recursive=True)
            self._sink = self.fs.open_output_stream(f"{self.table_path}/{self._path}")
            self._writer = pq.ParquetWriter(self._sink, self.schema, **self.options)
        self._writer.write_batch(batch, row_group_size=RUN_ROW_GROUP_ROWS)
        if self._sink.tell() >= TARGET_FILE_BYTES:
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self.written.append((self._path, self.partition))
            self._writer = None


def _stat(value: Any) -> Any:
    """A statistic as the Delta log stores it; None where it is not stored (timestamps: Delta keeps milliseconds,
    a rounded bound could exclude a row)."""
    if isinstance(value, (bool, bytes, dt.datetime, dt.date)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def file_stats(metadata: pq.FileMetaData, data_columns: list[str]) -> dict[str, Any]:
    """numRecords, and min, max and null count of every top-level column the file has statistics for."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    unknown: set[str] = set()
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema
            if name not in data_columns or name in unknown:
                continue
            st = chunk.statistics
            if st is None or not st.has_null_count:
                unknown.add(name)
                for known in (mins, maxs, nulls):
                    known.pop(name, None)
                continue
            nulls[name] = nulls.get(name, 0) + st.null_count
            if st.has_min_max:
                lo, hi = _stat(st.min), _stat(st.max)
                if lo is not None and hi is not None:
                    mins[name] = lo if name not in mins else min(mins[name], lo)
                    maxs[name] = hi if name not in maxs else max(maxs[name], hi)
    return {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _to_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in the table's schema: in its order and types, NULL where a file predates a column."""
    cols = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            cols.append(col if col.type == field.type else col.cast(field.type))
        else:
            cols.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(cols, schema=schema)


def rewrite_table(lake: Lake, name: str, partition_by: list[str]) -> dict[str, Any]:
    """Rewrite table ``name`` partitioned by ``partition_by``: its current snapshot's rows, file by file in the
    order of their runs, committed after an empty overwrite that records the new partitioning."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.transaction import AddAction

    dtab = lake.table(name)
    source_version = dtab.version()
    schema = pa.schema(dtab.schema().to_arrow())  # every column the table has, HALO's and any added to it
    fs, table_path = _filesystem(lake, dtab.table_uri.rstrip("/"))
    actions = pa.table(dtab.get_add_actions(flatten=True)).to_pylist()
    # a run's rows stay together: files in the order of their run (partition value, else the smallest run id)
    actions.sort(key=lambda a: (str(a.get("partition.run_id") or a.get("min.run_id") or ""), a["path"]))
    old_partitions = dtab.metadata().partition_columns
    writers: dict[tuple[str, ...], _RollingWriter] = {}
    rows = 0
    for action in actions:
        path = urllib.parse.unquote(action["path"])  # the log holds paths relative to the table, URI-encoded
        constants = {k: action.get(f"partition.{k}") for k in old_partitions}
        with fs.open_input_file(f"{table_path}/{path}") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=RUN_ROW_GROUP_ROWS):
                table = pa.Table.from_batches([batch])
                for k, v in constants.items():
                    if k not in table.column_names:
                        table = table.append_column(k, pa.array([v] * table.num_rows, pa.string()))
                table = _to_schema(table, schema)
                rows += table.num_rows
                keys = list(zip(*(table.column(k).to_pylist() for k in partition_by))) if partition_by else [()] * table.num_rows
                distinct = list(dict.fromkeys(keys))
                for key in distinct:
                    part = table if len(distinct) == 1 else table.filter(pa.array([k == key for k in keys]))
                    writer = writers.get(key)
                    if writer is None:
                        writer = writers[key] = _RollingWriter(fs, table_path, name, dict(zip(partition_by, key)), schema)
                    for b in part.to_batches(max_chunksize=RUN_ROW_GROUP_ROWS):
                        writer.write(b)
    adds = []
    data_columns = [c for c in schema.names if c not in partition_by]
    now = int(time.time() * 1000)
    for writer in writers.values():
        writer.close()
        for rel, partition in writer.written:
            info = fs.get_file_info(f"{table_path}/{rel}")
            with fs.open_input_file(f"{table_path}/{rel}") as f:
                metadata = pq.ParquetFile(f).metadata
            adds.append(AddAction(path=urllib.parse.quote(rel, safe="/="), size=info.size, partition_values=partition,
                                  modification_time=now, data_change=True,
                                  stats=json.dumps(file_stats(metadata, data_columns))))
    current = lake.table(name)
    if current.version() != source_version:
        raise LakeError(f"{name} changed while it was rewritten (version {source_version} -> {current.version()}): "
                        "run `halo-data upgrade` again when no writer is running")
    # delta-rs changes a table's partitioning only in a write of its own (which holds its data in memory): an empty
    # overwrite that records the new partitioning, then the files written here. What to commit is recorded first,
    # so an upgrade stopped between the two commits is finished by the next one (``finish_rewrite``).
    lake.write_meta(_pending_path(name), json.dumps({"source_version": source_version, "partition_by": partition_by,
                                                     "adds": [a.__dict__ for a in adds]}))
    write_deltalake(current, schema.empty_table(), mode="overwrite", schema_mode="overwrite",
                    partition_by=partition_by or None, storage_options=lake.storage_options,
                    commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES))
    finish_rewrite(lake, name)
    return {"rows": rows, "files": [len(actions), len(adds)]}


def _pending_path(name: str) -> str:
    return f"meta/upgrade-{name}.json"


def finish_rewrite(lake: Lake, name: str) -> bool:
    """Commit the files of a rewrite of ``name`` whose partitioning was committed but not yet its data (an
    upgrade stopped between its two commits); True where there was one."""
    from deltalake import CommitProperties
    from deltalake.transaction import AddAction

    text = lake.read_meta(_pending_path(name))
    if text is None:
        return False
    pending = json.loads(text)
    dtab = lake.table(name)
    if dtab.metadata().partition_columns != pending["partition_by"]:
        # stopped before the partitioning was committed: the table is as it was; the files go at the next vacuum
        lake.delete_meta(_pending_path(name))
        return False
    committed = {p.rsplit("/", 1)[-1] for p in dtab.file_uris()}
    adds = [AddAction(**a) for a in pending["adds"] if a["path"].rsplit("/", 1)[-1] not in committed]
    if adds:
        dtab.create_write_transaction(adds, mode="append", schema=pa.schema(dtab.schema().to_arrow()),
                                      partition_by=pending["partition_by"] or None,
                                      commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES))
    lake.delete_meta(_pending_path(name))
    return True
