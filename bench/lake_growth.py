"""An online iteration's cost as the lake grows: run-scoped reads, query cold start and the dashboard at 100k-5M steps.

    .venv/bin/python -m bench lake-growth                              # 100k, 1M, 5M steps (hours the first time)
    .venv/bin/python -m bench lake-growth --sizes 20k,100k --run-steps 2000   # a quick look, ~5 min

One lake grows as an online campaign grows it: one run per iteration (``halo_data.synthetic.CampaignGenerator``:
the same several tasks each iteration, 8 attempts per task, screenshots on 1% of the steps, 4 scored candidates
at 5% of them, each run committed in two appends plus its ``runs`` row), with ``halo-data compact`` and
``vacuum`` every ``--compact-every`` runs as a maintenance job would run them. When it reaches each size, a new
run of ``--probe-steps`` steps is appended (the iteration's own data) and measured, each figure in a fresh
process:

- the seconds to read that run's ``grpo_groups``, ``bc_rows``, ``dpo_pairs`` and ``state_groups`` run-scoped,
  as the online learner reads them (``halo_train.data.read_view(..., runs=[run])``), and the files it lists;
- ``halo-data query "select count(*) from steps"``, whole process (cold start);
- the dashboard's Overview, first render on cold caches (Streamlit's AppTest, as bench/bench_dashboard.py);
- a lake-wide dataset build (``bench.lake_build``, DuckDB's memory limit 1GB) and its peak memory.

The lake and the figures measured so far are kept in ``--workdir``: a second call continues where the first
stopped. ``--s3`` grows the lake in a bucket of moto's S3 server on loopback instead (never kept) and counts the
GET and HEAD requests of the run-scoped reads: the new run's data files, other runs' (none), the log's. The result is written to ``bench/results/lake-growth/<time>.json`` (``python -m bench report lake-growth``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
VIEWS = ("grpo_groups", "bc_rows", "dpo_pairs", "state_groups")
TARGETS = {"read_ratio": 1.5, "cold_start_s": 0.5, "first_render_s": 3.0}
DEFAULT_WORKDIR = Path(os.environ.get("HALO_BENCH_WORKDIR", "/var/tmp")) / "halo-lake-growth"


def parse_size(text: str) -> int:
    from bench.run import parse_size as parse

    return parse(text)


def label(n: int) -> str:
    from bench.run import label as lab

    return lab(n)


def child(args: list[str], module: str = "bench.lake_growth") -> dict[str, Any]:
    """Run ``python -m bench.measure MODULE --child ...`` (a figure in a fresh process): its JSON line, with its peak RSS."""
    command = [sys.executable, "-m", "bench.measure", module, "--child", *args]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {(proc.stderr or proc.stdout)[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------- children (one figure per process)
def child_reads(lake_root: str, run_id: str, repeats: int) -> dict[str, Any]:
    """Each view of one run, run-scoped, ``repeats`` times; the files a run-scoped read lists against the table's."""
    from halo_data import schema as S
    from halo_data.lake import Lake
    from halo_train.data import read_view

    lake = Lake.open(lake_root)
    files = {}
    for name, spec in S.TABLES.items():
        if "run_id" not in spec.column_names:
            continue
        dtab = lake.table(name)
        files[name] = {"listed": len(dtab.file_uris(file_pruning_predicate=[("run_id", "in", [run_id])])),
                       "table": len(dtab.file_uris())}
    out: dict[str, Any] = {"files": files, "views": {}}
    for view in VIEWS:
        seconds, cpu = [], []
        rows = 0
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            rows = read_view(lake_root, view, runs=[run_id]).table.num_rows
            seconds.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        # CPU seconds (every thread of this process) say the same on a busy machine; wall seconds do not
        out["views"][view] = {"seconds": seconds, "cpu_s": cpu, "rows": rows}
    return out


def child_dashboard(lake_root: str, repeats: int) -> dict[str, Any]:
    import logging

    logging.getLogger("streamlit").setLevel(logging.ERROR)
    from bench.bench_dashboard import measure

    return measure(lake_root, repeats=repeats)


# ---------------------------------------------------------------------- the campaign
def campaign_runs(lake) -> tuple[int, int]:
    """(campaign iterations in the lake, steps in the lake)."""
    con = lake.connect(views=False, tables=("runs",))
    try:
        iterations = con.execute("select count(*) from runs where run_id like 'iter-%' or run_id like 'probe-%'").fetchone()[0]
    finally:
        con.close()
    from halo_data.ops import stats

    steps = next(s["rows"] for s in stats(lake) if s["table"] == "steps")
    return int(iterations), int(steps)


