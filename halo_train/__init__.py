"""HALO training jobs: BC, DPO and GRPO over the lake's views, writing LoRA adapters and metrics.

    from halo_train import BCConfig, train_bc
    result = train_bc(BCConfig(lake="lake", base_model="models/tiny", max_steps=5))
    print(result.serve_command)

The jobs import torch, transformers, trl and peft (the ``halo[train]`` extra)
only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from halo_train.config import BCConfig, DPOConfig, GRPOConfig, TrainConfigError, load_config

if TYPE_CHECKING:
    from halo_train.trainer_utils import TrainResult

__all__ = [
    "BCConfig", "DPOConfig", "GRPOConfig", "TrainConfigError", "load_config",
    "train_bc", "train_dpo", "train_grpo", "merge_adapter", "build_tiny_model",
]


def train_bc(cfg: BCConfig) -> "TrainResult":
    from halo_train.bc import train_bc as run

    return run(cfg)


def train_dpo(cfg: DPOConfig) -> "TrainResult":
    from halo_train.dpo import train_dpo as run

    return run(cfg)


def train_grpo(cfg: GRPOConfig) -> "TrainResult":
    from halo_train.grpo import train_grpo as run

    return run(cfg)


def merge_adapter(adapter: Any, output: Any, base_model: str | None = None):
    from halo_train.merge import merge_adapter as run

    return run(adapter, output, base_model)


def build_tiny_model(out_dir: Any, warmup_lake: Any = None, steps: int = 60, **kw: Any):
    from halo_train.tiny_model import build_tiny_model as run

    return run(out_dir, warmup_lake=warmup_lake, steps=steps, **kw)
