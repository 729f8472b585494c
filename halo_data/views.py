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

SQL_DIR = Path(__file__).parent / "sql"
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
    from halo_data.lake import LakeError

    raise LakeError(f"unknown view {name!r}: `halo-data views` lists them ({', '.join(view_names())})")


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    for v in all_views():
        con.execute(f'CREATE OR REPLACE VIEW "{v.name}" AS\n{v.sql}')
