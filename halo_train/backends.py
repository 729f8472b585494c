"""Loading a base model with fresh LoRA weights: unsloth on a CUDA GPU where installed, plain peft otherwise.
A vision-language model gets LoRA on its language model only; its vision tower stays frozen.

``--backend auto`` picks unsloth when a CUDA GPU is visible and ``import unsloth``
works, and peft everywhere else; ``--backend unsloth`` without either is an
error that says so. unsloth stays an optional import: nothing here imports it
unless it is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
from typing import Any, Sequence

from halo_train.config import TrainConfig, TrainConfigError, base_model_path
from halo_train.lora import lora_config, new_adapter, warm_start

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedModel:
    model: Any  # a peft.PeftModel with trainable LoRA weights
    tokenizer: Any
    backend: str


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def unsloth_installed() -> bool:
    return importlib.util.find_spec("unsloth") is not None


def resolve_backend(requested: str) -> str:
    if requested == "peft":
        return "peft"
    if requested == "unsloth":
        if not cuda_available():
            raise TrainConfigError("--backend unsloth needs a CUDA GPU; none is visible: use --backend peft")
        if not unsloth_installed():
            raise TrainConfigError("--backend unsloth needs the unsloth package: pip install 'halo[gpu]', or use --backend peft")
        return "unsloth"
    return "unsloth" if cuda_available() and unsloth_installed() else "peft"


def training_dtype():
    import torch

    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"cannot load the tokenizer of base model {name}: {str(e).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise TrainConfigError(f"base model {name} has no chat template: use an instruct/chat model")
    return tokenizer


def load_for_training(cfg: TrainConfig) -> LoadedModel:
    """The base model with fresh (or --init-adapter) LoRA weights; for a vision-language model, ``tokenizer`` is its processor."""
    from halo_agent.vlm import is_vlm

    backend = resolve_backend(cfg.backend)
    name = base_model_path(cfg.base_model)
    if backend == "unsloth" and cfg.init_adapter:
        raise TrainConfigError("--init-adapter is not supported with --backend unsloth yet: use --backend peft")
    if is_vlm(name):
        return _load_vlm(cfg, name, backend)
    if backend == "unsloth":
        return _load_unsloth(cfg, name)
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=training_dtype())
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"cannot load base model {name}: {str(e).splitlines()[0]}") from None
    missing = [m for m in cfg.target_modules if not any(n.endswith("." + m) or n == m for n, _ in model.named_modules())]
    if missing:
        raise TrainConfigError(
            f"--target-modules {', '.join(missing)} not found in {name}: choose among its linear layers, e.g. q_proj,v_proj"
        )
    if cfg.init_adapter:
        model = warm_start(model, cfg.init_adapter, scoring_dropout(cfg))
    else:
        model = new_adapter(model, lora_config(cfg), cfg.seed)
        log.info("loaded %s with LoRA r=%d through peft", name, cfg.lora_r)
    if takes_ratios(cfg):
        disable_dropout(model)
    return LoadedModel(model, tokenizer, "peft")


def takes_ratios(cfg: TrainConfig) -> bool:
    """Does the job weigh stored rows by an importance ratio against the logprobs they were sampled with (GRPO,
    online GRPO, PPO)? Such a job scores with dropout off."""
    return hasattr(cfg, "epsilon") or hasattr(cfg, "clip_range")


def scoring_dropout(cfg: TrainConfig) -> float:
    """The LoRA dropout the job's forwards apply: none for a job that takes ratios (its scores are compared with the
    logprobs the engine stored, which no dropout shaped: with dropout on, a warm-started adapter's ratios start
    at up to 1.2 instead of 1), else ``--lora-dropout``."""
    if takes_ratios(cfg):
        if cfg.lora_dropout > 0:
            log.info("--lora-dropout %g not applied: %s scores importance ratios with dropout off", cfg.lora_dropout,
                     type(cfg).__name__.removesuffix("Config"))
        return 0.0
    return cfg.lora_dropout


def disable_dropout(model) -> None:
    """Every dropout layer of ``model`` (LoRA's and the base model's) set to p = 0, in train mode too: the forward a
    ratio is taken on is the deterministic one the engine computed (TRL's ``disable_dropout_in_model``)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _load_vlm(cfg: TrainConfig, name: str, backend: str) -> LoadedModel:
    if backend == "unsloth":
        return _load_unsloth_vision(cfg, name)
    model, processor = load_vlm_for_training(cfg, name, training_dtype())
    return LoadedModel(model, processor, "peft")


def _load_unsloth_vision(cfg: TrainConfig, name: str) -> LoadedModel:
    from unsloth import FastVisionModel  # optional GPU extra

    model, processor = FastVisionModel.from_pretrained(model_name=name, load_in_4bit=False)
    model = FastVisionModel.get_peft_model(
        model,
        finetune_vision_layers=False,  # the vision tower stays frozen
        finetune_language_layers=True,
        finetune_attention_modules=True,
        finetune_mlp_modules=True,
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        bias="none",
        random_state=cfg.seed,
        use_gradient_checkpointing="unsloth" if cfg.gradient_checkpointing is not False else False,
    )
    FastVisionModel.for_training(model)
    check_vision_frozen(model)
    log.info("loaded VLM %s with LoRA r=%d through unsloth", name, cfg.lora_r)
    return LoadedModel(model, processor, "unsloth")


def language_model_targets(model, target_modules: Sequence[str]) -> list[str]:
    """Names of the LoRA target modules that belong to the language model (never the vision tower)."""
    wanted = set(target_modules)
    names = [n for n, _ in model.named_modules() if "language_model" in n and n.rsplit(".", 1)[-1] in wanted]
    if not names:
        raise TrainConfigError(
            f"--target-modules {', '.join(target_modules)} match no layer of the language model: "
            "use its linear layers, e.g. q_proj,v_proj"
        )
    return names


def load_vlm_for_training(cfg: TrainConfig, name: str, dtype):
    """A Qwen-VL model with LoRA on the language model only, and its processor."""
    from peft import LoraConfig

    from halo_agent.vlm import load_processor, load_vlm

    try:
        processor = load_processor(name)
        model = load_vlm(name, dtype=dtype)
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"cannot load vision-language base model {name}: {str(e).splitlines()[0]}") from None
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    targets = language_model_targets(model, cfg.target_modules)
    if cfg.init_adapter:
        model = warm_start(model, cfg.init_adapter, cfg.lora_dropout)
    else:
        # An explicit regex of full names: peft would otherwise also match the vision tower's
        # gate/up/down projections (Qwen2.5-VL, Qwen3-VL) by suffix.
        pattern = "|".join(re.escape(t) for t in targets)
        config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                            target_modules=f"^(?:{pattern})$", bias="none", task_type="CAUSAL_LM")
        model = new_adapter(model, config, cfg.seed)
    check_vision_frozen(model)
    log.info("loaded VLM %s with LoRA r=%d on %d language-model layers", name, cfg.lora_r, len(targets))
    return model, processor


def vision_parameters(model) -> dict[str, Any]:
    return {n: p for n, p in model.named_parameters() if ".visual." in f".{n}" or n.startswith("visual.")}


def check_vision_frozen(model) -> None:
    trainable = [n for n, p in vision_parameters(model).items() if p.requires_grad]
    if trainable:
        raise TrainConfigError(f"the vision tower would train ({trainable[0]}, ...): LoRA goes on the language model only")


def _load_unsloth(cfg: TrainConfig, name: str) -> LoadedModel:
    from unsloth import FastLanguageModel  # optional GPU extra

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=name,
        max_seq_length=cfg.max_length or 4096,
        dtype=None,
        load_in_4bit=False,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=scoring_dropout(cfg),  # unsloth: dropout off where ratios are taken
        target_modules=list(cfg.target_modules),
        bias="none",
        use_gradient_checkpointing="unsloth" if cfg.gradient_checkpointing is not False else False,
        random_state=cfg.seed,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s with LoRA r=%d through unsloth", name, cfg.lora_r)
    return LoadedModel(model, tokenizer, "unsloth")


def lora_state(model) -> dict[str, Any]:
    """A copy of the trainable LoRA weights (to check that training moved them)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if "lora_" in n}
