"""Rendering query results: a table on a terminal, JSON otherwise (as sqlite-utils does)."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
from typing import Any, TextIO

import pyarrow as pa

MAX_CELL = 80


def _number(v: decimal.Decimal) -> int | float:
    # DuckDB hands HUGEINT (what sum() of integers returns) to Arrow as a decimal of scale 0:
    # an integer, and printed as one; a decimal with a fractional part stays a float.
    return int(v) if v.is_finite() and v.as_tuple().exponent >= 0 else float(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$base64": True, "encoded": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return _number(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(v))} bytes>"
    if isinstance(v, decimal.Decimal):
        v = _number(v)
    if isinstance(v, float):
        text = f"{v:.6g}"
    elif isinstance(v, (dict, list)):
        text = json.dumps(_jsonable(v), ensure_ascii=False)
    else:
        text = str(v)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def write_table(table: pa.Table, out: TextIO) -> None:
    names = table.column_names
    rows = [[_cell(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def write_json(table: pa.Table, out: TextIO) -> None:
    rows = table.to_pylist()
    if not rows:
        out.write("[]\n")
        return
    out.write("[")
    for i, r in enumerate(rows):
        out.write(("\n " if i == 0 else ",\n ") + json.dumps(_jsonable(r), ensure_ascii=False))
    out.write("\n]\n")


def write_nl(table: pa.Table, out: TextIO) -> None:
    for r in table.to_pylist():
        out.write(json.dumps(_jsonable(r), ensure_ascii=False) + "\n")


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, (dict, list, bytes)):
        return json.dumps(_jsonable(v))
    if isinstance(v, decimal.Decimal):
        return _number(v)
    return v


def write_csv(table: pa.Table, out: TextIO) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.column_names)
    for r in table.to_pylist():
        w.writerow([_csv_cell(v) for v in r.values()])
    out.write(buf.getvalue())
