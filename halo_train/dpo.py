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

    halo-train dpo --source mcts --lake lake --base-model models/tiny --max-steps 5
"""

from __future__ import annotations

import logging
from typing import Any

from halo_train.config import DPOConfig
from halo_train.data import STORED_LOGPROB_COLUMNS, dpo_dataset, drop_overlong
from halo_train.trainer_utils import JobSpec, TrainResult, common_training_args, run_job

log = logging.getLogger(__name__)


def _make_dataset(cfg: DPOConfig, read, tokenizer) -> tuple[Any, int, dict[str, Any]]:
    dataset = dpo_dataset(read.table)
    dataset, dropped = drop_overlong(dataset, tokenizer, cfg.max_length, ("chosen", "rejected"))
    return dataset, dropped, {}


def has_stored_reference(dataset) -> bool:
    """Does any pair carry both stored generation logprobs?"""
    if not set(STORED_LOGPROB_COLUMNS) <= set(dataset.column_names):
        return False
    chosen, rejected = (dataset[c] for c in STORED_LOGPROB_COLUMNS)
    return any(c is not None and r is not None for c, r in zip(chosen, rejected))


def _stored_reference_trainer():
    import trl

    class StoredReferenceDPOTrainer(trl.DPOTrainer):
        """DPO whose reference logprobs are the stored generation logprobs where a pair has both, the base model's elsewhere."""

        def _precompute_ref_logps(self, dataset, name: str, batch_size: int):
            dataset = super()._precompute_ref_logps(dataset, name, batch_size)
            stored = sum(1 for c, r in zip(*(dataset[k] for k in STORED_LOGPROB_COLUMNS)) if c is not None and r is not None)
            log.info("%s: %d of %d pairs use their stored generation logprobs as the reference", name, stored, len(dataset))
            return dataset.map(_use_stored_reference, desc="stored reference logprobs")

    return StoredReferenceDPOTrainer


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
    trainer_class = _stored_reference_trainer() if stored else trl.DPOTrainer
    return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)


def train_dpo(cfg: DPOConfig) -> TrainResult:
    """Train a LoRA adapter on dpo_pairs; returns where it is and how to serve it."""
    from halo_train.vlm import job_spec_for

    return run_job(cfg, job_spec_for(cfg, JobSpec(make_dataset=_make_dataset, make_trainer=_make_trainer)))
