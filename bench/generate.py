"""Write one synthetic data set to both layouts in a single pass over the generator.

- the lake: whole episodes through an EpisodeWriter flushing ~50k steps a commit, and content-addressed
  ``screenshots`` (one row per distinct image);
- the older layout: one JSONL file per episode — an ``episode_start`` record
  (provenance such as task_seed and worker_temperature), one ``step`` record per
  step with the screenshot inline as base64 PNG and the prompt as chat messages,
  and an ``episode_end`` record with the outcome;
- the same older layout with the screenshots stripped (to show the lake's gain is
  not only "no base64").
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import logging
import os
import time
from pathlib import Path
from typing import Any


from halo_data.lake import Lake
from halo_data.synthetic import SyntheticEpisode, SyntheticSpec, bulk_writer, generate_episodes, synthetic_run_row

log = logging.getLogger(__name__)

# Step fields the older pipeline kept per step, with its names (``reward`` is the record's weighted reward).
LEGACY_STEP_FIELDS = {
    "step_idx": "step",
    "url": "url",
    "observation": "axtree",
    "model_output": "model_output",
    "action": "action",
    "action_valid": "action_valid",
    "parse_error": "parse_error",
    "reward": "reward",
    "cumulative_progress": "progress",
    "state_hash": "state_hash",
    "latency_ms": "latency_ms",
    "env_ms": "env_ms",
}


@dataclasses.dataclass
class GenerateResult:
    steps: int
    episodes: int
    screenshots: int
    screenshot_steps: int
    new_state_share: float
    seconds: float


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def legacy_records(ep: SyntheticEpisode, shots_b64: dict[str, str] | None) -> list[dict[str, Any]]:
    """The older per-episode JSONL records of one episode (``shots_b64`` None: screenshots stripped)."""
    e = ep.episode.row()
    records: list[dict[str, Any]] = [
        {
            "type": "episode_start",
            "episode_id": e["episode_id"],
            "run_id": e["run_id"],
            "env": e["env"],
            "task_id": e["task_id"],
            "site": e["site"],
            "task_seed": e["task_seed"],
            "attempt_idx": e["attempt_idx"],
            "seed": e["seed"],
            "worker_temperature": e["temperature"],
            "policy": e["policy"],
            "policy_version": e["policy_version"],
            "mode": e["mode"],
            "goal": ep.steps[0].goal if ep.steps else None,
            "started_at": _iso(e["started_at"]),
        }
    ]
    for s in ep.steps:
        rec: dict[str, Any] = {"type": "step"}
        for src, dst in LEGACY_STEP_FIELDS.items():
            rec[dst] = s.weighted_reward() if src == "reward" else getattr(s, src)
        rec["prompt"] = json.loads(s.prompt)
        rec["reward_components"] = s.components()
        if shots_b64 is not None and s.screenshot_hash:
            rec["screenshot"] = shots_b64[s.screenshot_hash]
        records.append(rec)
    records.append(
        {
            "type": "episode_end",
            "success": e["success"],
            "task_reward": e["task_reward"],
            "raw_reward": e["raw_reward"],
            "n_steps": e["n_steps"],
            "terminated": e["terminated"],
            "truncated": e["truncated"],
            "error": e["error"],
            "ended_at": _iso(e["ended_at"]),
        }
    )
    return records


def write_legacy_episode(path: Path, records: list[dict[str, Any]]) -> int:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def generate(
    spec: SyntheticSpec,
    lake_root: str | os.PathLike[str] | None,
    jsonl_dir: str | os.PathLike[str] | None = None,
    jsonl_stripped_dir: str | os.PathLike[str] | None = None,
    batch_steps: int = 50_000,
) -> GenerateResult:
    """Generate ``spec`` once and write it to every layout asked for."""
    t0 = time.perf_counter()
    lake = Lake.init(str(lake_root)) if lake_root else None
    bulk = bulk_writer(lake, spec, batch_steps) if lake else None
    dirs = [Path(d) for d in (jsonl_dir, jsonl_stripped_dir) if d]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    # Screenshots of a task's states are revisited only by that task's attempts, so the base64
    # cache holds one task at a time (memory stays flat at any size).
    task_b64: dict[str, str] = {}
    current_task = None
    steps = episodes = shots = shot_steps = 0
    for ep in generate_episodes(spec):
        if bulk:
            bulk.write_episode(ep.episode, ep.steps, ep.screenshots)
        if jsonl_dir or jsonl_stripped_dir:
            if ep.episode.task_id != current_task:
                task_b64.clear()
                current_task = ep.episode.task_id
            for s in ep.screenshots:
                task_b64[s.hash] = base64.b64encode(s.image).decode("ascii")
            name = f"{ep.episode.episode_id}.jsonl"
            if jsonl_dir:
                write_legacy_episode(Path(jsonl_dir) / name, legacy_records(ep, task_b64))
            if jsonl_stripped_dir:
                write_legacy_episode(Path(jsonl_stripped_dir) / name, legacy_records(ep, None))
        steps += len(ep.steps)
        episodes += 1
        shots += len(ep.screenshots)
        shot_steps += sum(1 for s in ep.steps if s.screenshot_hash)
    if bulk:
        bulk.close()
        lake.upsert_runs([synthetic_run_row(spec, "python -m bench", planned_episodes=episodes, bench="bench.generate")])
    return GenerateResult(
        steps=steps,
        episodes=episodes,
        screenshots=shots,
        screenshot_steps=shot_steps,
        new_state_share=shots / steps if steps else 0.0,
        seconds=time.perf_counter() - t0,
    )
