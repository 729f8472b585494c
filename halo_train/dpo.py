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
"""

from __future__ import annotations

import logging
from typing import Any

from halo_train.config import DPOConfig
from halo_train.data import dpo_dataset, drop_overlong
from halo_train.trainer_utils import JobSpec, TrainResult, common_training_args, run_job

log = logging.getLogger(__name__)


def _make_dataset(cfg: DPOConfig, read, tokenizer) -> tuple[Any, int, dict[str, Any]]:
    dataset = dpo_dataset(read.table)
    dataset, dropped = drop_overlong(dataset, tokenizer, cfg.max_length, ("chosen", "rejected"))
    return dataset, dropped, {}


def _make_trainer(cfg: DPOConfig, model, tokenizer, dataset, callbacks: list):
    import trl

    args = trl.DPOConfig(
        **common_training_args(cfg),
        beta=cfg.beta,
        loss_type=list(cfg.loss_type),
        loss_weights=cfg.loss_weights,
        max_length=None,  # over-long pairs were dropped; never cut a completion off
    )
    return trl.DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)


def train_dpo(cfg: DPOConfig) -> TrainResult:
    """Train a LoRA adapter on dpo_pairs; returns where it is and how to serve it."""
    return run_job(cfg, JobSpec(make_dataset=_make_dataset, make_trainer=_make_trainer))
