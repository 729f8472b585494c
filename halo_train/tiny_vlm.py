"""A tiny Qwen2-VL-style vision-language model and processor, built locally in seconds (no download).

    halo-train make-tiny-model --vision models/tiny-vlm

    from halo_train.tiny_vlm import build_tiny_vlm
    path = build_tiny_vlm("models/tiny-vlm")

The folder loads with ``AutoModelForImageTextToText`` and ``AutoProcessor`` like a
real Qwen2-VL checkpoint: ``Qwen2VLForConditionalGeneration`` (a 2-block vision
tower of width 32 and a 2-layer language model of hidden size 64), the byte-level
BPE tokenizer of ``tiny_model`` with Qwen2-VL's vision tokens, Qwen2-VL's chat
template (an image part becomes ``<|vision_start|><|image_pad|><|vision_end|>``,
expanded by the processor to one pad per merged 28x28 patch) and a
``Qwen2VLImageProcessor`` that caps images at ``MAX_PIXELS`` so a MiniWoB
screenshot (500x320) costs a few dozen image tokens. Enough for CI to train and
serve a real VLM on CPU, not for skill.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from halo_agent.vlm import save_processor
from halo_train.tiny_model import IM_END, IM_START, PAD_TOKEN, build_tokenizer

log = logging.getLogger(__name__)

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VLM_SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# 28x28 pixels become one image token after the 2x2 merge: at most 48 image tokens per screenshot.
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 48

# Qwen2-VL's chat template (images only): an image part, whatever its key, is the vision block.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_processor(tokenizer):
    import importlib.util

    import transformers
    from transformers import Qwen2VLImageProcessor

    from halo_agent.vlm import image_only_processor_class

    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor_cls = transformers.Qwen2VLProcessor
    video_processor = None
    if importlib.util.find_spec("torchvision") is not None:
        video_processor = transformers.Qwen2VLVideoProcessor()
    else:
        processor_cls = image_only_processor_class(processor_cls)
    return processor_cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                         chat_template=VLM_CHAT_TEMPLATE)


def build_vlm(tokenizer, seed: int = 0):
    """A randomly initialised Qwen2VLForConditionalGeneration sized for CPU tests."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
            # head_dim 16: the rotary half (8) split over (time, height, width)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        ),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
    )
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False, max_new_tokens=16
    )
    return model


def build_tiny_vlm(out_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write a tiny VLM, its tokenizer and processor to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(special_tokens=VLM_SPECIAL_TOKENS, chat_template=VLM_CHAT_TEMPLATE)
    processor = build_processor(tokenizer)
    model = build_vlm(tokenizer, seed=seed)
    model.save_pretrained(out)
    save_processor(processor, out)
    model.generation_config.save_pretrained(out)
    (out / "halo_tiny_model.json").write_text(
        json.dumps({"kind": "halo-tiny-vlm", "vocab_size": len(tokenizer), "max_pixels": MAX_PIXELS}, indent=2)
    )
    log.info("tiny VLM written to %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
    return out
