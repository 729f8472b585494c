"""The whole test suite's wall time (`python -m bench suite-time`): the README's test command, with the load beside it."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        for r in run["runs"]:
            minutes, seconds = divmod(round(r["wall_seconds"]), 60)
            rows.append([run["date"], run["commit"], "yes" if run["fresh_clone"] else "no", run["machine"]["cores"],
                         str(r["workers"]), f"{minutes} min {seconds:02d} s",
                         f"{r['cpu_seconds']:.0f}" if "cpu_seconds" in r else "—", r["passed"], r["failed"] + r["errors"],
                         f"{r['load_before'][0]} → {r['load_after'][0]}", f"`{run['command']}`"])
    slowest = runs[-1]["runs"][-1]["slowest"][:5] if runs else []
    lines = "\n".join(f"- {provenance(r)}" for r in runs)
    for run in runs:
        for r in run["runs"]:
            if r.get("not_passed"):
                lines += f"\n- did not pass on {run['date']} ({r['workers']} workers): " + "; ".join(
                    f"`{t.split()[1].split('::')[-1].split('@')[0]}`" for t in r["not_passed"])
    counted = [(run, r) for run in runs for r in run["runs"] if r.get("cpu_by_module")]
    if counted:
        run, r = counted[-1]
        lines += (f"\n- CPU by test module in the last run counted with `--cpu-by-test` ({run['date']}, "
                  f"{r['counted_cpu_seconds']:.0f} CPU-s with every process the tests started): " + "; ".join(
                      f"{m['module'].removeprefix('tests/')} {m['cpu_seconds']:.0f}" for m in r["cpu_by_module"][:8]))
    if slowest:
        lines += "\n- slowest in the last run: " + "; ".join(
            f"{s['seconds']:.0f} s {s['test'].split('::')[-1].split('@')[0]}" for s in slowest)
    return table(["date", "commit", "fresh clone", "cores", "workers", "wall", "CPU-s", "passed", "failed", "load (1 min) before → after",
                  "command"], rows) + "\n" + lines + "\n"
