"""Check the lake's materialised views and the older export's JSONL hold the same rows.

Equality is defined on row sets keyed by what identifies a row:
- bc_rows: (episode_id, step_idx) -> (prompt, completion);
- dpo_pairs: (task_id, prompt) -> (chosen episode/step/output, rejected episode/step/output);
- grpo_groups: (level, episode_id, step_idx) -> (group_key, member_id, completion, group_size, zero_std,
  reward, group_mean, group_std, advantage, combined_advantage), floats equal within 1e-6
  (sums run in a different order).
Prompts are compared by the sha256 of their canonical JSON, which is what the lake stores as prompt_hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

FLOAT_TOLERANCE = 1e-6


def _prompt_hash_of_messages(messages: Any) -> str:
    text = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _parquet_rows(path: Path, columns: list[str]) -> Iterator[dict]:
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(columns=columns, batch_size=65_536):
        yield from batch.to_pylist()


def _jsonl_rows(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _assistant(content: Any) -> Any:
    return content[0]["content"] if isinstance(content, list) else content


def bc_keys_lake(path: Path) -> dict:
    return {(r["episode_id"], r["step_idx"]): (r["prompt_hash"], r["completion"]) for r in _parquet_rows(path, ["episode_id", "step_idx", "prompt_hash", "completion"])}


def bc_keys_legacy(path: Path) -> dict:
    return {(r["episode_id"], r["step_idx"]): (_prompt_hash_of_messages(r["prompt"]), _assistant(r["completion"])) for r in _jsonl_rows(path)}


DPO_VALUES = ("chosen_episode_id", "chosen_step_idx", "rejected_episode_id", "rejected_step_idx")


def dpo_keys_lake(path: Path) -> dict:
    cols = ["source", "task_id", "prompt_hash", "chosen", "rejected", *DPO_VALUES]
    return {
        (r["task_id"], r["prompt_hash"]): (*(r[c] for c in DPO_VALUES), r["chosen"], r["rejected"])
        for r in _parquet_rows(path, cols)
        if r["source"] == "episodes"
    }


def dpo_keys_legacy(path: Path) -> dict:
    return {
        (r["task_id"], _prompt_hash_of_messages(r["prompt"])): (*(r[c] for c in DPO_VALUES), _assistant(r["chosen"]), _assistant(r["rejected"]))
        for r in _jsonl_rows(path)
    }


GRPO_EXACT = ("group_key", "member_id", "completion", "group_size", "zero_std")
GRPO_FLOATS = ("reward", "group_mean", "group_std", "advantage", "combined_advantage")


def grpo_keys_lake(path: Path) -> dict:
    cols = ["level", "episode_id", "step_idx", *GRPO_EXACT, *GRPO_FLOATS]
    return {(r["level"], r["episode_id"], r["step_idx"]): tuple(r[c] for c in GRPO_EXACT + GRPO_FLOATS) for r in _parquet_rows(path, cols)}


def grpo_keys_legacy(path: Path) -> dict:
    out = {}
    for r in _jsonl_rows(path):
        r["completion"] = _assistant(r["completion"])
        out[(r["level"], r["episode_id"], r["step_idx"])] = tuple(r[c] for c in GRPO_EXACT + GRPO_FLOATS)
    return out


def _diff(name: str, lake: dict, legacy: dict, n_exact: int | None = None) -> list[str]:
    problems = []
    only_lake = lake.keys() - legacy.keys()
    only_legacy = legacy.keys() - lake.keys()
    if only_lake:
        problems.append(f"{name}: {len(only_lake)} rows only in the lake, e.g. {sorted(only_lake)[0]}")
    if only_legacy:
        problems.append(f"{name}: {len(only_legacy)} rows only in the older export, e.g. {sorted(only_legacy)[0]}")
    differing = 0
    example = None
    for k in lake.keys() & legacy.keys():
        a, b = lake[k], legacy[k]
        if n_exact is None:
            same = a == b
        else:
            same = a[:n_exact] == b[:n_exact] and all(
                math.isclose(x, y, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE) for x, y in zip(a[n_exact:], b[n_exact:])
            )
        if not same:
            differing += 1
            example = example or (k, a, b)
    if differing:
        problems.append(f"{name}: {differing} rows differ, e.g. {example}")
    return problems


def compare_outputs(lake_dir: str | Path, legacy_dir: str | Path) -> dict[str, Any]:
    """Row counts and the differences (empty when the outputs are equal)."""
    lake_dir, legacy_dir = Path(lake_dir), Path(legacy_dir)
    problems: list[str] = []
    counts = {}
    for name, lake_fn, legacy_fn, n_exact in (
        ("bc_rows", bc_keys_lake, bc_keys_legacy, None),
        ("dpo_pairs", dpo_keys_lake, dpo_keys_legacy, None),
        ("grpo_groups", grpo_keys_lake, grpo_keys_legacy, len(GRPO_EXACT)),
    ):
        lake = lake_fn(lake_dir / f"{name}.parquet")
        legacy = legacy_fn(legacy_dir / f"{name}.jsonl")
        counts[name] = {"lake": len(lake), "legacy": len(legacy)}
        problems += _diff(name, lake, legacy, n_exact)
        del lake, legacy
    return {"equal": not problems, "counts": counts, "problems": problems}
