"""The tiny Qwen2-style model: built locally in seconds, ChatML-compatible, and after a warm-up its outputs parse as actions."""

from __future__ import annotations

import json
import re

import pytest

from halo_data.lake import Lake
from halo_train.data import prompt_messages
from halo_train.testing import fixture_prompts, write_fixture_episodes
from halo_train.tiny_model import build_tiny_model, build_tokenizer

ACTION = re.compile(r"^(click|fill|select_option|press)\('\d+'(, '[^']*')?\)$|^(scroll\(-?\d+, -?\d+\)|noop\(\))$")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_round_trips_and_keeps_chatml_prefixes(tokenizer):
    assert 300 <= len(tokenizer) <= 512
    text = "click('12')\nfill('3', 'hello wörld')"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    messages = prompt_messages(fixture_prompts()[0])
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "click('10')"}], tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n") and full.startswith(prompt)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids  # completion-only losses need the prompt's tokens as a prefix
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    assert len(prompt_ids) < 400  # the renderer's text compresses well with its own vocabulary


@pytest.mark.slow
def test_warmed_up_model_answers_with_actions(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake)
    path = build_tiny_model(tmp_path / "tiny", warmup_lake=tmp_path / "lake", steps=30, batch_size=4, lr=5e-3)
    info = json.loads((path / "halo_tiny_model.json").read_text())
    assert info["warmup"]["steps"] == 30 and info["warmup"]["rows"] == 16 and info["warmup"]["lineage"]["steps"] >= 1

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    config = model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == ("qwen2", 64, 2, 4)
    for prompt_json in fixture_prompts():
        text = tok.apply_chat_template(prompt_messages(prompt_json), tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=12, do_sample=False)
        answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        assert ACTION.match(answer), answer


@pytest.mark.slow
def test_the_warm_up_trains_the_same_model_from_the_same_rows_in_any_order(tmp_path, monkeypatch):
    """The view lists rows in the order of the lake's files, which no job controls. One build reads the view
    as it comes, the other reads the same rows reversed: the warmed-up models are the same to the bit."""
    import dataclasses

    from safetensors.torch import load_file

    import halo_train.data as data

    lake = Lake.init(tmp_path / "lake")
    for n_steps in (2, 3):
        write_fixture_episodes(lake, run_id=f"fixture-{n_steps}", n_tasks=2, attempts=2, n_steps=n_steps)
    real_read_view, seen = data.read_view, []

    def reversed_read_view(*args, **kwargs):
        read = real_read_view(*args, **kwargs)
        rows = read.table.take(list(reversed(range(read.table.num_rows))))
        seen.append((read.table.column("prompt").to_pylist(), rows.column("prompt").to_pylist()))
        return dataclasses.replace(read, table=rows)

    built = [build_tiny_model(tmp_path / "tiny-a", warmup_lake=tmp_path / "lake", steps=6, batch_size=4, lr=5e-3)]
    monkeypatch.setattr(data, "read_view", reversed_read_view)
    built.append(build_tiny_model(tmp_path / "tiny-b", warmup_lake=tmp_path / "lake", steps=6, batch_size=4, lr=5e-3))
    (as_read, as_given), = seen
    assert as_read != as_given and sorted(as_read) == sorted(as_given)
    weights = [load_file(str(path / "model.safetensors")) for path in built]
    assert weights[0].keys() == weights[1].keys()
    assert all(bool((weights[0][k] == weights[1][k]).all()) for k in weights[0])


@pytest.mark.parametrize("vocab_size", [512, 1024])
def test_the_saved_tokenizer_splits_text_as_every_job_loads_it(tmp_path, vocab_size):
    """AutoTokenizer loads a qwen2 folder as Qwen2Tokenizer, which rebuilds Qwen's pre-tokenizer: the built
    tokenizer uses the same one, so the warm-up, the trainer and the chat server see the same token ids."""
    from transformers import AutoTokenizer

    built = build_tokenizer(vocab_size)
    loaded = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny", vocab_size=vocab_size))
    for text in ["Goal: Click on Tab #2.\n[19] link 'Tab #2'", "# 'Tab #1'\nclick('145')", "fill('3', 'hello wörld')  okay"]:
        assert built(text)["input_ids"] == loaded(text)["input_ids"], text
        assert loaded.decode(loaded(text)["input_ids"]) == text
    if vocab_size > 512:  # MiniWoB's words are whole tokens; digits are single, as in Qwen
        pieces = [loaded.decode([i]) for i in loaded("Click on Tab #2. 'okay' [19]")["input_ids"]]
        assert pieces == ["Click", " on", " Tab", " #", "2", ".", " '", "okay", "'", " [", "1", "9", "]"]
