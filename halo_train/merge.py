"""Merge a LoRA adapter into its base model: a plain model folder any server loads without LoRA support.

    halo-train merge --adapter out/dpo/final --output models/dpo-merged
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from halo_train.config import TrainConfigError

log = logging.getLogger(__name__)


def merge_adapter(adapter: str | os.PathLike[str], output: str | os.PathLike[str], base_model: str | None = None) -> Path:
    """Load ``base_model`` (the adapter's own base by default), apply the adapter, merge, save to ``output``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.config import base_model_path
    from halo_train.trainer_utils import quiet_hub

    quiet_hub()
    adapter = Path(adapter)
    config_path = adapter / "adapter_config.json"
    if not config_path.exists():
        raise TrainConfigError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json): pass OUTPUT_DIR/final")
    base = base_model or json.loads(config_path.read_text()).get("base_model_name_or_path")
    if not base:
        raise TrainConfigError(f"{config_path} names no base model: pass --base-model")
    base = base_model_path(base)
    out = Path(output)
    if out.exists() and any(out.iterdir()):
        raise TrainConfigError(f"{out} exists and is not empty: choose a new --output folder")
    try:
        model = AutoModelForCausalLM.from_pretrained(base)
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"cannot load base model {base}: {str(e).splitlines()[0]}") from None
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tokenizer_source = adapter if (adapter / "tokenizer_config.json").exists() else base
    AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(out)
    log.info("merged %s into %s -> %s", adapter, base, out)
    return out
