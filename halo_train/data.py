"""From the lake's views to Hugging Face datasets, straight from Arrow (no export in between).

    read = read_view(cfg)                # one consistent snapshot, in one order; read.lineage = {table: version}
    dataset = bc_dataset(read.table)     # prompt (chat messages) -> completion (assistant message)

Prompts keep the shape the policy saw at rollout time: the stored chat-messages
JSON is parsed, not re-rendered, so an adapter is trained on exactly the prompts
it will be served with. Image parts (``image_ref`` by screenshot hash) are
dropped for these text-only jobs, with a warning.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

import pyarrow as pa

from halo_data import prompts
from halo_data import schema as S
from halo_data.config import parse_as_of
from halo_data.lake import Lake, LakeError
from halo_train.config import TrainConfig, TrainConfigError

log = logging.getLogger(__name__)

# What to do next when a view has no rows, by view.
EMPTY_VIEW_HINTS = {
    "bc_rows": "no BC rows: collect episodes with valid actions first (halo-agent rollout), or widen --top-percent / --where",
    "dpo_pairs": "no DPO pairs: collect at least two attempts per task (halo-agent rollout --rollouts-per-task 2 or more), "
                 "or search trees (halo-agent search)",
    "grpo_groups": "no GRPO groups: collect several attempts per task with the same --task-seed (halo-agent rollout --rollouts-per-task 4)",
    "state_groups": "no per-state groups: sample and score candidates at every state (halo-agent rollout --candidates 8); "
                    "states that did not reproduce are left out",
}

REQUIRED_COLUMNS = {
    "bc": ("prompt", "completion"),
    "dpo": ("prompt", "chosen", "rejected"),
    "grpo": ("level", "group_key", "prompt", "completion", "reward", "group_mean", "group_std", "zero_std", "advantage"),
}


class EmptyViewError(TrainConfigError):
    """The view (after --where) has no rows to train on."""


class NoTrainingSignalError(TrainConfigError):
    """There are rows, but none carries a learning signal (every group flat, or every row too stale)."""


@dataclasses.dataclass
class ViewRead:
    """Rows read from one view, and the table versions they were read at."""

    table: pa.Table
    view: str
    where: str | None
    lineage: dict[str, int]
    view_params: dict[str, Any]
    runs: list[str] | None = None  # the runs the view was computed over (None: the whole lake)

    @property
    def source(self) -> str:
        return self.view if not self.where else f"{self.view} WHERE {self.where}"


def resolve_versions(lake: Lake, as_of: Any = None) -> dict[str, int]:
    """Every table's version to read: the current ones, or those ``--as-of`` names (the rest current)."""
    parsed = parse_as_of(as_of) if not isinstance(as_of, (dict, dt.datetime)) else as_of
    out: dict[str, int] = {}
    for name in S.TABLES:
        if isinstance(parsed, dt.datetime):
            out[name] = lake.table(name, parsed).version()
        elif isinstance(parsed, dict) and name in parsed:
            out[name] = lake.table(name, int(parsed[name])).version()
        else:
            out[name] = lake.table(name).version()
    return out


def _filtered_sql(view: str, where: str | None) -> str:
    from halo_data.query import check_read_only

    sql = f'SELECT * FROM "{view}"' + (f" WHERE {where}" if where else "")
    statements = check_read_only(sql)
    if len(statements) != 1:
        raise TrainConfigError(f"--where must be one SQL condition, got several statements: {where!r}")
    return sql


def ordered_sql(query: str) -> str:
    """``query``'s rows in one order for one snapshot. DuckDB's parallel scans and joins return rows in any order,
    and a job's batches (its seeded shuffle of this order), a resumed job's remaining steps and a seed's adapter all
    follow it. What the order costs: ``python -m bench view-order``."""
    return f"SELECT * FROM ({query}) ORDER BY ALL"


def read_view(
    lake_root: str,
    view: str,
    where: str | None = None,
    view_params: dict[str, Any] | None = None,
    as_of: Any = None,
    job_type: str | None = None,
    sql: str | None = None,
    runs: list[str] | None = None,
) -> ViewRead:
    """Read ``view`` (filtered by ``where``) at one snapshot of every table; records that snapshot as lineage.

    ``sql`` replaces ``SELECT * FROM view WHERE ...`` with a query over the CTE ``selected`` (the filtered view).
    ``runs``: the view is computed over those runs' rows alone (``halo_data.reader.connect``).
    """
    import duckdb

    from halo_data.views import view_names

    lake = Lake.open(lake_root)
    if view not in view_names():
        raise TrainConfigError(f"unknown view {view!r}: `halo-data views` lists them ({', '.join(view_names())})")
    versions = resolve_versions(lake, as_of)
    base_sql = _filtered_sql(view, where)
    try:
        con = lake.connect(as_of=versions, params=dict(view_params or {}), runs=runs)
    except ValueError as e:  # a bad view parameter
        raise TrainConfigError(str(e)) from None
    try:
        query = base_sql if sql is None else f"WITH selected AS ({base_sql})\n{sql}"
        table = con.sql(ordered_sql(query)).to_arrow_table()
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainConfigError(f"cannot read {view}{' with --where ' + repr(where) if where else ''}: {first}") from None
    finally:
        con.close()
    if job_type and sql is None:
        missing = [c for c in REQUIRED_COLUMNS[job_type] if c not in table.column_names]
        if missing:
            raise TrainConfigError(f"view {view} lacks column(s) {', '.join(missing)} that {job_type} needs")
    log.info("read %d rows from %s at %s", table.num_rows, view, versions)
    return ViewRead(table=table, view=view, where=where, lineage=versions, view_params=dict(view_params or {}), runs=runs)


