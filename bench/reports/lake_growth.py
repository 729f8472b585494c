"""An online iteration's cost as the lake grows (`python -m bench lake-growth`): one column per lake size."""

from __future__ import annotations

import pathlib
import statistics

from bench.reports import load_runs, provenance, table

VIEWS = ("grpo_groups", "bc_rows", "dpo_pairs", "state_groups")


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.1f} GiB"


def report(results_dir: pathlib.Path) -> str:
    out = []
    for run in load_runs(results_dir):
        sizes = sorted(run["sizes"].items(), key=lambda kv: kv[1]["steps"])
        names = [name for name, _ in sizes]
        spec = run["spec"]
        largest = names[-1]
        rows: list[list] = []

        load = max(s["load_average_before"][0] for _, s in sizes)

        def row(figure: str, values: list, target: str = "", met: str = "-", load: float = load, rows: list = rows) -> None:
            if met != "-" and load > 3:  # a figure measured on a busy machine meets nothing without saying so
                met += f", at load {load}"
            rows.append([figure, *values, target, met])

        row("steps / runs in the lake", [f"{s['steps']:,} / {s['runs']:,}" for _, s in sizes])
        row("files: steps / candidates / screenshots / runs",
            [" / ".join(str(s["tables"][t]["files"]) for t in ("steps", "candidates", "screenshots", "runs")) for _, s in sizes])
        row("on disk (all versions kept until vacuum)", [_mib(sum(s["disk_bytes"].values())) for _, s in sizes])
        row("new run: steps / files a run-scoped read lists (steps + candidates)",
            [f"{s['probe']['steps']:,} / {s['reads']['files']['steps']['listed'] + s['reads']['files']['candidates']['listed']}"
             for _, s in sizes])
        row("new run appended: steps, candidates, screenshots, runs row (s)",
            [f"{s['probe_append_s']:.2f}" if s["probe_append_s"] is not None else "-" for _, s in sizes])
        for view in VIEWS:
            first = sizes[0][1]["reads"]["views"][view]
            ratio_wall = _med(sizes[-1][1]["reads"]["views"][view]["seconds"]) / _med(first["seconds"])
            ratio_cpu = _med(sizes[-1][1]["reads"]["views"][view]["cpu_s"]) / _med(first["cpu_s"])
            row(f"{view} of the new run, run-scoped: wall / CPU s (rows)",
                [f"{_med(s['reads']['views'][view]['seconds']):.2f} / {_med(s['reads']['views'][view]['cpu_s']):.2f} "
                 f"({s['reads']['views'][view]['rows']:,})" for _, s in sizes],
                f"{largest}/{names[0]} <= 1.5x", f"{'yes' if ratio_wall <= 1.5 else 'NO'} (wall {ratio_wall:.2f}x, CPU {ratio_cpu:.2f}x)")
        if all("requests" in s["reads"] for _, s in sizes):
            others = sum(s["reads"]["requests"]["other_runs_data"] for _, s in sizes)
            row("S3 GET/HEAD requests of the reads: the run's data / shared with other runs (compacted) / other runs' / "
                "tables without run_id / logs",
                [" / ".join(str(s["reads"]["requests"].get(k, "-"))
                            for k in ("run_data", "shared_data", "other_runs_data", "unpartitioned_data", "log"))
                 for _, s in sizes], "no other run's file", "yes" if others == 0 else "NO")
        cold = _med(sizes[-1][1]["query_cold_start_s"])
        row("`halo-data query \"select count(*) from steps\"`, whole process: wall / CPU s",
            [f"{_med(s['query_cold_start_s']):.2f} / {_med(s['query_cold_start_cpu_s']):.2f}" for _, s in sizes],
            f"<= 0.5 s at {largest}", "yes" if cold <= 0.5 else "NO")
        if all("dashboard" in s for _, s in sizes):
            render = sizes[-1][1]["dashboard"]["overview_first_render_s"]
            row("dashboard Overview, first render on cold caches, best of 2 (s)",
                [f"{s['dashboard']['overview_first_render_s']:.2f}" for _, s in sizes], f"<= 3 s at {largest}",
                "yes" if render <= 3 else "NO")
        if all("full_build" in s for _, s in sizes):
            builds = [s["full_build"] for _, s in sizes]
            row("lake-wide build of bc_rows, dpo_pairs, grpo_groups (s)",
                [f"{b['seconds']:.1f}" if "seconds" in b else
                 f"stopped after {b['seconds_before_stop']} s: {b['stopped']}" if "stopped" in b else "failed" for b in builds])
            # the process's own memory (Python, Arrow, delta-rs) is the smallest lake's RSS; DuckDB's is the rest
            base = builds[0].get("peak_rss_kb", 0) / 2**20
            rss = [b["peak_rss_kb"] / 2**20 if "peak_rss_kb" in b else None for b in builds]
            limit = run.get("memory_limit_gb") or 1.0
            ok = all("seconds" in b for b in builds) and all(r is not None and r - base <= limit for r in rss)
            if not ok and all("seconds" in b or "stopped" in b for b in builds):
                ok = None  # a build stopped by hand neither failed nor finished
            row(f"its peak RSS (GB); above the {names[0]} build's, DuckDB memory limit {limit:g} GB",
                [f"{r:.2f}; {r - base:+.2f}" if r is not None else
                 f"{b['rss_seen_kb'] / 2**20:.2f}; {b['rss_seen_kb'] / 2**20 - base:+.2f} (RSS when stopped)" if "rss_seen_kb" in b
                 else "-" for r, b in zip(rss, builds)],
                "above the smallest <= the limit, never failing",
                "yes" if ok else "not finished (stopped)" if ok is None else "NO")
        row("read process peak RSS (GB)", [f"{s['reads']['peak_rss_kb'] / 2**20:.2f}" for _, s in sizes])
        compactions = [s["growth"]["maintenance"] for _, s in sizes]
        row("compact + vacuum every " + str(run["campaign"]["compact_every"]) + " runs, last one (s)",
            [f"{m[-1]['compact_s'] + m[-1]['vacuum_s']:.1f}" if m else "-" for m in compactions])
        row("load average (1 min) before / after measuring",
            [f"{s['load_average_before'][0]} / {s['load_average_after'][0]}" for _, s in sizes])
        out.append(f"`{run['command']}` ({provenance(run)}). The lake: runs of {spec['run_steps']:,} steps "
                   f"({spec['attempts_per_task']} attempts per task), screenshots on {spec['screenshot_share']:.0%} of the "
                   f"steps, {spec['candidates_per_state']} scored candidates at {spec['candidate_share']:.0%} of them, "
                   f"{spec['commits_per_run']} commits per run. Wall seconds move with the load; CPU seconds much less.\n")
        out.append(table(["figure", *names, "target", "met"], rows))
    return "\n".join(out)
