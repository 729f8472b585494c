"""HALO training jobs: BC, DPO and GRPO over the lake's views, writing LoRA adapters and metrics."""