def maintain(lake) -> dict[str, Any]:
    """What a maintenance job runs: compact, then vacuum what compaction replaced."""
    from halo_data.ops import compact, vacuum

    t = time.perf_counter()
    report = compact(lake)
    compact_s = time.perf_counter() - t
    t = time.perf_counter()
    removed = vacuum(lake, retention_hours=0)
    return {"compact_s": compact_s, "vacuum_s": time.perf_counter() - t,
            "files_removed": sum(len(v) for v in removed.values()),
            "compacted": {k: v for k, v in report["tables"].items() if v["files_removed"]}}


def grow(lake, generator, until_steps: int, compact_every: int, log) -> dict[str, Any]:
    """Append campaign runs until the lake holds ``until_steps`` steps; the append and maintenance seconds."""
    iteration, steps = campaign_runs(lake)
    appended = []
    maintenance = []
    t0 = time.perf_counter()
    while steps < until_steps:
        t = time.perf_counter()
        written = generator.append_run(lake, iteration)
        appended.append(time.perf_counter() - t)
        steps += written["steps"]
        iteration += 1
        if compact_every and iteration % compact_every == 0:
            maintenance.append(maintain(lake))
        if iteration % 20 == 0:
            log(f"  {iteration} runs, {steps:,} steps ({time.perf_counter() - t0:.0f} s)")
    return {"runs_appended": len(appended), "append_s": appended, "maintenance": maintenance,
            "seconds": time.perf_counter() - t0}


def load_progress(work: Path, key: dict[str, Any], fresh: bool, **more: Any) -> dict[str, Any]:
    """The figures measured so far on the lake in ``work`` (``progress.json``), grown with the options ``key``; a new
    record (the folder emptied) when there is none or ``fresh``. Its ``commits``: every commit a call measured at."""
    progress_path = work / "progress.json"
    progress = json.loads(progress_path.read_text()) if progress_path.exists() and not fresh else {}
    if progress and progress.get("campaign") != key:
        raise SystemExit(f"Error: {work} holds a lake grown with {progress.get('campaign')}, not {key}: "
                         "pass the same options, --fresh, or another --workdir")
    if fresh or not progress:
        shutil.rmtree(work, ignore_errors=True)
        progress = {"campaign": key, **more, "sizes": {}}
    work.mkdir(parents=True, exist_ok=True)
    from bench.reports import head_commit

    commits = progress.setdefault("commits", [])
    if head_commit() not in commits:
        commits.append(head_commit())
    return progress


def grow_to(lake, lake_root: str, generator, size: int, progress: dict[str, Any], compact_every: int, log) -> dict[str, Any] | None:
    """Grow the lake to ``size`` steps (``grow``); None where that size was measured before."""
    name = label(size)
    if name in progress["sizes"]:
        log(f"[{name}] measured before, kept")
        return None
    iteration, steps = campaign_runs(lake)
    if steps > size * 1.1:
        raise SystemExit(f"Error: the lake at {lake_root} already holds {steps:,} steps, past {name}: "
                         "measure the sizes in increasing order, or pass --fresh")
    log(f"[{name}] growing from {steps:,} steps, {iteration} runs")
    return grow(lake, generator, size, compact_every, log)


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class MotoS3:
    """moto's S3 server on loopback, the lake in a bucket of it (as tests/test_s3_lake.py runs it), with its
    request recorder: which objects a read GETs. The bucket lives in the server's memory: an s3 lake is never
    kept between calls."""

    def __init__(self, work: Path) -> None:
        import uuid

        from bench import s3_server

        self.recording = work / "moto-requests.jsonl"
        try:
            self.proc, self.url = s3_server.start(self.recording)
        except RuntimeError as e:
            raise SystemExit(f"Error: {e}") from None
        # placeholder credentials of moto's server; children (reads, queries, the dashboard) inherit them
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                           "AWS_ENDPOINT_URL": self.url, "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"})
        import boto3

        self.bucket = f"halo-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=self.bucket)
        self.root = f"s3://{self.bucket}/lake"

    def _call(self, what: str) -> None:
        import urllib.request

        request = urllib.request.Request(f"{self.url}/moto-api/recorder/{what}", method="POST")
        urllib.request.urlopen(request, timeout=30).close()

    def record(self) -> None:
        self._call("reset-recording")
        self._call("start-recording")

    def requests(self, run_id: str, lake) -> dict[str, int]:
        """Since ``record()``: GET and HEAD requests of data files, classed by the run_id statistics (or partition)
        the Delta log gives each file: this run's alone, shared with other runs (compacted), other runs' alone,
        files of no run (a table without run_id); and of Delta logs."""
        import urllib.parse

        import pyarrow as pa

        from halo_data import schema as S

        self._call("stop-recording")
        runs_of_file: dict[str, set] = {}
        for name, spec in S.TABLES.items():
            if "run_id" not in spec.column_names:
                continue
            actions = pa.table(lake.table(name).get_add_actions(flatten=True))
            cols = set(actions.column_names)
            for a in actions.to_pylist():
                held = {a["partition.run_id"]} if "partition.run_id" in cols else \
                    {a.get("min.run_id"), a.get("max.run_id")} if {"min.run_id", "max.run_id"} <= cols else {None}
                runs_of_file[a["path"].rsplit("/", 1)[-1]] = held
        counts = {"run_data": 0, "shared_data": 0, "other_runs_data": 0, "unpartitioned_data": 0, "log": 0, "other": 0}
        for line in self.recording.read_text().splitlines():
            entry = json.loads(line)
            if entry["method"] not in ("GET", "HEAD"):
                continue
            path = urllib.parse.unquote(urllib.parse.urlparse(entry["url"]).path)
            held = runs_of_file.get(path.rsplit("/", 1)[-1])
            if "/_delta_log/" in path:
                counts["log"] += 1
            elif not path.endswith(".parquet"):
                counts["other"] += 1
            elif held is None:
                counts["unpartitioned_data"] += 1
            elif held == {run_id}:
                counts["run_data"] += 1
            elif None in held or min(held) <= run_id <= max(held):
                counts["shared_data"] += 1
            else:
                counts["other_runs_data"] += 1
        return counts

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def disk_bytes(path: Path) -> dict[str, int]:
    out = {}
    for p in path.iterdir():
        if p.is_dir():
            out[p.name] = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return out


