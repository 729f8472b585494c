"""MkDocs hook: the lake's column reference, generated from the code when the site is built.

A page line ``<!-- columns: TABLE -->`` becomes the table's columns (name, Arrow type, what it holds),
read from ``halo_data.schema``, the one place they are documented in code; ``<!-- view-columns: VIEW -->``
becomes the view's columns and DuckDB types, read from the view itself on an empty lake. So the pages
cannot drift from the schema or the SQL.
"""

from __future__ import annotations

import functools
import re
import tempfile

COLUMNS = re.compile(r"^<!-- columns: (\w+) -->$", re.M)
VIEW_COLUMNS = re.compile(r"^<!-- view-columns: (\w+) -->$", re.M)


def columns_table(name: str) -> str:
    from halo_data.schema import TABLES

    if name not in TABLES:
        raise ValueError(f"<!-- columns: {name} -->: no such table; one of {', '.join(TABLES)}")
    spec = TABLES[name]
    lines = [spec.doc, "", "| column | type | what it holds |", "| --- | --- | --- |"]
    lines += [f"| `{c.name}` | `{c.type}` | {c.doc.replace('|', '&#124;')} |" for c in spec.columns]
    return "\n".join(lines)


_folders: list[tempfile.TemporaryDirectory] = []


@functools.cache
def _empty_lake():
    from halo_data.lake import Lake

    _folders.append(tempfile.TemporaryDirectory(prefix="halo-docs-lake-"))
    return Lake.init(_folders[-1].name + "/lake")


def view_columns(name: str) -> str:
    rows = _empty_lake().query_arrow(f"describe select * from {name}").to_pylist()
    return "Columns: " + ", ".join(f"`{r['column_name']}` {r['column_type']}" for r in rows) + "."


def on_page_markdown(markdown: str, **_) -> str:
    markdown = COLUMNS.sub(lambda m: columns_table(m.group(1)), markdown)
    return VIEW_COLUMNS.sub(lambda m: view_columns(m.group(1)), markdown)


def on_post_build(**_) -> None:
    _empty_lake.cache_clear()
    while _folders:
        _folders.pop().cleanup()
