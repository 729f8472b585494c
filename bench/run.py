"""Run every HALO benchmark side by side with its baseline and print a table of ratios.

    .venv/bin/python -m bench --quick                      # 10k steps, < 2 minutes
    .venv/bin/python -m bench --sizes 10k,100k,300k,1M     # the README's table
    .venv/bin/python -m bench --check                      # sanity check of the harness (tiny, asserts)

Each figure is measured in the same run as its baseline; times and ratios are
given as min/median/max over ``--repeats``. Results are also written as JSON
under bench/results/lake/ (``python -m bench report lake`` tables the committed ones). The older pipeline is measured only up to
``--legacy-max-steps`` (a 1M-step JSONL with base64 screenshots is ~90 GB); beyond
it the table states a per-step extrapolation, marked as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (python bench/run.py): make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import write_path  # noqa: E402
from bench.compare import compare_outputs  # noqa: E402
from bench.generate import generate  # noqa: E402
from bench.reports import head_commit  # noqa: E402
from halo_data.synthetic import SyntheticSpec  # noqa: E402

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DASHBOARD_BENCH = ROOT / "bench" / "bench_dashboard.py"
BIN = Path(sys.executable).parent

TARGETS = {
    "build_vs_jsonl_b64_300k": 25.0,
    "build_vs_jsonl_stripped": 5.0,
    "lake_build_1m_seconds": 3.0,
    "lake_build_1m_rss_gb": 2.0,
    "storage_text_ratio": 10.0,
    "storage_total_ratio": 4.0,
    "query_cold_start_seconds": 0.5,
    "write_us_per_step": 60.0,
    "write_ratio": 3.0,
    "lake_share_of_rollout_step": 0.02,
    "dashboard_first_render_seconds": 3.0,
}


def parse_size(text: str) -> int:
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1_000, t[:-1]
    elif t.endswith("m"):
        mult, t = 1_000_000, t[:-1]
    return int(float(t) * mult)


def label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def mmm(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[dict, float, float]:
    """Run a command; return (its JSON stdout, wall seconds, peak RSS in GB of that process)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    out, err = proc.communicate()  # communicate reaps via wait(); use the rusage of this child below
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    rss_gb = float("nan")
    text = out.decode().strip().splitlines()
    data = json.loads(text[-1]) if text else {}
    if "peak_rss_kb" in data:
        rss_gb = data["peak_rss_kb"] / 1024 / 1024
    return data, wall, rss_gb


def python_module(module: str, *args: str) -> list[str]:
    # bench.measure wraps the module so the child reports its own peak RSS (ru_maxrss of its process).
    return [sys.executable, "-m", "bench.measure", module, *args]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def lake_text_bytes(lake_root: Path) -> int:
    return sum(dir_bytes(p) if p.is_dir() else p.stat().st_size for p in lake_root.iterdir() if p.name != "screenshots")


@dataclasses.dataclass
class Options:
    sizes: list[int]
    repeats: int
    legacy_max_steps: int
    workdir: Path
    keep: bool
    write_steps: int
    flush_episodes: int
    quick: bool
    rollout: bool
    dashboard: bool
    argv: list[str] = dataclasses.field(default_factory=list)