def measure_size(lake_root: str, size: int, generator, iteration: int, args, log, s3: MotoS3 | None = None) -> dict[str, Any]:
    from halo_data.lake import Lake
    from halo_data.ops import stats

    lake = Lake.open(lake_root)
    load_before = [round(x, 1) for x in os.getloadavg()]
    run_id = f"probe-{label(size)}"
    t = time.perf_counter()
    present = lake.query_arrow("select count(*) as n from steps where run_id = $r", {"r": run_id}, views=False)["n"][0].as_py()
    if present:  # appended by a call stopped while measuring it: measured again, not appended twice
        probe = {"run_id": run_id, "steps": present, "appended_before": True}
    else:
        probe = generator.append_run(lake, iteration, run_id=run_id)
    res: dict[str, Any] = {"probe": probe, "probe_append_s": None if present else time.perf_counter() - t,
                           "load_average_before": load_before}
    res["tables"] = {s["table"]: {k: s[k] for k in ("rows", "files", "bytes")} for s in stats(lake)}
    res["disk_bytes"] = disk_bytes(Path(lake_root)) if s3 is None else {}
    res["runs"] = campaign_runs(lake)[0]
    log(f"[{label(size)}] run-scoped reads of {run_id}")
    if s3 is not None:
        s3.record()
    res["reads"] = child(["reads", lake_root, run_id, str(args.repeats)])
    if s3 is not None:
        res["reads"]["requests"] = s3.requests(run_id, lake)
    log(f"[{label(size)}] query cold start")
    cold, cold_cpu = [], []
    for _ in range(args.repeats + 2):
        t, c = time.perf_counter(), children_cpu()
        subprocess.run([str(BIN / "halo-data"), "query", "select count(*) from steps", "--lake", lake_root],
                       check=True, capture_output=True, cwd=ROOT)
        cold.append(time.perf_counter() - t)
        cold_cpu.append(children_cpu() - c)
    res["query_cold_start_s"] = cold
    res["query_cold_start_cpu_s"] = cold_cpu
    if not args.no_dashboard:
        log(f"[{label(size)}] dashboard first render")
        res["dashboard"] = child(["dashboard", lake_root, "2"])
    if not args.no_full_build:
        log(f"[{label(size)}] lake-wide dataset build (memory limit {args.memory_limit})")
        out = Path(args.workdir) / "build-out"
        command = [sys.executable, "-m", "bench.measure", "bench.lake_build", lake_root, str(out),
                   "--memory-limit", args.memory_limit]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        shutil.rmtree(out, ignore_errors=True)
        if proc.returncode != 0:
            res["full_build"] = {"failed": (proc.stderr or proc.stdout)[-500:]}
        else:
            res["full_build"] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    return res


