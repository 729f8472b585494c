"""A table's Delta log as its commits add up, and what ``halo-data vacuum`` keeps of it.

    .venv/bin/python -m bench delta-log                          # 250, 500, 1000 and 2000 commits to steps
    .venv/bin/python -m bench delta-log --commits 100,200        # a quick look

HALO's tables write a Delta checkpoint every 10 commits (``delta.checkpointInterval``), and each checkpoint lists
every file of its version, so a table appended to without compaction carries checkpoints whose total grows with the
square of its commits. ``halo-data vacuum`` deletes the checkpoints reads no longer start from and keeps every
commit. This benchmark appends one episode per commit to ``steps`` (as a rollout's writer does), and at each size
measures, side by side in one run: the data's bytes and the log's (checkpoints and commits); then, on a copy of
the lake vacuumed with ``--retention-hours 0``, the log's bytes, and the seconds to open ``steps`` at its latest
version and at the version halfway (the vacuumed copy replays the commits before it from the start), each the
median of ``--repeats`` opens in alternation, with the rows each reads (the same both ways, or the run fails).

Beside it, the same episodes go to a second lake written with min/max statistics of every column but the long
texts, as HALO wrote ``steps`` before its ``UNFILTERED_COLUMNS`` (goal, URL, the hashes): its log's
bytes, and the seconds to open its latest version, alternating with the first lake's opens.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_WORKDIR = Path("/var/tmp/halo-delta-log")


def log_bytes(table_dir: Path) -> dict[str, int]:
    """The log's checkpoint and commit bytes, listed and told apart as ``halo-data stats`` and ``vacuum`` do."""
    from halo_data.lake import DELTA_CHECKPOINT, Lake

    files = Lake.open(str(table_dir.parent)).list_files(f"{table_dir.name}/_delta_log")
    checkpoints = {name: size for name, size in files.items() if DELTA_CHECKPOINT.fullmatch(name)}
    commits = sum(size for name, size in files.items() if name.endswith(".json"))
    return {"checkpoints": sum(checkpoints.values()), "commits": commits, "checkpoint_files": len(checkpoints)}


def data_bytes(table_dir: Path) -> int:
    return sum(f.stat().st_size for f in table_dir.rglob("*.parquet") if "_delta_log" not in f.parts)


def open_seconds(uri: str, version: int | None) -> tuple[float, int]:
    """Seconds to open the table (at ``version``, or its latest) and list its files; the rows it then holds."""
    import pyarrow as pa
    from deltalake import DeltaTable

    t = time.perf_counter()
    dtab = DeltaTable(uri, version=version) if version is not None else DeltaTable(uri)
    actions = pa.table(dtab.get_add_actions(flatten=True))
    seconds = time.perf_counter() - t
    return seconds, sum(actions.column("num_records").to_pylist())


@contextlib.contextmanager
def every_statistic():
    """HALO's writer as it was before ``UNFILTERED_COLUMNS``: min/max of every column but the long texts."""
    from halo_data import lake as lake_module

    kept = dict(lake_module.UNFILTERED_COLUMNS)
    lake_module.UNFILTERED_COLUMNS.clear()
    try:
        yield
    finally:
        lake_module.UNFILTERED_COLUMNS.update(kept)


def append_episodes(lake, start: int, stop: int) -> None:
    """One episode of one step per commit, as a rollout's writer flushes them, with a MiniWoB step's goal, URL and
    screenshot hashes."""
    from halo_data.writer import EpisodeWriter

    with EpisodeWriter(lake, flush_episodes=1) as writer:
        for i in range(start, stop):
            shots = [hashlib.sha256(f"{i}/{k}".encode()).hexdigest() for k in (0, 1)]
            writer.write_episode(
                {"run_id": f"delta-log-{i // 100}", "env": "miniwob", "task_id": "miniwob.click-test", "site": "miniwob",
                 "task_seed": i, "attempt_idx": 0, "success": i % 3 == 0, "mode": "random"},
                [{"prompt": f"[{i}] click the button", "model_output": "click('4')", "action": "click('4')",
                  "action_valid": True, "r_success": float(i % 3 == 0),
                  "goal": f"Select {i % 7 + 1} of the items below whose label starts with '{chr(97 + i % 26)}', then Submit.",
                  "url": f"file:///opt/halo/miniwob/html/miniwob/click-test.html?seed={i}",
                  "screenshot_hash": shots[0], "screenshot_after_hash": shots[1]}])


