"""What an experiment's lake holds: the state its runner resumes from (the stage records aside, no state kept elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


BASE_MODEL = "base"  # a trained arm whose final policy is the base model itself (no update was ever made)


class LakeState:
    """Read-only questions about the experiment's lake; a lake not yet created holds nothing."""

    def __init__(self, lake: str | Path):
        self.path = Path(lake)

    def open(self):
        """The lake, or None where it is not created yet."""
        from halo_data.lake import Lake

        if not (self.path / "meta" / "info.json").exists():
            return None
        return Lake.open(str(self.path))

    def query(self, sql: str, parameters: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
        lake = self.open()
        return [] if lake is None else lake.query_arrow(sql, parameters or {}, **kw).to_pylist()

    def episodes(self, run_id: str) -> int:
        """Complete episodes of a run in the lake (a run writes whole episodes in one append)."""
        return self.episode_counts([run_id]).get(run_id, 0)

    def episode_counts(self, run_ids: list[str]) -> dict[str, int]:
        """``episodes`` of many runs in one read of the lake (runs with none are absent)."""
        if not run_ids:
            return {}
        rows = self.query("select run_id, count(distinct episode_id) n from steps where list_contains($r, run_id) "
                          "group by run_id", {"r": sorted(set(run_ids))}, views=False, tables=("steps",))
        return {r["run_id"]: int(r["n"]) for r in rows}

    def has_run(self, run_id: str) -> bool:
        return bool(self.query("select 1 from runs where run_id = $r", {"r": run_id}, views=False, tables=("runs",)))

    def run_config(self, run_id: str) -> dict[str, Any] | None:
        rows = self.query("select config from runs where run_id = $r", {"r": run_id}, views=False, tables=("runs",))
        return json.loads(rows[0]["config"] or "{}") if rows else None

    def online_iterations(self, run_id: str) -> list[dict[str, Any]]:
        """An online run's recorded iterations (its ``runs`` row's config): what ``--resume`` continues from."""
        return list((self.run_config(run_id) or {}).get("iterations", []))

    def online_final(self, run_id: str, iterations: int) -> str | None:
        """The adapter folder served after the last iteration, once all ``iterations`` are recorded; None before.
        A run whose every update was skipped (flat groups) ends on the base model: BASE_MODEL then."""
        its = self.online_iterations(run_id)
        if len(its) < iterations:
            return None
        return its[-1]["served_after"]["path"] or BASE_MODEL
