"""Lake maintenance and export: stats, compact, vacuum, validate, quarantine, export.

Each is a plain function the CLI calls; a user can do the same from Python.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from halo_data import schema as S
from halo_data.lake import (
    MAX_COMMIT_RETRIES,
    TABLE_PROPERTIES,
    Lake,
    LakeError,
    conform,
    writer_properties,
)
from halo_data.reader import sql_arrow

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- stats
def stats(lake: Lake) -> list[dict[str, Any]]:
    """Rows, files, bytes and version of every table, and the bytes of its Delta log (commits and checkpoints:
    ``vacuum`` deletes the checkpoints reads no longer start from)."""
    out = []
    for name in S.TABLES:
        dtab = lake.table(name)
        actions = pa.table(dtab.get_add_actions(flatten=True))
        rows = sum(v or 0 for v in actions.column("num_records").to_pylist()) if actions.num_rows else 0
        size = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
        out.append({"table": name, "rows": rows, "files": actions.num_rows, "bytes": size, "version": dtab.version(),
                    "log_bytes": sum(lake.list_files(f"{name}/_delta_log").values())})
    return out


def steps_per_run(lake: Lake, version: int | None = None) -> pa.Table:
    """run_id, steps and files of ``steps`` per run, from the snapshot's log where a file holds one run (its
    run_id partition, or equal min/max statistics); only files that hold several runs (compacted) are opened,
    and of them only the run_id column."""
    dtab = lake.table("steps", version)
    actions = pa.table(dtab.get_add_actions(flatten=True))
    names = set(actions.column_names)
    if "partition.run_id" in names:
        one_run = actions.column("partition.run_id").to_pylist()
    elif {"min.run_id", "max.run_id"} <= names:
        one_run = [lo if lo is not None and lo == hi else None
                   for lo, hi in zip(actions.column("min.run_id").to_pylist(), actions.column("max.run_id").to_pylist())]
    else:
        one_run = [None] * actions.num_rows
    counts: dict[str, list[int]] = {}
    shared: list[str] = []
    for run_id, rows, path in zip(one_run, actions.column("num_records").to_pylist(), actions.column("path").to_pylist()):
        if run_id is not None:
            entry = counts.setdefault(run_id, [0, 0])
            entry[0] += rows or 0
            entry[1] += 1
        elif rows:
            shared.append(path)
    if shared:
        wanted = {p.rsplit("/", 1)[-1] for p in shared}
        for fragment in dtab.to_pyarrow_dataset().get_fragments():
            if fragment.path.rsplit("/", 1)[-1] not in wanted:
                continue
            for v in fragment.to_table(columns=["run_id"]).column("run_id").value_counts().to_pylist():
                entry = counts.setdefault(v["values"], [0, 0])
                entry[0] += v["counts"]
                entry[1] += 1
    ordered = sorted(counts.items(), key=lambda kv: str(kv[0]))
    return pa.table({"run_id": pa.array([k for k, _ in ordered], pa.string()),
                     "steps": pa.array([v[0] for _, v in ordered], pa.int64()),
                     "files": pa.array([v[1] for _, v in ordered], pa.int64())})


# ---------------------------------------------------------------------- compact / vacuum
def _duplicate_screenshot_prefixes(lake: Lake) -> list[str]:
    con = lake.connect(views=False)
    try:
        rows = con.execute(
            "select hash_prefix from screenshots_all group by hash_prefix having count(*) > count(distinct hash)"
        ).fetchall()
    finally:
        con.close()
    return sorted(r[0] for r in rows)


# Compaction packs a partition's files into files of up to this size and never rewrites one already past it.
# Every run adds small files to the same partitions (steps, candidates and mcts_nodes by env, screenshots by hash).
# Under delta-rs's default target (100 MiB), steps' packed files stay where they are (the 5M growth run's 50-run
# compactions each rewrote only the new runs' files); screenshots' partitions were rewritten whole each time, a cost
# that grew with the lake. At 16 MiB a compaction rewrites at most 16 MiB per screenshot partition.
COMPACT_TARGET_SIZE = {"screenshots": 16 * 1024 * 1024}


def compact(lake: Lake, target_size: int | None = None) -> dict[str, Any]:
    """Drop screenshot copies, then merge small files of every table.

    Each step is one Delta commit, so a reader holding an older snapshot keeps
    reading it, and a compaction killed midway leaves a consistent table that the
    next ``compact`` finishes.
    """
    from deltalake import CommitProperties, write_deltalake

    lake.check_writable()
    report: dict[str, Any] = {"screenshot_copies_dropped": 0, "tables": {}}
    for prefix in _duplicate_screenshot_prefixes(lake):
        con = lake.connect(views=False)
        try:
            before = con.execute("select count(*) from screenshots_all where hash_prefix = $p", {"p": prefix}).fetchall()[0][0]
            dedup = sql_arrow(
                con,
                """select * from screenshots_all where hash_prefix = $p
                   qualify row_number() over (partition by hash order by created_at) = 1""",
                {"p": prefix},
            )
        finally:
            con.close()
        write_deltalake(
            lake.table_uri("screenshots"),
            conform(dedup, S.SCREENSHOTS),
            mode="overwrite",
            predicate=f"hash_prefix = '{prefix}'",
            partition_by=list(S.SCREENSHOTS.partition_by),
            storage_options=lake.storage_options,
            commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES),
        )
        report["screenshot_copies_dropped"] += before - dedup.num_rows
    for name in S.TABLES:
        dtab = lake.table(name)
        configuration = dtab.metadata().configuration
        if any(configuration.get(k) != v for k, v in TABLE_PROPERTIES.items()):  # a table of an older HALO
            dtab.alter.set_table_properties(dict(TABLE_PROPERTIES))
        kwargs: dict[str, Any] = {"commit_properties": CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES)}
        if target_size or name in COMPACT_TARGET_SIZE:
            kwargs["target_size"] = target_size or COMPACT_TARGET_SIZE[name]
        metrics = dtab.optimize.compact(writer_properties=writer_properties(name), **kwargs)
        report["tables"][name] = {
            "files_removed": metrics.get("numFilesRemoved", 0),
            "files_added": metrics.get("numFilesAdded", 0),
        }
    return report


def upgrade(lake: Lake) -> dict[str, Any]:
    """Rewrite an older lake in this HALO's format: each table whose partitioning is not the current one is
    rewritten in one commit (streamed, run by run as its files list them), then the info file records the format.

    Readers of older snapshots keep reading them (``--as-of``) until ``vacuum``; a rewrite killed midway left its
    table as it was (its files, in no snapshot, go at the next ``vacuum``), and the next ``upgrade`` goes on from
    there. An older HALO refuses the upgraded lake rather
    than misreading it."""
    import dataclasses as dc

    from halo_data.relayout import finish_rewrite, rewrite_table

    lake.check_writable()
    report: dict[str, Any] = {"format_version": lake.info.format_version, "tables": {}}
    for name, spec in S.TABLES.items():
        finish_rewrite(lake, name)
        dtab = lake.table(name)
        have = dtab.metadata().partition_columns
        if have == list(spec.partition_by):
            continue
        done = rewrite_table(lake, name, list(spec.partition_by))
        report["tables"][name] = {"partition_by": [have, list(spec.partition_by)], "files": done["files"],
                                  "rows": done["rows"], "version": lake.table(name).version()}
    if lake.info.format_version < S.FORMAT_VERSION:
        lake.info = dc.replace(lake.info, format_version=S.FORMAT_VERSION,
                               tables={**lake.info.tables, **type(lake.info).current().tables})
        lake._write_info()
    report["format_version"] = [report["format_version"], lake.info.format_version]
    return report


def superseded_checkpoints(lake: Lake, name: str, retention_hours: float) -> list[str]:
    """Table ``name``'s Delta checkpoints older than its newest one committed before the retention: a read of any
    version since then starts from that one or a later one. Each checkpoint lists every file of its version, so
    together they grow with the square of the commits; the commits stay, so every version stays readable."""
    checkpoints = lake.checkpoints(name)
    if len(checkpoints) < 2:
        return []
    cutoff_ms = (time.time() - retention_hours * 3600) * 1000
    committed = {c["version"]: c["timestamp"] for c in lake.table(name).history()}
    before = [v for v in checkpoints if committed.get(v, float("inf")) <= cutoff_ms]
    if not before:
        return []
    keep_from = max(before)
    return [f"_delta_log/{f}" for v in sorted(checkpoints) if v < keep_from for f in checkpoints[v]]


def vacuum(lake: Lake, retention_hours: int = 168, dry_run: bool = False) -> dict[str, list[str]]:
    """Delete files no snapshot newer than ``retention_hours`` needs, which ends time travel past that point, and
    the Delta checkpoints reads since then no longer start from (``superseded_checkpoints``). The files, per table
    (relative to it)."""
    if not dry_run:
        lake.check_writable()
    out = {}
    for name in S.TABLES:
        out[name] = lake.table(name).vacuum(
            retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False
        )
        checkpoints = superseded_checkpoints(lake, name, retention_hours)
        if not dry_run:
            for rel in checkpoints:
                lake.delete_meta(f"{name}/{rel}")
        out[name] += checkpoints
    return out


def repair(lake: Lake, dry_run: bool = False) -> dict[str, list[str]]:
    """Forget the data files a table's log names but storage no longer holds (Delta's FSCK): one commit per table
    that lost some, after which its rows in them are gone from every read. The files, per table that lost any."""
    if not dry_run:
        lake.check_writable()
    out = {}
    for name in S.TABLES:
        gone = lake.table(name).repair(dry_run=dry_run).get("files_removed") or []
        if gone:
            out[name] = list(gone)
    return out


# ---------------------------------------------------------------------- validate
@dataclasses.dataclass
class Problem:
    table: str
    message: str

    def __str__(self) -> str:
        return f"{self.table}: {self.message}"


def _check_file(name: str, path: str, expected_rows: int | None, spec: S.TableSpec) -> Iterator[Problem]:
    try:
        table = pq.read_table(path)
    except Exception as e:  # any failure to decode is what validate exists to find
        yield Problem(name, f"unreadable file {path}: {str(e).splitlines()[0]}")
        return
    if expected_rows is not None and table.num_rows != expected_rows:
        yield Problem(name, f"{path} has {table.num_rows} rows, the log says {expected_rows}")
    for field in table.schema:
        if field.name in spec.column_names:
            want = spec.column(field.name).type
            if _storage_kind(field.type) != _storage_kind(want):
                yield Problem(name, f"{path}: column {field.name} is {field.type}, expected {want}")


def _storage_kind(t: pa.DataType) -> str:
    """A type with its Arrow layout variants folded together: delta-rs's merge and optimize write
    string_view / large_string where appends write string, and readers treat them alike."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return "list<" + _storage_kind(t.value_type) + ">"
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}, tz={'utc' if t.tz else 'none'}]"
    return str(t)


