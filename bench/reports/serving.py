"""HALO's chat server on constrained rollouts (`python -m bench serving`): two of its settings side by side, in
steps per second, and where a step's time goes: the cached scoring against the full one (one rollout worker),
and (`--compare batching`) the server batching requests against `--max-batch 1` (two rollout workers, or
`--workers`). Walks per forward: the choice walks one engine forward advanced, on average (continuous batching);
walk forwards per request: the forwards a request's walk needed (fewer with drafted walks)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table

HEADERS = ["server", "commit", "workers", "steps", "wall (s)", "steps/s", "ratio", "engine s/step", "other s/step",
           "prompt tokens prefilled", "requests batched", "walks per forward", "walk forwards per request", "solved", "load", "command"]
SPLIT = ("engine_prefill", "engine_draw", "server_http_json", "policy_client", "browser", "lake", "other", "wall")
SPLIT_HEADERS = ["prefill", "draw", "HTTP+JSON", "policy client", "browser", "lake", "other", "wall"]
# Results written before the batching comparison existed compare the scorings.
SCORING = {"full": ["--score-mode", "full"], "cached": ["--score-mode", "cached"]}


def report(results_dir: pathlib.Path) -> str:
    runs = load_runs(results_dir)
    rows = []
    for run in runs:
        loads = [x for r in run["rows"] for x in r["load_average"]]
        names = list(run["arms"])
        for arm in names:
            a = run["arms"][arm]
            options = " ".join(a.get("server_options", SCORING.get(arm, [])))
            prefilled = a["prefill_tokens"] / a["prompt_tokens"] if "--score-mode full" not in options else 1.0
            batched = f"{a['batched_requests']}/{a['requests']}" if "requests" in a else "–"
            rows.append([f"`{options}`" if options else "defaults (`--max-batch 8`)", run.get("commit", "–")[:7], run.get("workers", 1), a["steps"], round(a["wall_seconds"]),
                         round(a["steps_per_second"], 3), f"{names[1]} / {names[0]}: {run['ratio']:.2f}x",
                         round(a["engine_seconds_per_step"], 2), round(a["other_seconds_per_step"], 2),
                         f"{prefilled:.0%}", batched, round(a["walks_per_forward"], 2) if "walks_per_forward" in a else "–",
                         _walk_forwards_per_request(run, arm),
                         f"{a['successes']}/{a['episodes']}",
                         f"{min(loads):.0f}–{max(loads):.0f}", f"`{run['command']}`"])
    out = table(HEADERS, rows) + "\n" + "\n".join(f"- {provenance(r)}" for r in runs) + "\n"
    split_rows = []
    for run in runs:
        loads = [x for r in run["rows"] for x in r["load_average"]]
        for arm, a in run["arms"].items():
            if "split_seconds_per_step" not in a:  # results from before the split was measured
                continue
            sp = a["split_seconds_per_step"]
            options = " ".join(a.get("server_options", [])) or "defaults"
            split_rows.append([f"`{options}`", run.get("workers", 1), a["steps"], round(a["steps_per_second"], 2),
                               *(round(sp[k] * 1000) for k in SPLIT), f"{min(loads):.0f}–{max(loads):.0f}",
                               f"`{run['command']}`"])
    if split_rows:
        out += ("\nWhere a step's time goes, ms per step (workers x wall seconds / steps where several workers share "
                "the wall): the engine's prefill and draw (the server's engine thread), the server's HTTP and JSON "
                "(a timing proxy's round trips less the engine), the policy client (its calls less the round trips), "
                "the browser (`env_ms`), the lake (the sampler's count) and the rest. Target: >= 3 steps/s on an idle "
                "machine.\n\n")
        out += table(["server", "workers", "steps", "steps/s", *SPLIT_HEADERS, "load", "command"], split_rows)
    return out


def _walk_forwards_per_request(run: dict, arm: str) -> str:
    """Forwards a request's choice walk took on average: from each of the arm's rows, where the server counted them
    (each batched forward counts once per walk it advanced)."""
    mine = [r for r in run["rows"] if r["arm"] == arm and "walk_rows" in r]
    requests = sum(r["requests"] for r in mine)
    return f"{sum(r['walk_rows'] for r in mine) / requests:.2f}" if requests else "–"
