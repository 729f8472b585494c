"""LoRA adapters on a base model: a fresh one's configuration, and a saved one attached to train on."""

from __future__ import annotations

import logging
from pathlib import Path

from halo_train.config import TrainConfig, TrainConfigError

log = logging.getLogger(__name__)


def lora_config(cfg: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def new_adapter(model, config, seed: int):
    """``model`` with a fresh LoRA adapter (``config``) whose A matrices are drawn from ``seed``: one training seed,
    one initial adapter, as with unsloth's ``random_state`` (B starts at zero). The draws come from a forked RNG:
    the caller's generators (the job's dropout, its sampling) are as they were before the call."""
    import torch
    from peft import get_peft_model

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def warm_start(model, adapter_dir: str, lora_dropout: float):
    """``model`` with the adapter in ``adapter_dir`` attached and trainable: its saved weights, rank and targets, and
    this job's ``lora_dropout`` (dropout is how a job trains, not part of what the adapter computes; a job that
    takes importance ratios passes 0, ``halo_train.backends.scoring_dropout``)."""
    from peft import PeftConfig, PeftModel

    path = str(Path(adapter_dir).expanduser())
    try:
        config = PeftConfig.from_pretrained(path)
        if hasattr(config, "lora_dropout"):
            config.lora_dropout = float(lora_dropout)
        model = PeftModel.from_pretrained(model, path, config=config, is_trainable=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise TrainConfigError(f"cannot load --init-adapter {adapter_dir}: {str(e).splitlines()[0]}") from None
    log.info("warm start from adapter %s", adapter_dir)
    return model
