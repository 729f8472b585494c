"""DuckDB over the lake: every table as a view of its snapshot's file list, then the SQL views.

Tables are projected onto the schema in ``halo_data.schema``: a column this HALO
knows but the files lack (a lake written by an older HALO) reads as NULL.
"""

from __future__ import annotations

import datetime as dt
import logging
import weakref
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from halo_data import schema as S
from halo_data.config import ViewParams, parse_as_of
from halo_data.errors import LakeError
from halo_data.schema import duckdb_type

if TYPE_CHECKING:
    from halo_data.lake import Lake

log = logging.getLogger(__name__)

# Arrow datasets an object-store lake's tables are read through, by connection: DuckDB keeps a
# registered Python object per connection, so each cursor must register them again (``cursor``).
_ARROW_SOURCES: "weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, dict[str, Any]]" = weakref.WeakKeyDictionary()

# The raw screenshots table; `screenshots` is a view over it that hides copies.
RAW_TABLE_NAMES = {"screenshots": "screenshots_all"}


def _sql_list(items: list[str]) -> str:
    return "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in items) + "]"


# Columns an older lake lacks that can be computed from one it has: (source column, SQL).
DERIVED = {"prompt_hash": ("prompt", "sha256(prompt)")}


def _projection(spec: S.TableSpec, have: set[str], extra: list[str]) -> str:
    parts = []
    for c in spec.columns:
        if c.name in have:
            parts.append(f'"{c.name}"')
        elif c.name in DERIVED and DERIVED[c.name][0] in have:
            # a lake from before this column: derive it the way the writer does
            parts.append(f'{DERIVED[c.name][1]} AS "{c.name}"')
        else:
            parts.append(f'CAST(NULL AS {duckdb_type(c.type)}) AS "{c.name}"')
    parts += [f'"{n}"' for n in extra]
    return ", ".join(parts)


_SAME_COLUMNS: dict[tuple[str, str, tuple[str, ...]], bool] = {}


def _same_columns_in_every_file(lake: Lake, name: str, dtab: Any, table_schema: pa.Schema) -> bool:
    """True when the table's columns are those it was created with: HALO writes every column into every file, so
    only columns added later (an older lake's schema evolved) can be missing from some files."""
    key = (lake.table_uri(name), dtab.metadata().id, tuple(table_schema.names))
    if key not in _SAME_COLUMNS:
        try:
            first = pa.schema(lake.table(name, 0).schema().to_arrow())
        except LakeError:  # version 0's log entry cleaned up: nothing to say when columns were added
            return False
        _SAME_COLUMNS[key] = first.names == table_schema.names
    return _SAME_COLUMNS[key]


def register_table(con: duckdb.DuckDBPyConnection, lake: "Lake", name: str, version: Any = None,
                   runs: list[str] | None = None) -> None:
    """Table ``name`` as a view of its snapshot; with ``runs``, of those runs' rows only: files whose run_id
    partition (a version 1 lake) or min/max statistics cannot hold them are never listed, and the rows of files that
    hold other runs too (compacted ones) are filtered, row groups skipped by the same statistics."""
    spec = S.TABLES[name]
    view_name = RAW_TABLE_NAMES.get(name, name)
    dtab = lake.table(name, version)
    table_schema = pa.schema(dtab.schema().to_arrow())
    partitions = dtab.metadata().partition_columns  # the snapshot's own layout, whichever format wrote it
    scoped = runs is not None and "run_id" in spec.column_names
    pruning = [("run_id", "in", list(runs))] if scoped else None
    row_filter = ""
    if scoped and "run_id" not in partitions:
        row_filter = " WHERE run_id IN (" + ", ".join("'" + r.replace("'", "''") + "'" for r in runs) + ")" if runs else " WHERE false"
    if lake.is_local:
        files = [u[len("file://"):] if u.startswith("file://") else u for u in dtab.file_uris(file_pruning_predicate=pruning)]
        if files:
            hive_types = ", ".join(f"'{p}': 'VARCHAR'" for p in partitions)
            hive = f", hive_partitioning=true, hive_types={{{hive_types}}}" if partitions else ", hive_partitioning=false"
            # union_by_name reads every file's schema each time a query or view binds the table (O(files) per
            # bind); files that all hold the same columns are matched by name from the first file's schema.
            union = "false" if _same_columns_in_every_file(lake, name, dtab, table_schema) else "true"
            source = f"read_parquet({_sql_list(files)}, union_by_name={union}{hive})"
            # After schema evolution the table's schema lists columns that older files lack, and
            # read_parquet only knows the columns its files hold: project what the files really have.
            have = {d[0] for d in con.execute(f"SELECT * FROM {source} LIMIT 0").description}
        else:
            source = None
            have = set()
    else:
        # Object stores: DuckDB reads through delta-rs's Arrow dataset (no extension download needed).
        source = f"__arrow_{name}"
        _ARROW_SOURCES.setdefault(con, {})[source] = dtab.to_pyarrow_dataset(file_pruning_predicate=pruning)
        con.register(source, _ARROW_SOURCES[con][source])
        have = set(table_schema.names)
    extra = [n for n in table_schema.names if n not in spec.column_names and (source is None or n in have)]
    if source is None:
        cols = [f'CAST(NULL AS {duckdb_type(c.type)}) AS "{c.name}"' for c in spec.columns]
        cols += [f'CAST(NULL AS {duckdb_type(table_schema.field(n).type)}) AS "{n}"' for n in extra]
        con.execute(f'CREATE OR REPLACE VIEW "{view_name}" AS SELECT {", ".join(cols)} WHERE false')
    else:
        con.execute(f'CREATE OR REPLACE VIEW "{view_name}" AS SELECT {_projection(spec, have, extra)} FROM {source}{row_filter}')