def validate(lake: Lake, all_versions: bool = False) -> list[Problem]:
    """Every file of the snapshot readable and matching the schema; no duplicate episode steps."""
    problems: list[Problem] = []
    for name, spec in S.TABLES.items():
        try:
            dtab = lake.table(name)
        except LakeError as e:
            problems.append(Problem(name, str(e)))
            continue
        versions = range(0, dtab.version() + 1) if all_versions else [dtab.version()]
        seen: set[str] = set()
        for v in versions:
            snap = lake.table(name, v) if all_versions else dtab
            actions = pa.table(snap.get_add_actions(flatten=True)).to_pylist()
            root = lake.table_uri(name)
            for a in actions:
                path = a["path"] if a["path"].startswith(("/", "file:")) else f"{root}/{a['path']}"
                if path.startswith("file://"):
                    path = path[len("file://"):]
                if path in seen:
                    continue
                seen.add(path)
                if not lake.is_local:
                    continue
                if not Path(path).exists():
                    problems.append(Problem(name, f"missing file {path} (version {v})"))
                    continue
                problems.extend(_check_file(name, path, a.get("num_records"), spec))
    if any(p.table == "steps" for p in problems):
        return problems
    con = lake.connect(views=False)
    try:
        dup = con.execute(
            "select episode_id, step_idx, count(*) from steps group by all having count(*) > 1 limit 5"
        ).fetchall()
        for eid, idx, n in dup:
            problems.append(Problem("steps", f"episode {eid} step {idx} is stored {n} times"))
        mixed = con.execute(
            """select episode_id from steps group by episode_id
               having count(distinct run_id) > 1 or count(distinct task_id) > 1 limit 5"""
        ).fetchall()
        for (eid,) in mixed:
            problems.append(Problem("steps", f"episode {eid} has rows of different runs or tasks"))
        runs_dup = con.execute("select run_id from runs group by run_id having count(*) > 1").fetchall()
        for (rid,) in runs_dup:
            problems.append(Problem("runs", f"run {rid} has more than one row"))
    finally:
        con.close()
    return problems


