"""DPO of a LoRA adapter on the lake's dpo_pairs (prompt, chosen, rejected).

    halo-train dpo --lake lake --base-model models/tiny --max-steps 5 --output-dir out/dpo

    from halo_train import DPOConfig, train_dpo
    result = train_dpo(DPOConfig(lake="lake", base_model="models/tiny", beta=0.1))

Pairs come from steps with the same prompt in different episodes of a task (the
higher-ranked episode's output is chosen) and from scored candidates. TRL's
DPOTrainer uses the base model with the adapter switched off as the reference,
so no second copy of the model is loaded. ``--loss-type`` takes TRL's names
(sigmoid, ipo, hinge, robust, ...); its metrics rewards/chosen, rewards/rejected,
rewards/margins and rewards/accuracies land in train_metrics.

Pairs from search trees (``--source mcts``) carry the generation logprobs the
policy had for each completion when it sampled them (``chosen_logprob_sum``,
``rejected_logprob_sum``): where a pair has both, they are its reference
logprobs (the sampling policy is the reference, as in Agent Q's off-policy DPO);
the other pairs are scored by the base model as usual.

Token-exact pairs. Where a search node stored the engine's token ids (``completion_token_ids``), the pair is
scored on those ids, never a re-tokenisation of the text, and its stored logprobs are the reference only where
they are of the distribution DPO scores, the model's raw softmax (``raw_logprobs``, or a plain sample at
temperature 1): a guided choice's masked draw or a sample at another temperature is referenced to the base
model, on the same ids. Pairs of older lakes (no token ids) keep the earlier behaviour: the text tokenised
by TRL, the stored ``logprob_sum`` as the reference where both sides have one.

    halo-train dpo --source mcts --lake lake --base-model models/tiny --max-steps 5
"""

from __future__ import annotations

import logging
from typing import Any

from halo_train.config import DPOConfig
from halo_train.data import STORED_LOGPROB_COLUMNS, dpo_dataset, drop_overlong
from halo_train.trainer_utils import JobSpec, TrainResult, common_training_args, run_job

log = logging.getLogger(__name__)


# dpo_pairs with each search-tree pair's nodes' stored tokens and the distribution of their logprobs.
_NODE = ("{{'completion_token_ids': {n}.completion_token_ids, 'logprobs': {n}.logprobs, 'logprobs_mode': {n}.logprobs_mode, "
         "'draw': {n}.draw, 'choices': {n}.choices, 'temperature': {n}.temperature}}")
TOKENS_SQL = f"""
SELECT selected.*, {_NODE.format(n="cn")} AS chosen_tokens, {_NODE.format(n="rn")} AS rejected_tokens
FROM selected
LEFT JOIN mcts_nodes AS cn
    ON cn.run_id = selected.run_id AND cn.tree_id = selected.chosen_episode_id AND cn.node_id = selected.chosen_node_id
LEFT JOIN mcts_nodes AS rn
    ON rn.run_id = selected.run_id AND rn.tree_id = selected.rejected_episode_id AND rn.node_id = selected.rejected_node_id
"""
TOKEN_ID_COLUMNS = ("chosen_token_ids", "rejected_token_ids")


def token_exact_pairs(table):
    """The pairs with each side's stored token ids (None where not token-exact) and the stored references that
    are of the raw softmax (a pair with token ids whose logprobs are of another distribution has none)."""
    import pyarrow as pa

    from halo_train.behaviour import is_raw, token_exact

    if "chosen_tokens" not in table.column_names:
        return table
    ids: dict[str, list] = {c: [] for c in TOKEN_ID_COLUMNS}
    references: dict[str, list] = {c: [] for c in STORED_LOGPROB_COLUMNS}
    for row in table.select(["chosen_tokens", "rejected_tokens", *STORED_LOGPROB_COLUMNS]).to_pylist():
        sides = [token_exact(row[f"{side}_tokens"] or {}) for side in ("chosen", "rejected")]
        for column, behaviour in zip(TOKEN_ID_COLUMNS, sides):
            ids[column].append(behaviour.token_ids if behaviour is not None else None)
        exact = [b for b in sides if b is not None]
        keep = not exact or (len(exact) == 2 and all(is_raw(b) for b in exact))
        for column, behaviour in zip(STORED_LOGPROB_COLUMNS, sides):
            stored = row[column] if behaviour is None else float(sum(behaviour.logprobs))
            references[column].append(stored if keep else None)
    table = table.drop_columns(["chosen_tokens", "rejected_tokens", *STORED_LOGPROB_COLUMNS])
    for column, values in {**ids, **references}.items():
        table = table.append_column(column, pa.array(values, pa.list_(pa.int64()) if column in ids else pa.float64()))
    return table


