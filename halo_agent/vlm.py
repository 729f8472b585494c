"""Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): detection, loading, and chat messages -> model inputs.

    if is_vlm(path):
        processor, model = load_processor(path), load_vlm(path)
        inputs = encode_prompt(processor, messages, images)     # input_ids, pixel_values, image_grid_thw, ...

One function turns chat messages plus decoded images into model inputs, for the
chat server (images from base64 ``image_url`` parts) and for training
(``halo_train.vlm``: images from the lake's ``screenshots`` table by hash), so
both see the same tokens: the processor's chat template places the vision block
where the image part stands, and the processor expands it to one pad token per
merged patch, as vLLM does.

Without torchvision (CPU installs), transformers cannot build these processors
(their video processor needs it); ``load_processor`` then builds the same
processor without a video processor. Images work the same; videos are refused.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

log = logging.getLogger(__name__)

# config.json model_type of the vision-language models HALO trains and serves.
VLM_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
IMAGE_PART_TYPES = ("image_url", "image_ref", "image", "input_image")


class VLMError(ValueError):
    """A vision-language input that cannot be built; the message says what is wrong."""


def model_type(path: str | os.PathLike[str], local_files_only: bool = False) -> str | None:
    """``model_type`` from a model folder's config.json (or the hub's, through AutoConfig)."""
    config = Path(path).expanduser() / "config.json"
    if config.is_file():
        return json.loads(config.read_text()).get("model_type")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(path), local_files_only=local_files_only).model_type
    except (OSError, ValueError):
        return None


def is_vlm(path: str | os.PathLike[str], local_files_only: bool = False) -> bool:
    """A Qwen-VL model. With ``local_files_only``, a hub id not in the local cache is judged by its name."""
    kind = model_type(path, local_files_only)
    if kind is None and local_files_only:
        return bool(re.search(r"qwen[\d.]*-vl", str(path), re.IGNORECASE))
    return kind in VLM_MODEL_TYPES


def image_only_processor_class(processor_cls: type) -> type:
    """``processor_cls`` accepting a missing video processor (transformers checks it against a torchvision class)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return processor_cls.check_argument_for_proper_class(self, argument_name, argument)

    def save_pretrained(self, save_directory, **kwargs):
        save_processor(self, save_directory)

    return type(processor_cls.__name__, (processor_cls,), {
        "check_argument_for_proper_class": check_argument_for_proper_class, "save_pretrained": save_pretrained,
    })


def load_processor(path: str | os.PathLike[str]):
    """The model's processor; without torchvision, the same processor class with images only."""
    import importlib.util

    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    path = str(path)
    if importlib.util.find_spec("torchvision") is not None:
        try:
            return AutoProcessor.from_pretrained(path)
        except (OSError, ValueError, TypeError) as e:  # e.g. a folder saved without a video processor config
            log.info("AutoProcessor cannot load %s (%s): building its image processor and tokenizer", path, str(e).splitlines()[0])
    import transformers

    config = json.loads((Path(path) / "processor_config.json").read_text()) if (Path(path) / "processor_config.json").is_file() else {}
    name = config.get("processor_class") or _processor_class_name(path)
    processor_cls = image_only_processor_class(getattr(transformers, name))
    chat_template_file = Path(path) / "chat_template.jinja"
    chat_template = chat_template_file.read_text() if chat_template_file.is_file() else None
    return processor_cls(
        image_processor=AutoImageProcessor.from_pretrained(path),
        tokenizer=AutoTokenizer.from_pretrained(path),
        video_processor=None,
        chat_template=chat_template,
    )


def _processor_class_name(path: str) -> str:
    kind = model_type(path)
    names = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
             "qwen3_vl": "Qwen3VLProcessor", "qwen3_vl_moe": "Qwen3VLProcessor"}
    if kind not in names:
        raise VLMError(f"{path} is not a Qwen-VL model (model_type {kind!r}); HALO serves and trains {', '.join(sorted(names))}")
    return names[kind]


def save_processor(processor, out: str | os.PathLike[str]) -> None:
    """Write the processor's parts so ``load_processor`` / ``AutoProcessor`` find them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(out)
    processor.image_processor.save_pretrained(out)
    (out / "chat_template.jinja").write_text(processor.chat_template)
    base = type(processor).__mro__[1] if type(processor).__module__ == __name__ else type(processor)
    (out / "processor_config.json").write_text(json.dumps({"processor_class": base.__name__}, indent=2))


def load_vlm(path: str | os.PathLike[str], dtype=None):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype)


# ---------------------------------------------------------------------------- messages and images


def decode_image(data: bytes):
    """PNG/WebP/JPEG bytes as an RGB PIL image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def data_url_bytes(url: str) -> bytes:
    header, _, data = url.partition(",")
    if not header.startswith("data:image/") or ";base64" not in header:
        raise VLMError("image urls must be base64 data URLs (data:image/<format>;base64,...)")
    return base64.b64decode(data)


def image_key(part: Mapping[str, Any]) -> str:
    """What identifies an image part: its screenshot hash, or its data URL."""
    if part.get("type") == "image_ref":
        return str(part["hash"])
    image = part.get("image_url")
    return image.get("url") if isinstance(image, Mapping) else str(image)


def processor_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages for the processor's chat template (each image part as ``{"type": "image"}``) and the
    keys of their images in order (``image_key``)."""
    out, keys = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") in IMAGE_PART_TYPES:
                    keys.append(image_key(p))
                    parts.append({"type": "image"})
                elif p.get("type") == "text":
                    parts.append({"type": "text", "text": p.get("text", "")})
            content = parts
        out.append({"role": m.get("role", "user"), "content": content if content is not None else ""})
    return out, keys


def prompt_text(processor, messages: Sequence[Mapping[str, Any]]) -> str:
    """The processor-format ``messages`` under the chat template, assistant turn opened."""
    return processor.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def encode_prompt(processor, messages: Sequence[Mapping[str, Any]], images: Sequence[Any]):
    """Model inputs (a BatchFeature of one row) for processor-format ``messages`` and their PIL ``images``."""
    text = prompt_text(processor, messages)
    return processor(text=[text], images=list(images) or None, return_tensors="pt")


def encode_request(processor, messages: Sequence[Mapping[str, Any]]):
    """Model inputs for OpenAI-style chat messages whose images are base64 ``image_url`` parts."""
    converted, keys = processor_messages(messages)
    decoded: dict[str, Any] = {}
    for key in keys:
        if key not in decoded:
            decoded[key] = decode_image(data_url_bytes(key))
    return encode_prompt(processor, converted, [decoded[k] for k in keys])


def image_token_count(inputs, processor) -> int:
    """Image pad tokens in ``inputs`` (what the images cost the language model)."""
    image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int((inputs["input_ids"] == image_token_id).sum())
