"""Write path: the lake's EpisodeWriter (batched flush) vs appending one JSONL line per step.

Both write the same pre-generated episodes, screenshots included; the older path
encodes each step's screenshot as base64 and flushes its line as the step ends
(so a crash keeps the steps done), the lake buffers whole episodes and commits
every ``flush_episodes`` episodes.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from pathlib import Path

from bench.generate import legacy_records
from halo_data.lake import Lake
from halo_data.synthetic import SyntheticEpisode, SyntheticSpec, generate_episodes
from halo_data.writer import EpisodeWriter


def episodes_in_memory(n_steps: int, seed: int = 1) -> list[SyntheticEpisode]:
    return list(generate_episodes(SyntheticSpec(n_steps=n_steps, seed=seed, run_id=f"write-path-{seed}")))


def lake_write_seconds(episodes: list[SyntheticEpisode], root: Path, flush_episodes: int = 8) -> dict:
    lake = Lake.init(str(root))
    t0 = time.perf_counter()
    with EpisodeWriter(lake, flush_episodes=flush_episodes, flush_seconds=3600) as writer:
        for ep in episodes:
            writer.write_episode(ep.episode, ep.steps, ep.screenshots)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "flushes": len(writer.flushes), "flush_seconds": sum(f.seconds for f in writer.flushes)}


def jsonl_write_seconds(episodes: list[SyntheticEpisode], folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    t0 = time.perf_counter()
    for ep in episodes:
        for s in ep.screenshots:
            images[s.hash] = s.image
        # the records carry base64 screenshots; encoding them is part of the older path's per-step cost
        records = legacy_records(ep, None)
        with open(folder / f"{ep.episode.episode_id}.jsonl", "a", encoding="utf-8") as f:
            for rec in records:
                if rec["type"] == "step":
                    h = ep.steps[rec["step"]].screenshot_hash
                    if h:
                        rec["screenshot"] = base64.b64encode(images[h]).decode("ascii")
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
    return {"seconds": time.perf_counter() - t0}


def measure(n_steps: int, repeats: int, flush_episodes: int = 8) -> dict:
    episodes = episodes_in_memory(n_steps)
    steps = sum(len(e.steps) for e in episodes)
    lake_us, jsonl_us, flush_share = [], [], []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="halo-bench-write-") as tmp:
            lake = lake_write_seconds(episodes, Path(tmp) / f"lake{r}", flush_episodes)
            jsonl = jsonl_write_seconds(episodes, Path(tmp) / f"jsonl{r}")
        lake_us.append(lake["seconds"] / steps * 1e6)
        jsonl_us.append(jsonl["seconds"] / steps * 1e6)
        flush_share.append(lake["flush_seconds"] / lake["seconds"])
    return {"steps": steps, "episodes": len(episodes), "flush_episodes": flush_episodes,
            "lake_us_per_step": lake_us, "jsonl_us_per_step": jsonl_us, "lake_flush_share": flush_share}
