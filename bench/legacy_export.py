"""The older export, reimplemented faithfully in pure Python as the baseline.

It does what the older HALO export script did, over the per-episode JSONL files:
read every file, rank the episodes of each task by success, then progress, then
fewer steps; cut the top percent for behaviour cloning; pair steps with equal
prompts across episodes of a task for DPO; and, to give the same data set the
lake's views give, group attempts for GRPO. It writes JSONL in TRL's column names.

The semantics follow ``halo_data/sql`` (progress_ranking, bc_rows, dpo_pairs,
grpo_groups) with the default view parameters, so both outputs can be checked
equal (``bench.compare``).

    python -m bench.legacy_export JSONL_DIR OUT_DIR     # prints timings as JSON
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from halo_data.config import ViewParams
from halo_data.schema import REWARD_COMPONENTS


def _canonical(messages: Any) -> str:
    # The same canonical form the prompt renderer writes (halo_data.prompts.dumps).
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _stddev_samp(values: list[float], mean: float) -> float:
    if len(values) < 2:
        return 0.0
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


class Episode:
    __slots__ = ("meta", "end", "steps", "success", "final_progress", "n_steps", "shaped_return", "error",
                 "rank", "percentile", "in_top")

    def __init__(self, meta: dict, steps: list[dict], end: dict):
        self.meta = meta
        self.steps = steps
        self.end = end
        self.success = bool(end.get("success"))
        self.final_progress = max((s.get("progress") or 0.0) for s in steps) if steps else 0.0
        self.n_steps = end.get("n_steps") if end.get("n_steps") is not None else len(steps)
        self.error = end.get("error")
        self.shaped_return = 0.0


def read_episodes(jsonl_dir: str | os.PathLike[str]) -> list[Episode]:
    """Read every per-episode JSONL file; screenshots and AXTree text are dropped after parsing."""
    episodes = []
    for path in sorted(Path(jsonl_dir).glob("*.jsonl")):
        meta: dict | None = None
        end: dict = {}
        steps: list[dict] = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                rec = json.loads(line)
                kind = rec.get("type")
                if kind == "step":
                    rec.pop("screenshot", None)
                    rec.pop("axtree", None)
                    steps.append(rec)
                elif kind == "episode_start":
                    meta = rec
                elif kind == "episode_end":
                    end = rec
                else:
                    raise ValueError(f"{path}:{line_no}: unknown record type {kind!r}")
        if meta is None:
            raise ValueError(f"{path}: no episode_start record")
        episodes.append(Episode(meta, steps, end))
    return episodes


def shaped_reward(components: dict, weights: dict[str, float]) -> float:
    total = 0.0
    for k in REWARD_COMPONENTS:
        total += (components.get(k) or 0.0) * weights[k]
    return total


def rank_episodes(episodes: list[Episode], top_percent: float) -> dict[str, list[Episode]]:
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_task[e.meta["task_id"]].append(e)
    for task_episodes in by_task.values():
        key = lambda e: (not e.success, -e.final_progress, e.n_steps)  # noqa: E731
        task_episodes.sort(key=key)
        n = len(task_episodes)
        cut = max(1, math.ceil(n * top_percent / 100.0))
        prev_key = None
        rank = 0
        for i, e in enumerate(task_episodes):
            k = key(e)
            if k != prev_key:  # ties share a rank (SQL rank())
                rank = i + 1
                prev_key = k
            e.rank = rank
            e.percentile = 1.0 if n == 1 else 1.0 - (rank - 1) / (n - 1)
            e.in_top = rank <= cut
    return by_task


def bc_rows(by_task: dict[str, list[Episode]]) -> Iterable[dict]:
    for task_id, task_episodes in by_task.items():
        for e in task_episodes:
            if not e.in_top or e.error is not None:
                continue
            for s in e.steps:
                if s.get("action_valid") and s.get("prompt") is not None and s.get("model_output") is not None:
                    yield {
                        "prompt": s["prompt"],
                        "completion": [{"role": "assistant", "content": s["model_output"]}],
                        "task_id": task_id,
                        "episode_id": e.meta["episode_id"],
                        "step_idx": s["step"],
                        "success": e.success,
                        "final_progress": e.final_progress,
                        "rank": e.rank,
                        "percentile": e.percentile,
                    }


def dpo_pairs(by_task: dict[str, list[Episode]]) -> Iterable[dict]:
    """Best vs worst: per prompt of a task, the best-ranked step against the worst-ranked step whose output differs."""
    for task_id, task_episodes in by_task.items():
        by_prompt: dict[str, list[tuple[Episode, dict]]] = defaultdict(list)
        for e in task_episodes:
            if e.error is not None:
                continue
            for s in e.steps:
                if s.get("prompt") is not None and s.get("model_output") is not None:
                    by_prompt[s["_prompt_key"]].append((e, s))
        for prompt_key, members in by_prompt.items():
            if len(members) < 2:
                continue
            best = None
            for c_ep, c in members:
                for r_ep, r in members:
                    if c_ep.rank < r_ep.rank and c["model_output"] != r["model_output"]:
                        order = (c_ep.rank, -r_ep.rank, c_ep.meta["episode_id"], r_ep.meta["episode_id"], c["step"], r["step"])
                        if best is None or order < best[0]:
                            best = (order, c_ep, c, r_ep, r)
            if best is None:
                continue
            _, c_ep, c, r_ep, r = best
            yield {
                "prompt": c["prompt"],
                "chosen": [{"role": "assistant", "content": c["model_output"]}],
                "rejected": [{"role": "assistant", "content": r["model_output"]}],
                "task_id": task_id,
                "chosen_episode_id": c_ep.meta["episode_id"],
                "chosen_step_idx": c["step"],
                "rejected_episode_id": r_ep.meta["episode_id"],
                "rejected_step_idx": r["step"],
                "chosen_score": c_ep.percentile,
                "rejected_score": r_ep.percentile,
                "score_margin": c_ep.percentile - r_ep.percentile,
            }


def grpo_groups(episodes: list[Episode], gamma: float, omega: float) -> Iterable[dict]:
    """Episode groups (attempts of a task with one task_seed and policy_version) and anchor-state step groups."""
    groups: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        if e.error is None:
            m = e.meta
            seed = "" if m.get("task_seed") is None else str(m["task_seed"])
            groups["|".join([m["task_id"], seed, m.get("policy_version") or ""])].append(e)
    for group_key, members in groups.items():
        rewards = [e.shaped_return for e in members]
        mean = sum(rewards) / len(rewards)
        std = _stddev_samp(rewards, mean)
        zero_std = (max(rewards) - min(rewards)) <= 1e-9
        # step members with their discounted returns
        anchors: dict[str, list[tuple[Episode, dict, float]]] = defaultdict(list)
        for e in members:
            ret = 0.0
            returns = [0.0] * len(e.steps)
            for i in range(len(e.steps) - 1, -1, -1):
                ret = e.steps[i]["_shaped"] + gamma * ret
                returns[i] = ret
            for s, g in zip(e.steps, returns):
                if s.get("prompt") is None or s.get("model_output") is None:
                    continue
                anchor = s.get("state_hash") or f"{e.meta['episode_id']}:{s['step']}"
                anchors[anchor].append((e, s, g))
        for anchor, steps in anchors.items():
            values = [g for _, _, g in steps]
            s_mean = sum(values) / len(values)
            s_std = _stddev_samp(values, s_mean)
            s_zero = (max(values) - min(values)) <= 1e-9
            step_key = f"{group_key}|{anchor}"
            for e, s, g in steps:
                a_episode = e.shaped_return - mean
                a_step = g - s_mean
                combined = a_episode + omega * a_step
                common = {
                    "prompt": s["prompt"],
                    "completion": [{"role": "assistant", "content": s["model_output"]}],
                    "task_id": e.meta["task_id"],
                    "task_seed": e.meta.get("task_seed"),
                    "policy_version": e.meta.get("policy_version"),
                    "episode_id": e.meta["episode_id"],
                    "step_idx": s["step"],
                    "state_hash": s.get("state_hash"),
                    "combined_advantage": combined,
                }
                yield {"level": "episode", "group_key": group_key, "member_id": e.meta["episode_id"],
                       "reward": e.shaped_return, "group_mean": mean, "group_std": std,
                       "group_size": len(members), "zero_std": zero_std, "advantage": a_episode, **common}
                yield {"level": "step", "group_key": step_key, "member_id": f"{e.meta['episode_id']}:{s['step']}",
                       "reward": g, "group_mean": s_mean, "group_std": s_std,
                       "group_size": len(steps), "zero_std": s_zero, "advantage": a_step, **common}


def _write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def export(jsonl_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], params: ViewParams | None = None) -> dict[str, Any]:
    """Build bc_rows, dpo_pairs and grpo_groups JSONL files from a folder of per-episode JSONL files."""
    params = params or ViewParams()
    weights = params.weights.as_dict()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    episodes = read_episodes(jsonl_dir)
    t_read = time.perf_counter()
    for e in episodes:
        total = 0.0
        for s in e.steps:
            s["_shaped"] = shaped_reward(s.get("reward_components") or {}, weights)
            total += s["_shaped"]
            if s.get("prompt") is not None:
                s["_prompt_key"] = _canonical(s["prompt"])
        e.shaped_return = total
    by_task = rank_episodes(episodes, params.top_percent)
    rows = {
        "bc_rows": _write_jsonl(out / "bc_rows.jsonl", bc_rows(by_task)),
        "dpo_pairs": _write_jsonl(out / "dpo_pairs.jsonl", dpo_pairs(by_task)),
        "grpo_groups": _write_jsonl(out / "grpo_groups.jsonl", grpo_groups(episodes, params.gamma, params.omega)),
    }
    t_end = time.perf_counter()
    return {"seconds": t_end - t0, "read_seconds": t_read - t0, "episodes": len(episodes), "rows": rows}


if __name__ == "__main__":
    print(json.dumps(export(sys.argv[1], sys.argv[2])))
