"""The SQL views: one ``sql/NN_name.sql`` file per view, each starting with a header
comment ``-- name: what one row is``. Files are created in their numeric order, so a
view may use any view with a lower number.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import duckdb

from halo_data.errors import LakeError

SQL_DIR = Path(__file__).parent / "sql"
# Macros the views use (order-independent aggregates), created before them.
MACROS = SQL_DIR / "macros.sql"
_FILE = re.compile(r"^(\d+)_([a-z_]+)\.sql$")


@dataclasses.dataclass(frozen=True)
class View:
    name: str
    description: str
    sql: str
    path: Path


@functools.lru_cache(maxsize=1)
def all_views() -> tuple[View, ...]:
    out = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        m = _FILE.match(path.name)
        if not m:
            continue
        name = m.group(2)
        text = path.read_text()
        header = []
        for line in text.splitlines():
            if not line.startswith("--"):
                break
            header.append(line[2:].strip())
        head = " ".join(header)
        if not head.startswith(f"{name}:"):
            raise RuntimeError(f"{path} must start with a header comment '-- {name}: what one row is'")
        out.append(View(name=name, description=head[len(name) + 1 :].strip(), sql=text, path=path))
    return tuple(out)


def view_names() -> list[str]:
    return [v.name for v in all_views()]


def get_view(name: str) -> View:
    for v in all_views():
        if v.name == name:
            return v
    raise LakeError(f"unknown view {name!r}: `halo-data views` lists them ({', '.join(view_names())})")


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Queries about the catalog itself see every view.
# A query of the catalog (SHOW, information_schema, DuckDB's duckdb_*() functions): it sees every table and view.
_CATALOG = re.compile(r"\b(show|information_schema|duckdb_views|duckdb_tables|pragma_table_info)\b|\bduckdb_\w+\s*\(",
                      re.IGNORECASE)


def _mentioned(sql: str) -> set[str]:
    names = set(view_names())
    return {w.lower() for w in _WORD.findall(sql)} & names


def views_needed(sql: str) -> list[str]:
    """The views ``sql`` mentions and the views those build on, in creation order."""
    by_name = {v.name: v for v in all_views()}
    needed: set[str] = set()
    todo = list(_mentioned(sql))
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo.extend(_mentioned(by_name[name].sql) - needed)
    return [v.name for v in all_views() if v.name in needed]


def create_views(con: duckdb.DuckDBPyConnection, only_for: str | None = None) -> None:
    """Create every view, or with ``only_for`` (a query) just the views it needs.

    Creating a view binds it, which reads the footers of the files under it; a query that
    needs no view (``select count(*) from steps``) should not pay for ten.
    """
    catalog_query = only_for is not None and _CATALOG.search(only_for)
    wanted = None if only_for is None or catalog_query else set(views_needed(only_for))
    if wanted is None or wanted:
        con.execute(MACROS.read_text())
    for v in all_views():
        if wanted is None or v.name in wanted:
            con.execute(f'CREATE OR REPLACE VIEW "{v.name}" AS\n{v.sql}')