def set_params(con: duckdb.DuckDBPyConnection, params: ViewParams) -> None:
    for k, v in params.variables().items():
        if isinstance(v, str):
            con.execute(f"SET VARIABLE {k} = '{v}'")
        else:
            con.execute(f"SET VARIABLE {k} = {float(v)!r}::DOUBLE")


def connect(lake: "Lake", as_of: Any = None, params: ViewParams | dict | None = None, views: bool | str = True,
            tables: tuple[str, ...] | None = None, runs: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """``views``: True for every view, False for none, or a query whose views (and theirs) to create.
    ``tables`` (with ``views=False``): register only these tables, for a read that needs no others.
    ``runs``: the lake as if it held only these runs: every table with a run_id column (and so every view) sees
    their rows alone, read from their files alone; pairs, rankings and groups form within them."""
    if tables is not None and views is not False:
        raise ValueError("connect(tables=...) registers some tables only: views need them all, pass views=False")
    unknown = set(tables or ()) - set(S.TABLES)
    if unknown:
        raise ValueError(f"no such table: {', '.join(sorted(unknown))}")
    from halo_data.views import create_views

    if params is None:
        params = ViewParams()
    elif isinstance(params, dict):
        params = ViewParams().override(**params)
    as_of_parsed = parse_as_of(as_of) if not isinstance(as_of, (dict, dt.datetime)) else as_of
    if tables is None and isinstance(views, str):
        # a query opens the tables it (and its views) name, not every table of the lake
        tables = tables_needed(views)
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    # A Delta table's data files never change once written: read each footer once per connection,
    # not again for every view bound and every query over the same files.
    con.execute("SET parquet_metadata_cache = true")
    for name in S.TABLES if tables is None else tables:
        if isinstance(as_of_parsed, dt.datetime):
            version: Any = as_of_parsed
        elif isinstance(as_of_parsed, dict):
            version = as_of_parsed.get(name)
        else:
            version = None
        register_table(con, lake, name, version, runs)
    set_params(con, params)
    if isinstance(views, str):
        create_views(con, only_for=views)
    elif views:
        create_views(con)
    return con


def tables_needed(sql: str) -> tuple[str, ...] | None:
    """The tables ``sql`` and the views it needs read (a word-level over-estimate); None (all) for a catalog query."""
    import re

    from halo_data.views import _CATALOG, all_views, views_needed

    if _CATALOG.search(sql):  # the catalog: every table
        return None
    needed = set(views_needed(sql))
    text = "\n".join([sql, *(v.sql for v in all_views() if v.name in needed)])
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)}
    return tuple(n for n in S.TABLES if n in words or RAW_TABLE_NAMES.get(n) in words)


def runs_named(where: str | None) -> list[str] | None:
    """The run ids a row filter pins its rows to: ``run_id = 'X'`` or ``run_id IN ('X', ...)``, as the whole filter
    or as terms of its top-level AND (several terms: the runs all of them allow). None where the filter pins no run
    (none named, or only under OR / NOT, which do not pin)."""
    import json

    if not where or "run_id" not in where.lower():
        return None
    try:
        tree = json.loads(duckdb.sql("SELECT json_serialize_sql($q)", params={"q": f"SELECT 1 WHERE {where}"}).fetchall()[0][0])
        node = tree["statements"][0]["node"]["where_clause"]
    except (duckdb.Error, KeyError, IndexError, ValueError):
        return None
    terms = node["children"] if node.get("type") == "CONJUNCTION_AND" else [node]
    pinned: set[str] | None = None
    for term in terms:
        named = _run_ids_of(term)
        if named is not None:
            pinned = named if pinned is None else pinned & named
    return sorted(pinned) if pinned is not None else None


def _run_ids_of(term: dict) -> set[str] | None:
    """{'X'} for ``run_id = 'X'``, {'X', 'Y'} for ``run_id IN ('X', 'Y')``; None for any other term."""
    if term.get("type") == "COMPARE_EQUAL":
        operands = [term.get("left"), term.get("right")]
    elif term.get("type") == "COMPARE_IN":
        operands = term.get("children") or []
        if not operands or not _is_run_id(operands[0]):
            return None
        operands = operands[1:]
        values = [_string(o) for o in operands]
        return None if any(v is None for v in values) else set(values)
    else:
        return None
    column = [o for o in operands if o and _is_run_id(o)]
    values = [_string(o) for o in operands if o and not _is_run_id(o)]
    if len(column) != 1 or len(values) != 1 or values[0] is None:
        return None
    return {values[0]}


def _is_run_id(node: dict) -> bool:
    return node.get("class") == "COLUMN_REF" and [n.lower() for n in node.get("column_names") or []][-1:] == ["run_id"]


def _string(node: dict) -> str | None:
    if node.get("class") != "CONSTANT":
        return None
    literal = node.get("literal") or {}
    if literal.get("kind") == "STRING":
        return literal.get("text")
    value = node.get("value") or {}  # the older serialisation
    return value.get("value") if isinstance(value.get("value"), str) else None


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of ``con`` (one per thread) that reads the same tables, an object-store lake's included."""
    cur = con.cursor()
    for source, dataset in _ARROW_SOURCES.get(con, {}).items():
        cur.register(source, dataset)
    return cur


def sql_arrow(con: duckdb.DuckDBPyConnection, sql: str, parameters: dict | None = None) -> pa.Table:
    """Run one statement and fetch its whole result as Arrow."""
    rel = con.sql(sql, params=parameters or None)
    if rel is None:
        return pa.table({})
    fetch = getattr(rel, "to_arrow_table", None) or getattr(rel, "arrow")
    return fetch()
