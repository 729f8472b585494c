"""Read-only SQL over a lake: what ``halo-data query`` and the dashboard's SQL box run."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import duckdb
import pyarrow as pa

from halo_data.lake import Lake, LakeError

ALLOWED_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class QueryError(LakeError):
    pass


def check_read_only(sql: str) -> list[str]:
    """Split ``sql`` into statements and refuse any that is not a read (SELECT, DESCRIBE, SHOW, EXPLAIN)."""
    # A connection of our own: the module-level function would create DuckDB's process-wide
    # default connection, which outlives the module at interpreter exit.
    con = duckdb.connect(":memory:")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(_one_line(e)) from None
    finally:
        con.close()
    if not statements:
        raise QueryError("no SQL statement given")
    for s in statements:
        if s.type not in ALLOWED_STATEMENTS:
            kind = s.type.name.lower()
            if kind == "load":  # DuckDB calls INSTALL a LOAD statement: name it as the user wrote it
                kind = s.query.split()[0].lower()
            raise QueryError(
                f"{kind} statements are not allowed: halo-data query is read-only (use SELECT; "
                "the lake changes only through halo-data's commands)"
            )
    return [s.query for s in statements]


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    # DuckDB errors are "Kind Error: message" followed by LINE/context lines.
    first = text.splitlines()[0] if text else type(e).__name__
    return first


@contextlib.contextmanager
def _statement(lake: Lake, sql: str, as_of: Any, params: Any) -> Iterator[tuple[duckdb.DuckDBPyConnection, str]]:
    """A connection for read-only ``sql`` with every statement but the last run, and that last one. DuckDB's errors
    in the block, a stream's midway included (Arrow's reader raises them as OSError), are one-line QueryErrors."""
    statements = check_read_only(sql)
    con = lake.connect(as_of=as_of, params=params, views=sql)
    try:
        for stmt in statements[:-1]:
            con.execute(stmt).fetchall()
        yield con, statements[-1]
    except (duckdb.Error, OSError) as e:
        raise QueryError(_one_line(e)) from None
    finally:
        con.close()


def run_query(
    lake: Lake,
    sql: str,
    parameters: Mapping[str, Any] | None = None,
    as_of: Any = None,
    params: Any = None,
) -> pa.Table:
    """Run read-only SQL against the lake's tables and views; returns the last statement's rows."""
    from halo_data.reader import sql_arrow

    with _statement(lake, sql, as_of, params) as (con, last):
        return sql_arrow(con, last, dict(parameters or {}))


@contextlib.contextmanager
def query_batches(
    lake: Lake,
    sql: str,
    parameters: Mapping[str, Any] | None = None,
    as_of: Any = None,
    params: Any = None,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatchReader]:
    """Run read-only SQL; the last statement's rows as a reader of Arrow batches of up to ``batch_rows``, to read
    inside the block: memory holds a batch, not the result."""
    with _statement(lake, sql, as_of, params) as (con, last):
        rel = con.sql(last, params=dict(parameters or {}) or None)
        yield rel.to_arrow_reader(batch_rows) if rel is not None else pa.table({}).to_reader()


def query_columns(lake: Lake, sql: str, as_of: Any = None, params: Any = None) -> list[str]:
    """The column names of read-only SQL's last statement, without reading its rows."""
    with _statement(lake, sql, as_of, params) as (con, last):
        rel = con.sql(last)
        return list(rel.columns) if rel is not None else []


def write_query_parquet(
    lake: Lake,
    path: str | os.PathLike[str],
    sql: str,
    parameters: Mapping[str, Any] | None = None,
    as_of: Any = None,
    params: Any = None,
    batch_rows: int = 65536,
) -> int:
    """Run read-only SQL and stream the last statement's rows into the Parquet file ``path``, a batch at a time;
    returns the rows written. The file appears whole or not at all: a query that fails midway leaves what was at
    ``path`` as it was."""
    import pyarrow.parquet as pq

    rows = 0
    with written_whole(path) as partial, query_batches(lake, sql, parameters, as_of, params, batch_rows) as reader:
        with pq.ParquetWriter(partial, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    return rows


@contextlib.contextmanager
def written_whole(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A sibling of ``path`` to write its new content to: it replaces ``path`` when the block ends, and is removed
    when the block fails, leaving what was at ``path`` as it was."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
