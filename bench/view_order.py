"""What a training read's one row order costs: each view read ordered (``ORDER BY ALL``) and as DuckDB returns it.

    .venv/bin/python -m bench view-order                      # 20k, 100k and 500k steps
    .venv/bin/python -m bench view-order --sizes 20k,100k     # a quick look

``halo_train.data.read_view`` sorts every read by all its columns (``halo_train.data.ordered_sql``): DuckDB's parallel
scans and joins return rows in any order, and a job's batches, a resumed job's remaining steps and a seed's adapter
follow the read's order. This benchmark measures what that sort costs as the lake grows.

The lake grows as ``python -m bench lake-growth`` grows it (``halo_data.synthetic.CampaignGenerator``: one run per
iteration, compacted and vacuumed every ``--compact-every`` runs). At each size, each view (``bc_rows``,
``grpo_groups``, ``dpo_pairs``, ``state_groups``) is read lake-wide (a job over every run) and run-scoped (the newest
run, as the online learner reads it), each read in a fresh process (its peak memory its own), the ordered and the
unordered read alternating ``--repeats`` times. The figures: wall and CPU seconds of the read (snapshot, connection,
query and the Arrow table, the same steps both ways), its rows, the process's peak resident memory, and ordered /
unordered ratios. The lake is kept in ``--workdir``: a second call continues where the first stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ("bc_rows", "grpo_groups", "dpo_pairs", "state_groups")
SCOPES = ("lake", "run")
DEFAULT_WORKDIR = Path("/var/tmp/halo-view-order")


def child_read(lake_root: str, view: str, scope: str, ordered: bool) -> dict[str, Any]:
    """One read of ``view``, as ``read_view`` makes it with or without its order (lake-wide or the newest run)."""
    from halo_data.lake import Lake
    from halo_train.data import _filtered_sql, ordered_sql, resolve_versions

    lake = Lake.open(lake_root)
    runs = None
    if scope == "run":
        con = lake.connect(views=False, tables=("runs",))
        try:
            runs = [con.execute("select max(run_id) from runs").fetchone()[0]]
        finally:
            con.close()
    t, c = time.perf_counter(), time.process_time()
    con = lake.connect(as_of=resolve_versions(lake), runs=runs)
    try:
        query = _filtered_sql(view, None)
        table = con.sql(ordered_sql(query) if ordered else query).to_arrow_table()
    finally:
        con.close()
    return {"seconds": time.perf_counter() - t, "cpu_s": time.process_time() - c, "rows": table.num_rows,
            "arrow_bytes": table.nbytes}


def measure(lake_root: str, repeats: int, log) -> dict[str, Any]:
    """Per view and scope: the ordered and the unordered reads, alternating, and their ratios."""
    from bench.lake_growth import child

    out: dict[str, Any] = {}
    for view in VIEWS:
        for scope in SCOPES:
            reads: dict[str, list[dict]] = {"ordered": [], "unordered": []}
            for _ in range(repeats):
                for variant in reads:
                    reads[variant].append(child([lake_root, view, scope, variant], module="bench.view_order"))
            cell = {variant: {"seconds": [r["seconds"] for r in rs], "cpu_s": [r["cpu_s"] for r in rs],
                              "peak_rss_mb": [r["peak_rss_kb"] / 1024 for r in rs], "rows": rs[0]["rows"],
                              "arrow_mb": rs[0]["arrow_bytes"] / 2**20}
                    for variant, rs in reads.items()}
            if cell["ordered"]["rows"] != cell["unordered"]["rows"]:
                raise RuntimeError(f"{view} {scope}: {cell['ordered']['rows']} rows ordered, {cell['unordered']['rows']} not")
            med = {v: {k: statistics.median(cell[v][k]) for k in ("seconds", "cpu_s", "peak_rss_mb")} for v in cell}
            cell["ratios"] = {k: round(med["ordered"][k] / med["unordered"][k], 2) if med["unordered"][k] else None
                              for k in ("seconds", "cpu_s", "peak_rss_mb")}
            out[f"{view}/{scope}"] = cell
            log(f"  {view:<12} {scope:<4} {cell['ordered']['rows']:>8,} rows: ordered {med['ordered']['seconds']:.2f} s, "
                f"{med['ordered']['peak_rss_mb']:.0f} MB; unordered {med['unordered']['seconds']:.2f} s, "
                f"{med['unordered']['peak_rss_mb']:.0f} MB; ratio {cell['ratios']['seconds']}× time, "
                f"{cell['ratios']['peak_rss_mb']}× memory")
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        lake_root, view, scope, variant = argv[1:]
        print(json.dumps(child_read(lake_root, view, scope, variant == "ordered")))
        return
    from bench.lake_growth import campaign_runs, grow_to, load_progress
    from bench.reports import save
    from bench.run import label, parse_size

    ap = argparse.ArgumentParser(prog="python -m bench view-order", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20k,100k,500k", help="Lake sizes in steps at which the views are read.")
    ap.add_argument("--run-steps", default="5k", help="Steps per campaign run (one iteration).")
    ap.add_argument("--compact-every", type=int, default=50, help="Runs between `compact` + `vacuum` (0: never).")
    ap.add_argument("--repeats", type=int, default=3, help="Reads per view, scope and order, each in its own process.")
    ap.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="Where the lake grows; kept, so a rerun continues.")
    ap.add_argument("--fresh", action="store_true", help="Start the lake and the figures over.")
    args = ap.parse_args(argv)
    from halo_data.lake import Lake
    from halo_data.synthetic import CampaignGenerator, CampaignSpec

    def log(message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)

    sizes = sorted(parse_size(s) for s in args.sizes.split(",") if s.strip())
    if not sizes or args.repeats < 1:
        raise SystemExit("Error: --sizes needs at least one size and --repeats at least 1")
    work = Path(args.workdir)
    key = {"run_steps": parse_size(args.run_steps), "compact_every": args.compact_every}
    progress_path = work / "progress.json"
    progress = load_progress(work, key, args.fresh)
    lake_root = str(work / "lake")
    lake = Lake.init(lake_root)
    generator = CampaignGenerator(CampaignSpec(run_steps=key["run_steps"]))
    for size in sizes:
        name = label(size)
        if grow_to(lake, lake_root, generator, size, progress, args.compact_every, log) is None:
            continue
        _, steps = campaign_runs(lake)
        log(f"[{name}] {steps:,} steps: reading")
        progress["sizes"][name] = {"steps": steps, "views": measure(lake_root, args.repeats, log)}
        progress_path.write_text(json.dumps(progress, indent=1))
    result = {"campaign": key, "repeats": args.repeats, "sizes": progress["sizes"], "commit": ", ".join(progress["commits"])}
    path = save("view-order", result, argv)
    print(json.dumps({size: {cell: data["ratios"] for cell, data in measured["views"].items()}
                      for size, measured in progress["sizes"].items()}, indent=1))
    print(f"results: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
