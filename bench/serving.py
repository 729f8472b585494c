"""HALO's chat server serving constrained rollouts, two of its settings side by side, in steps per second:
the scoring before (``--score-mode full``) against the cached one, or (``--compare batching``) rollouts with two
workers (``--workers``) against the server that batches guided choices continuously and against the same server
running each request alone (``--max-batch 1``), or (``--compare kernel``) the model's linear layers on torch's
kernel against oneDNN's (``--linear-kernel``), or (``--compare threads``) the engine on two torch threads against
one (``--threads``).

    .venv/bin/python -m bench serving                     # SmolLM2-135M-Instruct, click-button/tab/link, ~10 min on 2 cores
    .venv/bin/python -m bench serving --tasks click-button --task-seeds 1 --rollouts-per-task 1   # a quick look
    .venv/bin/python -m bench serving --compare batching --tasks click-button,click-tab   # --workers 2, ~6 min

Both servers run the same model (``python -m halo_agent.chat_server``, each with its arm's options); each task's
rollouts (``halo-agent rollout --policy openai --policy-option constrain_actions=true --observation elements``,
the same task seeds, attempts and policy seed) run against one server, then the other, the order swapped from
task to task, so load on the machine falls on both arms alike. Per arm: steps / the rollouts' wall seconds,
and where a step's time goes (``split``): the engine's prefill and draw (its ``/metrics``, the prefills timed by
the wrapper ``timed_server``), the server's HTTP and JSON (a timing proxy between rollout and server), the policy
client, the browser (``env_ms``), the lake (the sampler's count) and the rest. The result is written to
``bench/results/serving/<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Per comparison: its arms (the server's options for each; the second arm's steps/s over the first's is the
# ratio) and the rollouts' parallel workers.
COMPARISONS = {
    "scoring": {"arms": {"full": ["--score-mode", "full"], "cached": ["--score-mode", "cached"]}, "workers": 1},
    "batching": {"arms": {"max-batch-1": ["--max-batch", "1"], "batched": []}, "workers": 2},
    "kernel": {"arms": {"torch": ["--linear-kernel", "torch"], "onednn": ["--linear-kernel", "onednn"]}, "workers": 2},
    "threads": {"arms": {"2-threads": ["--threads", "2"], "1-thread": ["--threads", "1"]}, "workers": 2},
}


def start_server(model: str, options: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    # The chat server as `python -m halo_agent.chat_server` runs it, with its prompt prefills timed (timed_server)
    command = [sys.executable, "-m", "bench.serving", "--timed-server", "--model", model, "--served-model-name", "policy",
               "--port", "0", *options, "--parent-pid", str(os.getpid())]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    line = proc.stdout.readline()
    if " at " not in line:
        proc.kill()
        raise SystemExit(f"Error: the chat server ({shlex.join(options) or 'its defaults'}) did not start; see {log_path}")
    return proc, line.split(" at ", 1)[1].split()[0]


PREFILL_METRIC = "halo_bench_prefill_seconds_total"


def timed_server(argv: list[str]) -> int:
    """``halo_agent.chat_server``'s main with the seconds spent prefilling prompts (the prompt cache's prefill and
    prefill_many) added to its /metrics as ``halo_bench_prefill_seconds_total``: the engine's time splits into
    prefill and the rest (scoring and drawing the choices), measured without changing the server."""
    import threading
    import time

    from halo_agent import chat_server
    from halo_agent.policies import prefix_cache

    spent = {"seconds": 0.0}
    lock = threading.Lock()

    def timed(method):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                with lock:
                    spent["seconds"] += time.perf_counter() - started
        return wrapper

    for name in ("prefill", "prefill_many"):
        setattr(prefix_cache.PromptCache, name, timed(getattr(prefix_cache.PromptCache, name)))
    plain_metrics = chat_server.ChatCompletionServer.metrics
    chat_server.ChatCompletionServer.metrics = lambda self: plain_metrics(self) + f"{PREFILL_METRIC} {spent['seconds']:.6f}\n"
    return chat_server.main(argv)


class TimingProxy:
    """A reverse proxy on loopback between the rollout and the chat server: the seconds from each request
    forwarded to its answer read back (the server's HTTP, JSON and engine), and the requests."""

    def __init__(self, upstream: str) -> None:
        import http.client
        import threading
        import time
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        target = urllib.parse.urlparse(upstream)
        self.seconds, self.requests = 0.0, 0
        lock, local = threading.Lock(), threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
                started = time.perf_counter()
                if getattr(local, "conn", None) is None:
                    local.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
                try:
                    local.conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = local.conn.getresponse()
                    data = answer.read()
                except (OSError, http.client.HTTPException):
                    local.conn.close()
                    local.conn = None
                    raise
                with lock:
                    proxy.seconds += time.perf_counter() - started
                    proxy.requests += 1
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("connection", "content-length", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{target.path}"

    def take(self) -> tuple[float, int]:
        """(seconds, requests) since the last call."""
        seconds, requests = self.seconds, self.requests
        self.seconds, self.requests = 0.0, 0
        return seconds, requests

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def step_times(lake: Path, run_id: str) -> dict[str, float]:
    """The run's steps, and the seconds its policy calls (latency_ms) and environment steps (env_ms) took in all."""
    from halo_data.lake import Lake

    rows = Lake.open(str(lake)).query_arrow(
        "select count(*) as steps, sum(latency_ms) / 1000 as policy, sum(env_ms) / 1000 as env from steps where run_id = $r",
        {"r": run_id}).to_pylist()
    return {k: float(v or 0.0) for k, v in rows[0].items()}


def split(rows: list[dict]) -> dict[str, float]:
    """Where a step's wall time went, in seconds per step, over ``rows`` (the rollouts of one arm):
    engine prefill and draw (the server's engine thread), the server's HTTP and JSON (the proxy's round trips
    less the engine), the policy client (its calls less the round trips: prompt, request, parsing), the browser
    (env_ms), the lake (the sampler's own count of its writes) and the rest (resets, episode starts, workers)."""
    steps = sum(r["steps"] for r in rows) or 1
    workers = max(r.get("workers", 1) for r in rows)
    # several workers: the workers' seconds run side by side, so they are shares of workers x wall seconds
    wall = sum(r["wall_seconds"] for r in rows) * workers
    engine = sum(r["engine_seconds"] for r in rows)
    prefill = sum(r["prefill_seconds"] for r in rows)
    round_trips = sum(r["round_trip_seconds"] for r in rows)
    policy = sum(r["policy_seconds"] for r in rows)
    browser = sum(r["env_seconds"] for r in rows)
    lake = sum(r["lake_seconds"] for r in rows)
    out = {"engine_prefill": prefill, "engine_draw": engine - prefill, "server_http_json": round_trips - engine,
           "policy_client": policy - round_trips, "browser": browser, "lake": lake}
    out["other"] = wall - sum(out.values())
    return {k: v / steps for k, v in out.items()} | {"wall": wall / steps}


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/metrics", timeout=30) as r:
        return {name: float(value) for name, value in (line.split() for line in r.read().decode().splitlines() if line)}


def rollout(args: argparse.Namespace, task: str, url: str, lake: Path, run_id: str, workers: int) -> tuple[dict, list[str]]:
    command = [str(ROOT / ".venv" / "bin" / "halo-agent"), "rollout", "--env", "miniwob", "--tasks", task,
               "--task-seed", str(args.task_seed), "--task-seeds", str(args.task_seeds),
               "--rollouts-per-task", str(args.rollouts_per_task), "--max-steps", str(args.max_steps),
               "--temperature", str(args.temperature), "--seed", str(args.seed), "--policy", "openai", "--model", "policy",
               "--policy-option", "constrain_actions=true", "--observation", "elements",
               "--workers", str(workers), "--lake", str(lake), "--run-id", run_id, "--json", "--no-progress"]
    env = {**os.environ, "HALO_VLLM_URL": url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"Error: rollout of {task} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), command


def client_latency_ms(lake: Path, run_id: str) -> float:
    from halo_data.lake import Lake

    rows = Lake.open(str(lake)).query_arrow(f"select avg(latency_ms) ms from steps where run_id = '{run_id}'").to_pylist()
    return float(rows[0]["ms"] or 0.0)


def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["--timed-server"]:
        sys.exit(timed_server((sys.argv[1:] if argv is None else argv)[1:]))
    parser = argparse.ArgumentParser(prog="python -m bench serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or known name")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="scoring",
                        help="scoring: --score-mode full against cached, one rollout worker | batching: --max-batch 1 "
                             "against the batching server, two rollout workers | kernel: the linear layers on torch's "
                             "kernel against oneDNN, two rollout workers | threads: the engine on 2 torch threads "
                             "against 1, two rollout workers")
    parser.add_argument("--tasks", default="click-button,click-tab,click-link")
    parser.add_argument("--task-seed", type=int, default=200000)
    parser.add_argument("--task-seeds", type=int, default=2)
    parser.add_argument("--rollouts-per-task", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="parallel rollout workers against each server (default: the comparison's, 1 or 2)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    argv = sys.argv[2:] if argv is None else argv

    comparison = COMPARISONS[args.compare]
    arm_options, workers = comparison["arms"], args.workers or comparison["workers"]
    order = tuple(arm_options)  # the ratio is the second arm's steps/s over the first's
    work = Path(tempfile.mkdtemp(prefix="halo-bench-serving-"))
    servers = {arm: start_server(args.model, arm_options[arm], work / f"server-{arm}.log") for arm in order}
    proxies = {arm: TimingProxy(servers[arm][1]) for arm in order}
    rows = []
    try:
        for k, task in enumerate(args.tasks.split(",")):
            for arm in (order if k % 2 == 0 else order[::-1]):
                _, url = servers[arm]
                before, load_before = metrics(url), os.getloadavg()[0]
                proxies[arm].take()
                summary, command = rollout(args, task, proxies[arm].url, work / f"lake-{arm}", f"{arm}-{task}", workers)
                round_trips, proxied = proxies[arm].take()
                after = metrics(url)
                engine = {name: after[name] - before.get(name, 0.0) for name in after}
                times = step_times(work / f"lake-{arm}", f"{arm}-{task}")
                rows.append({
                    "arm": arm, "task": task, "steps": summary["steps"], "successes": summary["successes"],
                    "episodes": summary["episodes_written"], "wall_seconds": summary["wall_seconds"],
                    "steps_per_second": summary["steps"] / summary["wall_seconds"],
                    "engine_seconds": engine["halo_chat_engine_seconds_total"],
                    "requests": int(engine["halo_chat_requests_total"]),
                    "prompt_tokens": int(engine["halo_chat_prompt_tokens_total"]),
                    "prefill_tokens": int(engine["halo_chat_prefill_tokens_total"]),
                    "prefix_cache_hit_tokens": int(engine["halo_chat_prefix_cache_hit_tokens_total"]),
                    "batched_requests": int(engine.get("halo_chat_batched_requests_total", 0)),
                    "engine_batches": int(engine.get("halo_chat_engine_batches_total", 0)),
                    "walk_forwards": int(engine.get("halo_chat_walk_forwards_total", 0)),
                    "walk_rows": int(engine.get("halo_chat_walk_rows_total", 0)),
                    "client_latency_ms": client_latency_ms(work / f"lake-{arm}", f"{arm}-{task}"),
                    "workers": workers, "prefill_seconds": engine.get(PREFILL_METRIC, 0.0),
                    "round_trip_seconds": round_trips, "proxied_requests": proxied,
                    "policy_seconds": times["policy"], "env_seconds": times["env"],
                    "lake_seconds": (summary.get("lake_share") or 0.0) * summary["wall_seconds"],
                    "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                    "rollout_command": shlex.join(command[1:]).replace(str(work), "$WORK"),
                })
                r = rows[-1]
                print(f"{arm:>6} {task:<12} {r['steps']:>3} steps {r['wall_seconds']:7.1f} s {r['steps_per_second']:5.2f} steps/s "
                      f"engine {r['engine_seconds'] / max(r['steps'], 1):5.2f} s/step  load {r['load_average']}", flush=True)
    finally:
        for proxy in proxies.values():
            proxy.close()
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)  # the lakes and server logs; kept where a run failed

    arms = {}
    for arm in order:
        mine = [r for r in rows if r["arm"] == arm]
        steps, wall = sum(r["steps"] for r in mine), sum(r["wall_seconds"] for r in mine)
        engine = sum(r["engine_seconds"] for r in mine)
        arms[arm] = {"steps": steps, "wall_seconds": round(wall, 2), "steps_per_second": steps / wall,
                     "successes": sum(r["successes"] for r in mine), "episodes": sum(r["episodes"] for r in mine),
                     "engine_seconds_per_step": engine / steps, "other_seconds_per_step": (wall - engine) / steps,
                     "prompt_tokens": sum(r["prompt_tokens"] for r in mine), "prefill_tokens": sum(r["prefill_tokens"] for r in mine),
                     "prefix_cache_hit_tokens": sum(r["prefix_cache_hit_tokens"] for r in mine),
                     "requests": sum(r["requests"] for r in mine), "batched_requests": sum(r["batched_requests"] for r in mine),
                     "walks_per_forward": (sum(r.get("walk_rows", 0) for r in mine) / max(sum(r.get("walk_forwards", 0) for r in mine), 1)),
                     "server_options": arm_options[arm], "split_seconds_per_step": split(mine)}
    ratio = arms[order[1]]["steps_per_second"] / arms[order[0]]["steps_per_second"]
    for arm, a in arms.items():
        print(f"{arm:>6}: {a['steps']} steps in {a['wall_seconds']:.1f} s = {a['steps_per_second']:.2f} steps/s; per step "
              f"{a['engine_seconds_per_step']:.2f} s in the engine, {a['other_seconds_per_step']:.2f} s elsewhere; "
              f"{a['successes']}/{a['episodes']} solved; {a['batched_requests']}/{a['requests']} requests batched with others, "
              f"{a['walks_per_forward']:.2f} walks per forward")
    for arm, a in arms.items():
        print(f"{arm:>6} per step: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in a["split_seconds_per_step"].items()))
    print(f"{order[1]} / {order[0]}: {ratio:.2f}x, rollouts with {workers} worker(s) "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if args.no_save:
        return
    from bench.reports import save

    out = save("serving", {"model": args.model, "compare": args.compare, "workers": workers, "arms": arms, "ratio": ratio,
                           "rows": rows}, argv)
    print(f"wrote {out.relative_to(ROOT)}")

if __name__ == "__main__":
    main()