def _make_dataset(cfg: DPOConfig, read, tokenizer) -> tuple[Any, int, dict[str, Any]]:
    dataset = dpo_dataset(token_exact_pairs(read.table))
    dataset, dropped = drop_overlong(dataset, tokenizer, cfg.max_length, ("chosen", "rejected"))
    exact = sum(1 for c in dataset["chosen_token_ids"] if c is not None) if "chosen_token_ids" in dataset.column_names else 0
    return dataset, dropped, {"pairs_with_token_ids": exact}


def has_stored_reference(dataset) -> bool:
    """Does any pair carry both stored generation logprobs?"""
    if not set(STORED_LOGPROB_COLUMNS) <= set(dataset.column_names):
        return False
    chosen, rejected = (dataset[c] for c in STORED_LOGPROB_COLUMNS)
    return any(c is not None and r is not None for c, r in zip(chosen, rejected))


def _stored_reference_trainer():
    import trl

    class StoredReferenceDPOTrainer(trl.DPOTrainer):
        """DPO on the stored token ids where a pair has them, whose reference logprobs are the stored generation
        logprobs where a pair has both, the base model's elsewhere."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if "chosen_token_ids" not in dataset.column_names:
                return dataset
            return dataset.map(_use_stored_tokens, desc="stored token ids")

        def _precompute_ref_logps(self, dataset, name: str, batch_size: int):
            dataset = super()._precompute_ref_logps(dataset, name, batch_size)
            if not set(STORED_LOGPROB_COLUMNS) <= set(dataset.column_names):
                return dataset
            stored = sum(1 for c, r in zip(*(dataset[k] for k in STORED_LOGPROB_COLUMNS)) if c is not None and r is not None)
            log.info("%s: %d of %d pairs use their stored generation logprobs as the reference", name, stored, len(dataset))
            return dataset.map(_use_stored_reference, desc="stored reference logprobs")

    return StoredReferenceDPOTrainer


def _use_stored_tokens(row: dict[str, Any]) -> dict[str, Any]:
    """The engine's tokens in place of TRL's tokenisation of the text, side by side (after the same prompt)."""
    return {f"{side}_ids": row[f"{side}_token_ids"] if row[f"{side}_token_ids"] is not None else row[f"{side}_ids"]
            for side in ("chosen", "rejected")}


def _use_stored_reference(row: dict[str, Any]) -> dict[str, Any]:
    chosen, rejected = (row[k] for k in STORED_LOGPROB_COLUMNS)
    if chosen is None or rejected is None:
        return {"ref_chosen_logps": row["ref_chosen_logps"], "ref_rejected_logps": row["ref_rejected_logps"]}
    return {"ref_chosen_logps": float(chosen), "ref_rejected_logps": float(rejected)}


def _make_trainer(cfg: DPOConfig, model, tokenizer, dataset, callbacks: list):
    import trl

    stored = has_stored_reference(dataset)
    args = trl.DPOConfig(
        **common_training_args(cfg),
        beta=cfg.beta,
        loss_type=list(cfg.loss_type),
        loss_weights=cfg.loss_weights,
        max_length=None,  # over-long pairs were dropped; never cut a completion off
        precompute_ref_log_probs=stored,
    )
    exact = "chosen_token_ids" in dataset.column_names and any(
        c is not None or r is not None for c, r in zip(*(dataset[k] for k in TOKEN_ID_COLUMNS)))
    trainer_class = _stored_reference_trainer() if stored or exact else trl.DPOTrainer
    return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)


def train_dpo(cfg: DPOConfig) -> TrainResult:
    """Train a LoRA adapter on dpo_pairs; returns where it is and how to serve it."""
    from halo_train.vlm import job_spec_for

    sql = TOKENS_SQL if cfg.view == "dpo_pairs" else None
    return run_job(cfg, job_spec_for(cfg, JobSpec(make_dataset=_make_dataset, make_trainer=_make_trainer, sql=sql)))