def summary(sizes: dict[str, dict]) -> dict[str, Any]:
    """The targets' figures: per-run read ratio largest/smallest size per view, cold start and render at the largest."""
    if not sizes:
        return {}
    ordered = sorted(sizes.items(), key=lambda kv: kv[1]["steps"])
    (small_label, small), (big_label, big) = ordered[0], ordered[-1]
    out: dict[str, Any] = {"smallest": small_label, "largest": big_label, "read_ratio": {}}
    for view in VIEWS:
        a = statistics.median(small["reads"]["views"][view]["seconds"])
        b = statistics.median(big["reads"]["views"][view]["seconds"])
        out["read_ratio"][view] = b / a if a else None
    out["cold_start_s"] = statistics.median(big["query_cold_start_s"])
    if "dashboard" in big:
        out["first_render_s"] = big["dashboard"]["overview_first_render_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        kind, *rest = argv[1:]
        if kind == "reads":
            print(json.dumps(child_reads(rest[0], rest[1], int(rest[2]))))
        elif kind == "dashboard":
            print(json.dumps(child_dashboard(rest[0], int(rest[1]))))
        else:
            raise SystemExit(f"Error: no child {kind!r}")
        return
    ap = argparse.ArgumentParser(prog="python -m bench lake-growth", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100k,1M,5M", help="Lake sizes in steps at which a new run is measured.")
    ap.add_argument("--run-steps", default="5k", help="Steps per campaign run (one iteration).")
    ap.add_argument("--probe-steps", default="5k", help="Steps of the new run measured at each size.")
    ap.add_argument("--compact-every", type=int, default=50, help="Runs between `compact` + `vacuum` (0: never).")
    ap.add_argument("--repeats", type=int, default=3, help="Reads per view, and cold starts (+2).")
    ap.add_argument("--memory-limit", default="1GB", help="DuckDB's memory limit in the lake-wide build.")
    ap.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="Where the lake grows; kept, so a rerun continues.")
    ap.add_argument("--fresh", action="store_true", help="Start the lake and the figures over.")
    ap.add_argument("--no-dashboard", action="store_true", help="Skip the dashboard's render.")
    ap.add_argument("--no-full-build", action="store_true", help="Skip the lake-wide dataset build.")
    ap.add_argument("--s3", action="store_true",
                    help="The lake in a bucket of moto's S3 server on loopback, and the requests a run-scoped read "
                         "sends counted (never kept: the bucket is in the server's memory).")
    args = ap.parse_args(argv)
    from bench.reports import save
    from halo_data.synthetic import CampaignSpec

    def log(message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)

    sizes = sorted(parse_size(s) for s in args.sizes.split(",") if s.strip())
    work = Path(args.workdir)
    spec = CampaignSpec(run_steps=parse_size(args.run_steps))
    key = {"run_steps": spec.run_steps, "probe_steps": parse_size(args.probe_steps), "compact_every": args.compact_every}
    if args.s3:
        work = work / "s3"
        args.fresh = True  # the bucket does not outlive this process
        key["s3"] = True
    progress_path = work / "progress.json"
    progress = load_progress(work, key, args.fresh, spec=spec.__dict__)
    s3 = MotoS3(work) if args.s3 else None
    lake_root = s3.root if s3 else str(work / "lake")
    try:
        grow_and_measure(args, sizes, spec, key, work, lake_root, progress, progress_path, log, s3)
    finally:
        if s3 is not None:
            s3.close()
    result = {"campaign": progress["campaign"], "spec": progress["spec"], "sizes": progress["sizes"],
              "summary": summary(progress["sizes"]), "targets": TARGETS, "memory_limit_gb": gigabytes(args.memory_limit),
              "commit": ", ".join(progress["commits"])}
    path = save("lake-growth", result, argv)
    print(json.dumps(result["summary"], indent=2))
    print(f"results: {path.relative_to(ROOT)}")


def gigabytes(text: str) -> float | None:
    limit = text.strip().upper()
    return float(limit[:-2]) / (1000 if limit.endswith("MB") else 1) if limit.endswith(("GB", "MB")) else None


def grow_and_measure(args, sizes, spec, key, work: Path, lake_root: str, progress: dict, progress_path: Path, log, s3) -> None:
    from halo_data.lake import Lake
    from halo_data.synthetic import CampaignGenerator, CampaignSpec

    lake = Lake.init(lake_root)
    log(f"templates of {spec.run_steps:,} steps")
    generator = CampaignGenerator(spec)
    probe_generator = CampaignGenerator(CampaignSpec(**{**spec.__dict__, "run_steps": key["probe_steps"], "templates": 1}))
    for size in sizes:
        name = label(size)
        growth = grow_to(lake, lake_root, generator, size, progress, args.compact_every, log)
        if growth is None:
            continue
        iteration, steps = campaign_runs(lake)
        res = measure_size(lake_root, size, probe_generator, iteration, args, log, s3)
        res.update({"steps": steps, "growth": growth})
        progress["sizes"][name] = res
        progress_path.write_text(json.dumps(progress, indent=2, default=str))


if __name__ == "__main__":
    main()
