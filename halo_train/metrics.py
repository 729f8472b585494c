"""Training metrics and the training run's ``runs`` row, written back into the lake.

Every value a trainer logs (``loss``, ``grad_norm``, ``learning_rate``,
``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``reward``,
``reward_std``, ``frac_reward_zero_std``, ``tokens_per_second``, ...) becomes a
row of ``train_metrics`` (run_id, step, epoch, metric, value). Rows are buffered
and appended in one commit per checkpoint and at the end — never one per step.

The ``runs`` row (kind ``train``) records the job type, base model, the full
config as JSON, the view read and the version of every lake table read
(lineage), so ``--as-of`` can rebuild the exact dataset; ``halo_data.runs`` builds it, with
the same provenance (package versions, git sha, host) as a rollout's.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from typing import Any

from transformers import TrainerCallback

from halo_data.lake import Lake
from halo_data.runs import RunRecord
from halo_data.writer import append_rows

log = logging.getLogger(__name__)

# Trainer log keys renamed to HALO's metric names.
RENAMED = {"train_tokens_per_second": "tokens_per_second"}
# Logged values that are bookkeeping, not metrics (epoch has its own column).
NOT_METRICS = {"epoch", "step", "total_flos"}


def metric_rows(run_id: str, step: int, epoch: float | None, logs: dict[str, Any], now: dt.datetime | None = None) -> list[dict[str, Any]]:
    now = now or dt.datetime.now(dt.timezone.utc)
    rows = []
    for key, value in logs.items():
        if key in NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        value = float(value)
        if math.isnan(value):
            continue
        rows.append(
            {"run_id": run_id, "step": int(step), "epoch": None if epoch is None else float(epoch),
             "metric": RENAMED.get(key, key), "value": value, "logged_at": now}
        )
    return rows


class LakeMetricsCallback(TrainerCallback):
    """Writes every logged metric to the lake's train_metrics (buffered; flushed at checkpoints and at the end)."""

    def __init__(self, lake: Lake, run_id: str, flush_rows: int = 500):
        self.lake = lake
        self.run_id = run_id
        self.flush_rows = flush_rows
        self.buffer: list[dict[str, Any]] = []
        self.written = 0
        self.last_logs: dict[str, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        rows = metric_rows(self.run_id, state.global_step, state.epoch, logs)
        self.last_logs.update({r["metric"]: r["value"] for r in rows})
        self.buffer.extend(rows)
        if len(self.buffer) >= self.flush_rows:
            self.flush()

    def on_save(self, args, state, control, **kwargs):
        self.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        rows, self.buffer = self.buffer, []
        append_rows(self.lake, "train_metrics", rows)
        self.written += len(rows)
        log.debug("wrote %d metric rows of %s", len(rows), self.run_id)


def run_row(
    *,
    run_id: str,
    job_type: str,
    base_model: str,
    config_json: str,
    source_view: str,
    lineage: dict[str, int],
    output_dir: str,
    status: str,
    started_at: dt.datetime,
    ended_at: dt.datetime | None = None,
    adapter: str | None = None,
    policy_version: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    return RunRecord(
        run_id=run_id,
        kind="train",
        mode=job_type,
        job_type=job_type,
        base_model=base_model,
        model=base_model,
        adapter=adapter,
        policy_version=policy_version,
        config=config_json,
        command=command,
        status=status,
        started_at=started_at,
        ended_at=ended_at,
        source_view=source_view,
        lineage=lineage,
        output_dir=output_dir,
    ).row()


def record_run(lake: Lake, **fields: Any) -> None:
    lake.upsert_runs([run_row(**fields)])
