"""Behavioural cloning: supervised fine-tuning of a LoRA adapter on the lake's bc_rows.

    halo-train bc --lake lake --base-model models/tiny --max-steps 5 --output-dir out/bc

    from halo_train import BCConfig, train_bc
    result = train_bc(BCConfig(lake="lake", base_model="models/tiny", output_dir="out/bc", max_steps=5))

Rows are conversational prompt-completion pairs: the chat messages the policy saw
at rollout time -> the assistant message it should have written. TRL's
SFTTrainer computes the loss on the completion tokens only
(``completion_only_loss``), so the adapter learns to answer, not to repeat pages.
"""

from __future__ import annotations

import logging
from typing import Any

from halo_train.config import BCConfig
from halo_train.data import bc_dataset, drop_overlong
from halo_train.trainer_utils import JobSpec, TrainResult, common_training_args, run_job

log = logging.getLogger(__name__)


def _make_dataset(cfg: BCConfig, read, tokenizer) -> tuple[Any, int, dict[str, Any]]:
    dataset = bc_dataset(read.table)
    dataset, dropped = drop_overlong(dataset, tokenizer, cfg.max_length, ("completion",))
    return dataset, dropped, {}


def _make_trainer(cfg: BCConfig, model, tokenizer, dataset, callbacks: list):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        **common_training_args(cfg),
        completion_only_loss=True,
        max_length=None,  # over-long rows were dropped; never cut a completion off
        dataset_num_proc=None,
    )
    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)


def train_bc(cfg: BCConfig) -> TrainResult:
    """Train a LoRA adapter on bc_rows; returns where it is and how to serve it."""
    from halo_train.vlm import job_spec_for

    return run_job(cfg, job_spec_for(cfg, JobSpec(make_dataset=_make_dataset, make_trainer=_make_trainer)))
