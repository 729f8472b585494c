"""Dashboard benchmark: first render of Overview and one replay slider move on a large lake.

    .venv/bin/python bench/bench_dashboard.py                 # 1M steps (targets: 3 s, 300 ms)
    .venv/bin/python bench/bench_dashboard.py --steps 100000 --lake /tmp/halo-bench-lake

The lake is generated once (synthetic episodes appended in large batches through
``Lake.append``, the writers' fast path) and reused when ``--lake`` already holds
one of the requested size. Renders run the real app through Streamlit's AppTest,
so the measured time is the script run a browser would wait for, on cold caches.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from halo_data import ids
from halo_data import schema as S
from halo_data.config import RewardWeights
from halo_data.lake import Lake
from halo_data.writer import Screenshot, screenshots_table

log = logging.getLogger("bench_dashboard")

OVERVIEW_TARGET_S = 3.0
SLIDER_TARGET_S = 0.3
APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"

SITES = ("gomail", "gocalendar", "omnizon", "dashdish", "miniwob")
RUNS = (
    ("bench-eval-base", "eval", "base", "real", "v0"),
    ("bench-eval-bc", "eval", "bc", "real", "bc-1"),
    ("bench-rollout-0", "rollout", "explore", "miniwob", "v0"),
    ("bench-rollout-1", "rollout", "explore", "miniwob", "grpo-1"),
)


def _png(rng: np.random.Generator, width: int = 320, height: int = 200) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(180, 256, 3)))
    pen = ImageDraw.Draw(img)
    for _ in range(6):
        x, y = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 20))
        pen.rectangle([x, y, x + 60, y + 20], fill=tuple(int(v) for v in rng.integers(0, 200, 3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def build_bench_lake(root: str | Path, steps: int, images: int = 500, batch_steps: int = 250_000, seed: int = 0) -> Lake:
    """A lake of about ``steps`` synthetic steps in episodes of 5–35 steps over 4 runs."""
    rng = np.random.default_rng(seed)
    lake = Lake.init(str(root))
    weights = RewardWeights().as_dict()
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)

    shots = [_png(rng) for _ in range(images)]
    hashes = [ids.image_hash(b) for b in shots]
    lake.append("screenshots", screenshots_table([Screenshot(h, b, "png", 320, 200) for h, b in zip(hashes, shots)], t0))
    lake.upsert_runs(
        [
            {"run_id": r, "kind": k, "mode": m, "env": e, "policy": "openai", "model": "qwen-bench",
             "policy_version": v, "status": "finished", "started_at": t0, "ended_at": t0 + dt.timedelta(days=1)}
            for r, k, m, e, v in RUNS
        ]
    )
    hash_array = np.array(hashes, dtype=object)
    observations = np.array([f"[{i}] button 'Action {i}'\n[{i + 1}] textbox 'Search'" for i in range(64)], dtype=object)
    written = 0
    episode_counter = 0
    while written < steps:
        n = min(batch_steps, steps - written)
        lengths = rng.integers(5, 36, size=n // 5 + 1)
        lengths = lengths[np.cumsum(lengths) <= n]
        if lengths.size == 0:
            lengths = np.array([n])
        n_rows = int(lengths.sum())
        n_eps = lengths.size
        ep_index = np.repeat(np.arange(n_eps), lengths)
        step_idx = np.arange(n_rows) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        run_of_ep = rng.integers(0, len(RUNS), n_eps)
        task_of_ep = rng.integers(0, 60, n_eps)
        seed_of_ep = rng.integers(0, 5, n_eps)
        success_of_ep = rng.random(n_eps) < 0.35
        start_of_ep = np.array([t0 + dt.timedelta(seconds=int(s)) for s in rng.integers(0, 86_400, n_eps)], dtype=object)
        episode_ids = []
        for i in range(n_eps):
            run = RUNS[run_of_ep[i]][0]
            episode_ids.append(ids.episode_id(run, f"task-{task_of_ep[i]}", int(seed_of_ep[i]), episode_counter + i))
        episode_counter += n_eps
        episode_ids_arr = np.array(episode_ids, dtype=object)
        is_last = np.zeros(n_rows, dtype=bool)
        is_last[np.cumsum(lengths) - 1] = True
        r_progress = rng.random(n_rows) * 0.1
        r_novelty = (rng.random(n_rows) < 0.5).astype(float)
        r_loop = -(rng.random(n_rows) < 0.1).astype(float)
        r_validity = np.where(rng.random(n_rows) < 0.95, 0.0, -1.0)
        r_success = np.where(is_last & np.repeat(success_of_ep, lengths), 1.0, 0.0)
        reward = (weights["progress"] * r_progress + weights["novelty"] * r_novelty + weights["loop"] * r_loop
                  + weights["validity"] * r_validity + weights["success"] * r_success)
        runs_rows = np.array([r[0] for r in RUNS], dtype=object)[run_of_ep]
        envs = np.array([r[3] for r in RUNS], dtype=object)[run_of_ep]
        sites = np.array(SITES, dtype=object)[task_of_ep % len(SITES)]
        sites = np.where(envs == "miniwob", "miniwob", np.where(sites == "miniwob", "gomail", sites))
        obs_idx = rng.integers(0, len(observations), n_rows)
        actions = np.array([f"click('{i}')" for i in range(64)], dtype=object)[obs_idx]
        started = np.repeat(start_of_ep, lengths)
        table = pa.table(
            {
                "run_id": runs_rows[ep_index],
                "env": envs[ep_index],
                "episode_id": episode_ids_arr[ep_index],
                "task_id": np.char.add("task-", task_of_ep.astype(str)).astype(object)[ep_index],
                "site": sites[ep_index],
                "mode": np.array([r[2] for r in RUNS], dtype=object)[run_of_ep][ep_index],
                "policy": np.full(n_rows, "openai", dtype=object),
                "model": np.full(n_rows, "qwen-bench", dtype=object),
                "policy_version": np.array([r[4] for r in RUNS], dtype=object)[run_of_ep][ep_index],
                "attempt_idx": pa.array(np.zeros(n_rows, dtype=np.int32)),
                "task_seed": seed_of_ep[ep_index],
                "success": np.repeat(success_of_ep, lengths),
                "task_reward": np.repeat(success_of_ep.astype(float), lengths),
                "n_steps": pa.array(np.repeat(lengths, lengths).astype(np.int32)),
                "terminated": np.repeat(success_of_ep, lengths),
                "truncated": np.repeat(~success_of_ep, lengths),
                "started_at": pa.array(list(started), S.TS),
                "ended_at": pa.array(list(started), S.TS),
                "step_idx": pa.array(step_idx.astype(np.int32)),
                "url": np.full(n_rows, "http://localhost/app", dtype=object),
                "goal": np.full(n_rows, "Do the bench task", dtype=object),
                "observation": observations[obs_idx],
                "screenshot_hash": hash_array[rng.integers(0, images, n_rows)],
                "prompt": np.full(n_rows, json.dumps([{"role": "user", "content": "Next action:"}]), dtype=object),
                "model_output": actions,
                "action": actions,
                "action_source": np.full(n_rows, "model", dtype=object),
                "action_valid": r_validity == 0.0,
                "r_progress": r_progress,
                "r_novelty": r_novelty,
                "r_loop": r_loop,
                "r_validity": r_validity,
                "r_success": r_success,
                "reward": reward,
                "cumulative_progress": np.minimum(1.0, (step_idx + 1) / 30.0),
                "state_hash": np.char.add("s", obs_idx.astype(str)).astype(object),
                "is_last": is_last,
            }
        )
        lake.append("steps", table)
        written += n_rows
        log.info("wrote %d / %d steps", written, steps)
    return lake


def _fresh_app(lake_root: str):
    from streamlit.testing.v1 import AppTest

    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    os.environ["HALO_LAKE"] = lake_root
    return AppTest.from_file(str(APP), default_timeout=120)


def measure(lake_root: str, repeats: int = 3) -> dict[str, float]:
    """Seconds for a first render of Overview on cold caches (best of ``repeats`` new sessions;
    the first one also pays this process's imports, as a freshly started server does), and the
    median of replay slider moves."""
    overview = []
    for _ in range(repeats):
        app = _fresh_app(lake_root)
        t = time.perf_counter()
        app.run()
        overview.append(time.perf_counter() - t)
        if len(app.exception):
            raise RuntimeError(f"Overview failed: {app.exception[0].value}")
    app.switch_page("app_pages/replay.py").run()
    if len(app.exception):
        raise RuntimeError(f"Replay failed: {app.exception[0].value}")
    slider = app.slider(key="replay_step")
    moves = []
    for value in range(1, min(6, int(slider.max) + 1)):
        t = time.perf_counter()
        app.slider(key="replay_step").set_value(value).run()
        moves.append(time.perf_counter() - t)
    return {
        "overview_first_render_s": min(overview),
        "overview_first_render_fresh_process_s": overview[0],
        "replay_slider_move_s": float(np.median(moves)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="Steps in the generated lake.")
    parser.add_argument("--lake", help="Where to build (or reuse) the lake; default: a temporary folder, removed after.")
    parser.add_argument("--repeats", type=int, default=3, help="Cold Overview renders to take the best of.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("streamlit").setLevel(logging.ERROR)

    tmp = None
    root = args.lake
    if root is None:
        tmp = tempfile.mkdtemp(prefix="halo-bench-lake-")
        root = tmp
    try:
        existing = 0
        if (Path(root) / "meta" / "info.json").exists():
            existing = int(Lake.open(root).query_arrow("select count(*) as n from steps", views=False)["n"][0].as_py())
        if existing < args.steps * 0.9:
            if existing:
                shutil.rmtree(root)
            t = time.perf_counter()
            build_bench_lake(root, args.steps)
            log.info("built a lake of %d steps in %.1fs at %s", args.steps, time.perf_counter() - t, root)
        results = measure(root, repeats=args.repeats)
        rows = [
            ("overview first render", results["overview_first_render_s"], OVERVIEW_TARGET_S),
            ("replay slider move", results["replay_slider_move_s"], SLIDER_TARGET_S),
        ]
        print(f"lake: {root} ({args.steps:,} steps)")
        for name, seconds, target in rows:
            print(f"{name:24s} {seconds * 1000:8.0f} ms   target {target * 1000:5.0f} ms   ratio {seconds / target:5.2f}")
        print(f"(overview in a fresh process, imports included: {results['overview_first_render_fresh_process_s'] * 1000:.0f} ms)")
        sys.exit(0 if all(s <= t for _, s, t in rows) else 1)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