class Bench:
    def __init__(self, opts: Options):
        self.opts = opts
        self.results: dict[str, Any] = {
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join([".venv/bin/python", "-m", "bench", *opts.argv]),
            "machine": machine(),
            "commit": head_commit(),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(opts).items()},
            "sizes": {},
        }

    # ------------------------------------------------------------------ per size
    def size(self, n: int) -> dict[str, Any]:
        o = self.opts
        w = o.workdir / f"steps-{label(n)}"
        shutil.rmtree(w, ignore_errors=True)
        w.mkdir(parents=True)
        legacy = n <= o.legacy_max_steps
        res: dict[str, Any] = {"steps": n, "legacy_measured": legacy}
        log.info("[%s] generating (lake%s)", label(n), " + JSONL" if legacy else "")
        gen = generate(
            SyntheticSpec(n_steps=n, seed=0),
            w / "lake",
            w / "jsonl" if legacy else None,
            w / "jsonl_stripped" if legacy else None,
        )
        res["generate"] = dataclasses.asdict(gen)
        # The generated lake (15 GB at 1M, most of it screenshots) is still being written back from the page cache:
        # measured then, every figure below also waits for the disk (the write path took 3x as long). Flushed first.
        t0 = time.perf_counter()
        os.sync()
        res["sync_seconds"] = time.perf_counter() - t0
        # storage, before compaction (compaction keeps the old files until vacuum)
        st = {"lake_total": dir_bytes(w / "lake"), "lake_text": lake_text_bytes(w / "lake")}
        if legacy:
            st["jsonl_b64"] = dir_bytes(w / "jsonl")
            st["jsonl_stripped"] = dir_bytes(w / "jsonl_stripped")
        res["storage_bytes_per_step"] = {k: v / n for k, v in st.items()}
        # dataset build, interleaved repeats
        builds: dict[str, list] = {"lake": [], "lake_rss_gb": [], "jsonl_b64": [], "jsonl_b64_rss_gb": [], "jsonl_stripped": [], "jsonl_stripped_rss_gb": []}
        repeats = o.repeats if n < 300_000 else min(o.repeats, 2)
        for r in range(repeats):
            log.info("[%s] dataset build, repeat %d/%d", label(n), r + 1, repeats)
            data, _, rss = run_measured(python_module("bench.lake_build", str(w / "lake"), str(w / f"lake_out{r}")))
            builds["lake"].append(data["seconds"])
            builds["lake_rss_gb"].append(rss)
            res.setdefault("lake_rows", data["rows"])
            res.setdefault("lake_view_seconds", []).append(data["view_seconds"])
            if legacy:
                for kind in ("jsonl_b64", "jsonl_stripped"):
                    src = w / ("jsonl" if kind == "jsonl_b64" else "jsonl_stripped")
                    data, _, rss = run_measured(python_module("bench.legacy_export", str(src), str(w / f"{kind}_out{r}")))
                    builds[kind].append(data["seconds"])
                    builds[f"{kind}_rss_gb"].append(rss)
            if r == 0 and legacy:
                log.info("[%s] checking outputs equal", label(n))
                res["outputs_equal_b64"] = compare_outputs(w / "lake_out0", w / "jsonl_b64_out0")
                res["outputs_equal_stripped"] = compare_outputs(w / "lake_out0", w / "jsonl_stripped_out0")
            for d in w.glob(f"*_out{r}"):
                if r > 0 or not o.keep:
                    shutil.rmtree(d, ignore_errors=True)
        res["build_seconds"] = {k: mmm(v) for k, v in builds.items() if v}
        if legacy:
            res["build_ratio_vs_b64"] = mmm([a / b for a, b in zip(builds["jsonl_b64"], builds["lake"])])
            res["build_ratio_vs_stripped"] = mmm([a / b for a, b in zip(builds["jsonl_stripped"], builds["lake"])])
        # compaction, then the query cold start as a whole process
        log.info("[%s] compact", label(n))
        t0 = time.perf_counter()
        subprocess.run([str(BIN / "halo-data"), "compact", "--lake", str(w / "lake")], check=True, capture_output=True, cwd=ROOT)
        res["compact_seconds"] = time.perf_counter() - t0
        os.sync()  # compaction's rewritten files, as above
        cold = []
        for _ in range(5):
            t0 = time.perf_counter()
            out = subprocess.run([str(BIN / "halo-data"), "query", "select count(*) from steps", "--lake", str(w / "lake")], check=True, capture_output=True, cwd=ROOT)
            cold.append(time.perf_counter() - t0)
        res["query_cold_start_seconds"] = mmm(cold)
        res["query_result"] = out.stdout.decode().strip()
        res["query_heavy_imports"] = heavy_imports(w / "lake")
        if o.dashboard and n == max(o.sizes):
            res["dashboard"] = dashboard(w / "lake", n)
        if not o.keep:
            shutil.rmtree(w, ignore_errors=True)
        return res

    def run(self) -> dict[str, Any]:
        o = self.opts
        for n in o.sizes:
            self.results["sizes"][label(n)] = self.size(n)
            self.save()
        log.info("write path (%d steps x %d repeats)", o.write_steps, o.repeats)
        os.sync()  # the sizes' folders just deleted: their writeback is not the write path's
        self.results["write_path"] = write_path.measure(o.write_steps, o.repeats, o.flush_episodes)
        if o.rollout:
            self.results["rollout"] = rollout(o.workdir, quick=o.quick)
        self.results["ended_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.save()
        return self.results

    def save(self) -> Path:
        """bench/results/lake/<start time>.json, the table's source (``python -m bench report lake``)."""
        (RESULTS / "lake").mkdir(parents=True, exist_ok=True)
        path = RESULTS / "lake" / f"{self.results['started_at'].replace(':', '').replace('+0000', '')}.json"
        path.write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        return path


# ---------------------------------------------------------------------- helpers
def machine() -> dict[str, Any]:
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            mem_gb = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    gpu = shutil.which("nvidia-smi") is not None
    return {"cpus": os.cpu_count(), "memory_gib": mem_gb, "gpu": gpu, "python": platform.python_version(),
            "platform": platform.platform(), "load_average_at_start": os.getloadavg()}


HEAVY = ("torch", "transformers", "streamlit", "polars", "pandas")


def heavy_imports(lake: Path) -> list[str]:
    """Top-level packages on the query path that it should not need."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "halo_data.cli", "query", "select 1", "--lake", str(lake)],
                         capture_output=True, text=True, cwd=ROOT)
    found = set()
    for line in out.stderr.splitlines():
        if "|" in line:
            mod = line.rsplit("|", 1)[1].strip()
            if mod.split(".")[0] in HEAVY:
                found.add(mod.split(".")[0])
    return sorted(found)


def dashboard(lake: Path, n: int) -> dict[str, Any]:
    if not DASHBOARD_BENCH.exists():
        return {"skipped": f"{DASHBOARD_BENCH.relative_to(ROOT)} not present"}
    help_text = subprocess.run([sys.executable, str(DASHBOARD_BENCH), "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    cmd = [sys.executable, str(DASHBOARD_BENCH), "--steps", str(n)]
    if "--lake" in help_text:
        cmd += ["--lake", str(lake)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    res: dict[str, Any] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode}
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            res["result"] = json.loads(line)
            break
        except ValueError:
            continue
    else:
        res["output_tail"] = (proc.stdout + proc.stderr)[-1500:]
    return res


def rollout(workdir: Path, quick: bool) -> dict[str, Any]:
    from bench.rollout import measure as measure_rollout

    return measure_rollout(workdir / "rollout", quick=quick)


# ---------------------------------------------------------------------- table
def fmt_mmm(m: dict | None, unit: str = "", digits: int = 2) -> str:
    if not m:
        return "-"
    return f"{m['min']:.{digits}f} / {m['median']:.{digits}f} / {m['max']:.{digits}f}{unit}"


def table_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(figure, size, measured min/median/max, target, met?)"""
    rows = []
    sizes = results.get("sizes", {})

    def met(ok: bool | None) -> str:
        return "-" if ok is None else ("yes" if ok else "NO")

    measured = [s for s in sizes.values() if s["legacy_measured"]]
    largest_legacy = max(measured, key=lambda s: s["steps"]) if measured else None
    for name, s in sizes.items():
        g = s["generate"]
        rows.append(("generated: episodes / screenshots / new-state share", name, f"{g['episodes']} / {g['screenshots']} / {g['new_state_share']:.0%}", "~30% new states", "-"))
        b = s["build_seconds"]
        rows.append(("dataset build, lake (s)", name, fmt_mmm(b["lake"]), "<= 3 s at 1M" if s["steps"] >= 1_000_000 else "", met(b["lake"]["median"] <= 3.0) if s["steps"] >= 1_000_000 else "-"))
        if "lake_rss_gb" in b:
            rows.append(("dataset build, lake peak RSS (GB)", name, fmt_mmm(b["lake_rss_gb"]), "<= 2 GB at 1M" if s["steps"] >= 1_000_000 else "", met(b["lake_rss_gb"]["max"] <= 2.0) if s["steps"] >= 1_000_000 else "-"))
        if s["legacy_measured"]:
            rows.append(("dataset build, older JSONL+base64 (s)", name, fmt_mmm(b["jsonl_b64"]), "", "-"))
            rows.append(("dataset build, older JSONL stripped (s)", name, fmt_mmm(b["jsonl_stripped"]), "", "-"))
            big = s["steps"] >= 300_000
            r1, r2 = s["build_ratio_vs_b64"], s["build_ratio_vs_stripped"]
            rows.append(("build speed-up vs JSONL+base64 (x)", name, fmt_mmm(r1, "x", 1), ">= 25x at 300k" if big else "", met(r1["median"] >= 25) if big else "-"))
            rows.append(("build speed-up vs JSONL stripped (x)", name, fmt_mmm(r2, "x", 1), ">= 5x at 300k" if big else "", met(r2["median"] >= 5) if big else "-"))
            eq = s["outputs_equal_b64"]["equal"] and s["outputs_equal_stripped"]["equal"]
            counts = s["outputs_equal_b64"]["counts"]
            rows.append(("outputs equal (bc / dpo / grpo rows)", name, f"{'equal' if eq else 'DIFFER'} ({counts['bc_rows']['lake']} / {counts['dpo_pairs']['lake']} / {counts['grpo_groups']['lake']})", "equal", met(eq)))
            st = s["storage_bytes_per_step"]
            t_ratio = st["jsonl_stripped"] / st["lake_text"]
            a_ratio = st["jsonl_b64"] / st["lake_total"]
            rows.append(("bytes/step text+metadata: JSONL / lake", name, f"{st['jsonl_stripped']:,.0f} / {st['lake_text']:,.0f} = {t_ratio:.1f}x", ">= 10x", met(t_ratio >= 10)))
            rows.append(("bytes/step total: JSONL+base64 / lake", name, f"{st['jsonl_b64']:,.0f} / {st['lake_total']:,.0f} = {a_ratio:.1f}x", ">= 4x", met(a_ratio >= 4)))
        else:
            st = s["storage_bytes_per_step"]
            rows.append(("bytes/step lake text / total", name, f"{st['lake_text']:,.0f} / {st['lake_total']:,.0f}", "", "-"))
            if largest_legacy:
                # the older pipeline is linear in steps (it reads every file); extrapolate per step
                ls = largest_legacy
                per_step_b64 = ls["build_seconds"]["jsonl_b64"]["median"] / ls["steps"]
                per_step_str = ls["build_seconds"]["jsonl_stripped"]["median"] / ls["steps"]
                lake_med = b["lake"]["median"]
                rows.append(("EXTRAPOLATED older build from " + label(ls["steps"]) + " (s)", name,
                             f"b64 {per_step_b64 * s['steps']:.0f} / stripped {per_step_str * s['steps']:.0f}", "", "-"))
                rows.append(("EXTRAPOLATED speed-up vs b64 / stripped (x)", name,
                             f"{per_step_b64 * s['steps'] / lake_med:.0f}x / {per_step_str * s['steps'] / lake_med:.0f}x", "", "-"))
                rows.append(("EXTRAPOLATED JSONL+base64 size (GB)", name, f"{ls['storage_bytes_per_step']['jsonl_b64'] * s['steps'] / 1e9:.0f}", "", "-"))
        rows.append(("compact (s)", name, f"{s['compact_seconds']:.1f}", "", "-"))
        q = s["query_cold_start_seconds"]
        is_1m = s["steps"] >= 1_000_000
        rows.append(("query cold start, whole process (s)", name, fmt_mmm(q), "<= 0.5 s at 1M" if is_1m else "", met(q["median"] <= 0.5) if is_1m else "-"))
        if s.get("query_heavy_imports"):
            rows.append(("heavy imports on the query path", name, ", ".join(s["query_heavy_imports"]), "none", "NO"))
        if "dashboard" in s:
            d = s["dashboard"]
            text = d.get("output_tail", "")
            found = {k: re.search(rf"{k}\s+(\d+) ms", text) for k in ("overview first render", "replay slider move")}
            fresh = re.search(r"imports included: (\d+) ms", text)
            if d.get("skipped"):
                rows.append(("dashboard first render", name, d["skipped"], "<= 3 s at 1M", "-"))
            elif found["overview first render"]:
                first = int(found["overview first render"].group(1)) / 1000
                rows.append(("dashboard first render, best of 3 (s)", name, f"{first:.2f}" + (f" (fresh process {int(fresh.group(1)) / 1000:.2f})" if fresh else ""), "<= 3 s at 1M", met(first <= 3.0) if s["steps"] >= 1_000_000 else "-"))
                if found["replay slider move"]:
                    rows.append(("dashboard replay slider move (s)", name, f"{int(found['replay slider move'].group(1)) / 1000:.2f}", "<= 0.3 s", "-"))
            else:
                rows.append(("dashboard first render", name, f"failed: {text[-100:]!r}", "<= 3 s at 1M", "NO"))
    wp = results.get("write_path")
    if wp:
        lake_us, jsonl_us = mmm(wp["lake_us_per_step"]), mmm(wp["jsonl_us_per_step"])
        ratio = mmm([a / b for a, b in zip(wp["jsonl_us_per_step"], wp["lake_us_per_step"])])
        n = f"{wp['steps']} steps, flush/{wp['flush_episodes']} ep"
        rows.append(("write path, lake EpisodeWriter (us/step)", n, fmt_mmm(lake_us, "", 1), "<= 60", met(lake_us["median"] <= 60)))
        rows.append(("write path, JSONL line per step (us/step)", n, fmt_mmm(jsonl_us, "", 1), "", "-"))
        rows.append(("write path: JSONL / lake (x)", n, fmt_mmm(ratio, "x", 1), ">= 3x", met(ratio["median"] >= 3)))
    ro = results.get("rollout")
    if ro:
        if ro.get("skipped"):
            rows.append(("MiniWoB rollout throughput", "-", ro["skipped"], ">= 10 steps/s/worker", "-"))
        else:
            for w, r in sorted(ro["workers"].items()):
                long = r["steps_per_second_per_worker_long"]
                who = {"1": "1 worker", "2": "2 workers", "2-unpinned": "2 unpinned workers"}.get(w, w)
                rows.append((f"MiniWoB rollout, {who}: steps/s per worker, episodes >= 5 steps", f"{r['long_episodes']} episodes",
                             fmt_mmm(long, "", 1), ">= 10", met(long["median"] >= 10)))
                rows.append((f"MiniWoB rollout, {who}: steps/s, whole run", f"{r['steps']} steps", fmt_mmm(r["steps_per_second"], "", 1), "", "-"))
            if ro.get("speedup_2_workers"):
                sp = mmm(ro.get("speedups_2_workers") or [ro["speedup_2_workers"]])  # older results hold one figure
                rows.append(("MiniWoB rollout, 2 workers / 1 worker (x)", "side by side", fmt_mmm(sp, "x", 2), ">= 1.5x", met(sp["median"] >= 1.5)))
                if ro.get("speedups_2_workers_unpinned"):
                    rows.append(("MiniWoB rollout, 2 unpinned workers / 1 worker (x)", "side by side", fmt_mmm(mmm(ro["speedups_2_workers_unpinned"]), "x", 2), "", "-"))
            if ro.get("lake_share"):
                ls = ro["lake_share"]
                rows.append(("lake's share of rollout wall time (sampler's count)", "all runs", fmt_mmm({**ls, "min": ls["min"] * 100, "median": ls["median"] * 100, "max": ls["max"] * 100}, "%", 2), "<= 2%", met(ls["median"] <= 0.02)))
            if wp and ro.get("step_seconds"):
                share = mmm([us / 1e6 / ro["step_seconds"] for us in wp["lake_us_per_step"]])
                rows.append(("lake's share of a rollout step (write path us / step time)", "1 worker", fmt_mmm({k: v * 100 if k != 'n' else v for k, v in share.items()}, "%", 2), "<= 2%", met(share["median"] <= 0.02)))
    return rows


def print_table(results: dict[str, Any], stream=sys.stdout) -> str:
    rows = table_rows(results)
    header = ("figure", "size", "min / median / max", "target", "met")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    m = results["machine"]
    lines.append(f"machine: {m['cpus']} CPUs, {m['memory_gib']} GiB, GPU: {'yes' if m['gpu'] else 'no'}, Python {m['python']}, load at start {m['load_average_at_start'][0]:.1f}")
    text = "\n".join(lines)
    print(text, file=stream)
    return text


def merge_results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table from several runs (e.g. the 1M size run on its own): sizes merged, later runs win."""
    merged = dict(runs[0])
    merged["sizes"] = {}
    for r in runs:
        merged["sizes"].update(r.get("sizes", {}))
        for key in ("write_path", "rollout"):
            if r.get(key):
                merged[key] = r[key]
    order = sorted(merged["sizes"].items(), key=lambda kv: kv[1]["steps"])
    merged["sizes"] = dict(order)
    return merged


# ---------------------------------------------------------------------- sanity check
def check() -> None:
    """A tiny end-to-end run of the harness that fails loudly if a piece is wrong."""
    with tempfile.TemporaryDirectory(prefix="halo-bench-check-") as tmp:
        w = Path(tmp)
        spec = SyntheticSpec(n_steps=1500, attempts_per_task=4, min_steps=5, max_steps=15, screenshot_size=(64, 40), seed=3)
        gen = generate(spec, w / "lake", w / "jsonl", w / "jsonl_stripped")
        assert gen.steps == 1500, gen
        assert 0.15 < gen.new_state_share < 0.45, gen
        assert len(list((w / "jsonl").glob("*.jsonl"))) == gen.episodes
        data, _, rss = run_measured(python_module("bench.lake_build", str(w / "lake"), str(w / "lake_out")))
        assert data["rows"]["bc_rows"] > 0 and data["rows"]["grpo_groups"] > 0 and data["rows"]["dpo_pairs"] > 0, data
        assert rss > 0, rss
        for src in ("jsonl", "jsonl_stripped"):
            legacy, _, _ = run_measured(python_module("bench.legacy_export", str(w / src), str(w / f"{src}_out")))
            cmp = compare_outputs(w / "lake_out", w / f"{src}_out")
            assert cmp["equal"], cmp["problems"]
            assert legacy["rows"] == data["rows"], (legacy["rows"], data["rows"])
        # the comparison must notice a difference: drop one bc row from the older output
        bc = (w / "jsonl_out" / "bc_rows.jsonl").read_text().splitlines(keepends=True)
        (w / "jsonl_out" / "bc_rows.jsonl").write_text("".join(bc[1:]))
        assert not compare_outputs(w / "lake_out", w / "jsonl_out")["equal"]
        wp = write_path.measure(300, 1)
        assert wp["lake_us_per_step"][0] > 0 and wp["jsonl_us_per_step"][0] > 0
    print("bench check passed: generator, lake build, older export, equality check and write path all work")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10k,100k,300k,1M", help="Comma-separated step counts (10k, 1M, ...).")
    ap.add_argument("--quick", action="store_true", help="10k steps, few repeats: under two minutes.")
    ap.add_argument("--check", action="store_true", help="Tiny sanity check of the harness; exits non-zero on a problem.")
    ap.add_argument("--repeats", type=int, default=3, help="Repeats per figure (2 at most from 300k steps for the dataset build).")
    ap.add_argument("--legacy-max-steps", default="300k", help="Largest size at which the older pipeline is run.")
    ap.add_argument("--write-steps", default="10k", help="Steps written in the write-path benchmark.")
    ap.add_argument("--flush-episodes", type=int, default=32, help="Episodes per writer flush in the write-path benchmark (the sampler's default).")
    ap.add_argument("--workdir", help="Where data sets are generated (default: a temporary folder).")
    ap.add_argument("--keep", action="store_true", help="Keep generated data sets.")
    ap.add_argument("--no-rollout", action="store_true", help="Skip the MiniWoB rollout benchmark.")
    ap.add_argument("--no-dashboard", action="store_true", help="Skip the dashboard benchmark.")
    ap.add_argument("--table", metavar="RESULTS_JSON", nargs="+",
                    help="Print the table of earlier runs and exit (several files: their sizes are merged, later files win).")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if a.table:
        print_table(merge_results([json.loads(Path(p).read_text()) for p in a.table]))
        return
    if a.check:
        check()
        return
    sizes = [parse_size(s) for s in ("10k" if a.quick else a.sizes).split(",") if s.strip()]
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="halo-bench-"))
    opts = Options(
        sizes=sizes,
        repeats=2 if a.quick and a.repeats == 3 else a.repeats,
        legacy_max_steps=parse_size(a.legacy_max_steps),
        workdir=workdir,
        keep=a.keep,
        write_steps=parse_size("3k" if a.quick else a.write_steps),
        flush_episodes=a.flush_episodes,
        quick=a.quick,
        rollout=not a.no_rollout,
        dashboard=not a.no_dashboard,
        argv=list(sys.argv[1:] if argv is None else argv),
    )
    try:
        results = Bench(opts).run()
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print_table(results)
    print(f"\nresults: {RESULTS / 'lake'}")


if __name__ == "__main__":
    main()