def measure(table_dir: Path, work: Path, repeats: int, every_stat_dir: Path) -> dict[str, Any]:
    """The log before and after vacuum, and the opens of both copies and of the lake written with every column's
    statistics (at its latest version), alternating."""
    from halo_data.lake import Lake
    from halo_data.ops import vacuum

    lake_dir = table_dir.parent
    copy = work / "vacuumed"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(lake_dir, copy)
    vacuum(Lake.open(str(copy)), retention_hours=0)
    version = Lake.open(str(lake_dir)).table("steps").version()
    halfway = version // 2
    opens: dict[str, dict[str, list[float]]] = {"kept": {"latest": [], "halfway": []},
                                                 "vacuumed": {"latest": [], "halfway": []}, "every_statistic": {"latest": []}}
    rows: dict[str, dict[str, int]] = {"kept": {}, "vacuumed": {}, "every_statistic": {}}
    for _ in range(repeats):
        for name, root in (("kept", lake_dir), ("vacuumed", copy), ("every_statistic", every_stat_dir.parent)):
            for which, at in (("latest", None), ("halfway", halfway)):
                if which in opens[name]:
                    seconds, n = open_seconds(str(root / "steps"), at)
                    opens[name][which].append(seconds)
                    rows[name][which] = n
    if rows["kept"] != rows["vacuumed"] or rows["every_statistic"]["latest"] != rows["kept"]["latest"]:
        raise RuntimeError(f"the copies read other rows: {rows}")
    return {"version": version, "halfway": halfway, "rows": rows["kept"], "data_bytes": data_bytes(table_dir),
            "log": log_bytes(table_dir), "log_vacuumed": log_bytes(copy / "steps"), "open_seconds": opens,
            "log_every_statistic": log_bytes(every_stat_dir), "data_bytes_every_statistic": data_bytes(every_stat_dir)}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from bench.reports import save

    ap = argparse.ArgumentParser(prog="python -m bench delta-log", description=__doc__.splitlines()[0])
    ap.add_argument("--commits", default="250,500,1000,2000", help="Commits to steps at which the log is measured.")
    ap.add_argument("--repeats", type=int, default=5, help="Opens of each copy and version, alternating.")
    ap.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="Where the lake is built (started over each run).")
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.commits.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or args.repeats < 1:
        raise SystemExit("Error: --commits needs positive numbers and --repeats at least 1")
    from halo_data.lake import Lake

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    lake = Lake.init(str(work / "lake"))
    every_stat = Lake.init(str(work / "every-statistic"))
    out: dict[str, Any] = {}
    done = 0
    for size in sizes:
        t = time.perf_counter()
        append_episodes(lake, done, size)
        append_seconds = time.perf_counter() - t
        with every_statistic():
            append_episodes(every_stat, done, size)
        done = size
        cell = measure(work / "lake" / "steps", work, args.repeats, work / "every-statistic" / "steps")
        cell["append_seconds"] = append_seconds
        out[str(size)] = cell
        med = {n: {w: statistics.median(v) for w, v in o.items()} for n, o in cell["open_seconds"].items()}
        every = cell["log_every_statistic"]
        print(f"{size} commits: data {cell['data_bytes'] / 2**20:.2f} MiB, log {cell['log']['checkpoints'] / 2**20:.2f} MiB "
              f"of checkpoints + {cell['log']['commits'] / 2**20:.2f} MiB of commits; vacuumed "
              f"{cell['log_vacuumed']['checkpoints'] / 2**20:.2f} + {cell['log_vacuumed']['commits'] / 2**20:.2f} MiB; "
              f"open latest {med['kept']['latest']:.3f} s / {med['vacuumed']['latest']:.3f} s, version {cell['halfway']} "
              f"{med['kept']['halfway']:.3f} s / {med['vacuumed']['halfway']:.3f} s (kept / vacuumed); with every "
              f"column's statistics: log {every['checkpoints'] / 2**20:.2f} + {every['commits'] / 2**20:.2f} MiB, "
              f"open latest {med['every_statistic']['latest']:.3f} s", flush=True)
    path = save("delta-log", {"sizes": out, "repeats": args.repeats}, argv)
    print(f"results: {path}")