# ---------------------------------------------------------------------- quarantine
def quarantine(lake: Lake, run_id: str) -> dict[str, Any]:
    """Delete every row of a run. Recoverable with ``--as-of`` (the versions returned) until vacuumed."""
    from deltalake import CommitProperties

    lake.check_writable()
    before = lake.versions()
    con = lake.connect(views=False)
    try:
        found = con.execute(
            """select (select count(*) from runs where run_id = $r) + (select count(*) from steps where run_id = $r)
                 + (select count(*) from train_metrics where run_id = $r)""",
            {"r": run_id},
        ).fetchall()[0][0]
    finally:
        con.close()
    if not found:
        raise LakeError(f"no run {run_id!r} in {lake.root}: `halo-data query \"select run_id from runs\"` lists them")
    deleted = {}
    for name, spec in S.TABLES.items():
        if "run_id" not in spec.column_names:
            continue
        metrics = lake.table(name).delete(
            predicate=f"run_id = '{run_id}'",
            commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES),
        )
        deleted[name] = metrics.get("num_deleted_rows", 0)
    return {"run_id": run_id, "deleted_rows": deleted, "restore_as_of": before}


UNSTARTED_EPISODES_SQL = """
    select run_id, episode_id from steps
    where episode_id in (select episode_id from steps where error_kind = 'env')
    group by run_id, episode_id
    having bool_and(model_output is null and action is null) and bool_or(error_kind = 'env')
    order by run_id, episode_id
"""