def read_for(cfg: TrainConfig, lineage: dict[str, int] | None = None, sql: str | None = None) -> ViewRead:
    """The rows a job's config selects. ``lineage`` (a resumed run's) pins the exact snapshot."""
    read = read_view(
        cfg.lake,
        cfg.view,
        where=cfg.where,
        view_params=cfg.view_params(),
        as_of=lineage if lineage is not None else cfg.as_of,
        job_type=cfg.job_type,
        sql=sql,
        runs=cfg.scoped_runs(),
    )
    if read.table.num_rows == 0:
        hint = EMPTY_VIEW_HINTS.get(cfg.view, f"view {cfg.view} has no rows")
        raise EmptyViewError(f"{hint}{' (with --where ' + repr(cfg.where) + ')' if cfg.where else ''}; lake: {cfg.lake}")
    return read


# ---------------------------------------------------------------------------- chat messages


def prompt_messages(prompt_json: str) -> list[dict[str, str]]:
    """The stored prompt as chat messages for a text-only model: ``prompts.text_messages``, the rendering HALO's
    chat server gives the same messages (image parts dropped), so a step is scored on the prompt it was sampled on."""
    try:
        messages = prompts.loads(prompt_json)
    except (TypeError, ValueError) as e:
        raise LakeError(f"a stored prompt is not chat-messages JSON ({e}); was it written by the prompt renderer?") from None
    return prompts.text_messages(messages)


def _has_images(prompt_json: str) -> bool:
    return '"image_ref"' in prompt_json


def _warn_images(column: pa.ChunkedArray) -> None:
    n = sum(1 for p in column.to_pylist() if p and _has_images(p))
    if n:
        log.warning("%d prompt(s) carry screenshots; text-only training drops the image parts", n)


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def to_dataset(table: pa.Table):
    """A ``datasets.Dataset`` over the Arrow table (zero-copy)."""
    import datasets

    return datasets.Dataset(table)


def bc_dataset(table: pa.Table):
    """Conversational prompt-completion rows for TRL's SFTTrainer (loss on the completion only)."""
    _warn_images(table.column("prompt"))
    ds = to_dataset(table.select(["prompt", "completion"]))
    return ds.map(
        lambda row: {"prompt": prompt_messages(row["prompt"]), "completion": _assistant(row["completion"])},
        desc="chat messages",
    )


# Stored generation logprobs of a pair's two completions (search trees), kept for the DPO reference.
STORED_LOGPROB_COLUMNS = ("chosen_logprob_sum", "rejected_logprob_sum")


def dpo_dataset(table: pa.Table):
    """Conversational preference rows (prompt, chosen, rejected) for TRL's DPOTrainer, with stored logprobs where the view has them."""
    _warn_images(table.column("prompt"))
    stored = [c for c in STORED_LOGPROB_COLUMNS if c in table.column_names]
    token_ids = [c for c in ("chosen_token_ids", "rejected_token_ids") if c in table.column_names]
    ds = to_dataset(table.select(["prompt", "chosen", "rejected", *(stored if len(stored) == 2 else []), *token_ids]))
    return ds.map(
        lambda row: {
            "prompt": prompt_messages(row["prompt"]),
            "chosen": _assistant(row["chosen"]),
            "rejected": _assistant(row["rejected"]),
        },
        desc="chat messages",
    )


def chat_text(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def drop_overlong(dataset, tokenizer, max_length: int | None, completion_columns: tuple[str, ...]):
    """Drop rows whose prompt + longest completion exceeds ``max_length`` tokens (truncation would cut the completion)."""
    if max_length is None:
        return dataset, 0

    def fits(row: dict[str, Any]) -> bool:
        longest = 0
        for col in completion_columns:
            text = chat_text(tokenizer, row["prompt"] + row[col], add_generation_prompt=False)
            longest = max(longest, len(tokenizer(text, add_special_tokens=False)["input_ids"]))
        return longest <= max_length

    before = len(dataset)
    kept = dataset.filter(fits, desc="length check")
    dropped = before - len(kept)
    if dropped:
        log.warning("dropped %d of %d rows longer than --max-length %d tokens", dropped, before, max_length)
    return kept, dropped
