"""Materialise the training views from the lake: bc_rows, dpo_pairs and grpo_groups to Parquet.

Run as its own process so the benchmark can read its peak memory:

    python -m bench.lake_build LAKE OUT_DIR [--memory-limit 1GB]   # prints timings as JSON
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

VIEWS = ("bc_rows", "dpo_pairs", "grpo_groups")


def materialise(lake_root: str, out_dir: str, memory_limit: str | None = "1GB") -> dict:
    t0 = time.perf_counter()
    from halo_data.lake import Lake

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lake = Lake.open(lake_root)
    con = lake.connect()
    if memory_limit:
        # DuckDB spills to disk beyond this; it keeps the build inside a small machine's memory.
        con.execute(f"SET memory_limit = '{memory_limit}'")
    # the rows' order is not part of a data set; not keeping it lets DuckDB stream the output
    con.execute("SET preserve_insertion_order = false")
    t_open = time.perf_counter()
    rows = {}
    per_view = {}
    for view in VIEWS:
        t = time.perf_counter()
        path = (out / f"{view}.parquet").as_posix().replace("'", "''")
        # Prompts stay in the lake by reference (prompt_hash, or episode_id + step_idx into steps):
        # writing every prompt inline again would copy the largest column of the lake once per row.
        rows[view] = con.execute(
            f"COPY (SELECT * EXCLUDE (prompt) FROM {view}) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 65536)"
        ).fetchone()[0]
        per_view[view] = time.perf_counter() - t
    con.close()
    return {"seconds": time.perf_counter() - t0, "open_seconds": t_open - t0, "view_seconds": per_view, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lake")
    ap.add_argument("out_dir")
    ap.add_argument("--memory-limit", default="1GB")
    a = ap.parse_args()
    print(json.dumps(materialise(a.lake, a.out_dir, a.memory_limit or None)))


if __name__ == "__main__":
    main()