def drop_unstarted_episodes(lake: Lake) -> dict[str, list[str]]:
    """Delete the episodes whose environment failed before the policy acted (an env error, no model output and no
    action on any step), which older HALO versions wrote as failed attempts; returns their episode ids per run.
    They tested no policy, so ``--resume`` runs them as if never run. Recoverable with ``--as-of`` until vacuumed."""
    from deltalake import CommitProperties

    lake.check_writable()
    by_run: dict[str, list[str]] = {}
    for r in lake.query_arrow(UNSTARTED_EPISODES_SQL, views=False, tables=("steps",)).to_pylist():
        by_run.setdefault(r["run_id"], []).append(r["episode_id"])
    for run_id, episodes in by_run.items():
        listed = ", ".join("'" + e.replace("'", "''") + "'" for e in episodes)
        for name in ("steps", "candidates"):
            lake.table(name).delete(predicate=f"run_id = '{run_id}' AND episode_id IN ({listed})",
                                    commit_properties=CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES))
    return by_run


# ---------------------------------------------------------------------- export
TRL_COLUMNS = {
    "bc_rows": ("prompt", "completion"),
    "dpo_pairs": ("prompt", "chosen", "rejected"),
    "grpo_groups": ("prompt", "completion"),
}


def view_sql(view: str, where: str | None = None, limit: int | None = None) -> str:
    """The SQL that reads a view's rows, filtered by a SQL ``where``."""
    from halo_data.views import get_view

    get_view(view)
    sql = f'select * from "{view}"'
    if where:
        sql += f" where {where}"
    if limit:
        sql += f" limit {int(limit)}"
    return sql


def view_rows(lake: Lake, view: str, where: str | None = None, params: Any = None, as_of: Any = None, limit: int | None = None) -> pa.Table:
    """Rows of a view, filtered by a SQL ``where`` (read-only checked)."""
    from halo_data.query import run_query

    return run_query(lake, view_sql(view, where, limit), as_of=as_of, params=params)


def to_trl_records(view: str, table: pa.Table) -> Iterator[dict[str, Any]]:
    """Rows in TRL's conversational column names: prompt (messages) and completion / chosen / rejected (assistant turns)."""
    cols = TRL_COLUMNS.get(view)
    for row in table.to_pylist():
        if not cols:
            yield row
            continue
        rec: dict[str, Any] = {"prompt": json.loads(row["prompt"])}
        for c in cols[1:]:
            rec[c] = [{"role": "assistant", "content": row[c]}]
        for k, v in row.items():
            if k not in rec and k != "prompt":
                rec[k] = v
        yield rec


def export(lake: Lake, view: str, output: str | Path, fmt: str | None = None, where: str | None = None, params: Any = None, as_of: Any = None) -> int:
    """Write a view to JSONL (TRL column names) or Parquet, a batch of rows at a time; returns the row count. The
    file appears whole or not at all."""
    from halo_data.query import query_batches, write_query_parquet, written_whole

    output = Path(output)
    fmt = fmt or ("parquet" if output.suffix == ".parquet" else "jsonl")
    if fmt not in ("parquet", "jsonl"):
        raise LakeError(f"unknown export format {fmt!r}: use jsonl or parquet")
    sql = view_sql(view, where)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        return write_query_parquet(lake, output, sql, as_of=as_of, params=params)
    rows = 0
    with written_whole(output) as partial, query_batches(lake, sql, as_of=as_of, params=params) as reader, \
            open(partial, "w") as f:
        for batch in reader:
            for rec in to_trl_records(view, pa.Table.from_batches([batch])):
                f.write(json.dumps(rec, default=str, ensure_ascii=False) + "\n")
            rows += batch.num_rows
    return rows
