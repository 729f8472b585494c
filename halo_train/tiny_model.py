"""A tiny Qwen2-style causal LM and tokenizer, built locally in seconds (no download).

    halo-train make-tiny-model models/tiny                        # random weights
    halo-train make-tiny-model models/tiny --warmup-lake lake     # + a short SFT on bc_rows

    from halo_train.tiny_model import build_tiny_model
    path = build_tiny_model("models/tiny", warmup_lake="lake", steps=60)

The tokenizer is a byte-level BPE (vocabulary ~512) trained on the prompt
renderer's own text and on BrowserGym action strings (a larger ``vocab_size`` adds MiniWoB's
button and tab words, element ids 10-199 and '#1'...'#9' as whole tokens), wrapped as a
``PreTrainedTokenizerFast`` with Qwen's ChatML template (``<|im_start|>`` /
``<|im_end|>``), so chat prompts, TRL and vLLM-style serving work as with a real
Qwen model. The model is ``Qwen2ForCausalLM`` with hidden size 64, 2 layers and
4 heads. Warmed up on a lake's bc_rows, its greedy outputs parse as actions such
as ``click('12')`` — enough for smoke tests, CI and demos, not for skill.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterator

from halo_data import prompts

log = logging.getLogger(__name__)

VOCAB_SIZE = 512
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen2.5's ChatML template without tool calls: the prompt rendered alone with
# add_generation_prompt is a prefix of prompt + completion, which completion-only
# losses rely on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ROLES = ("button", "link", "textbox", "checkbox", "combobox", "heading", "StaticText", "RootWebArea", "option", "menuitem")
# Words MiniWoB pages show on buttons and tabs: a larger vocabulary makes each one token.
_UI_WORDS = ("submit", "okay", "ok", "yes", "no", "cancel", "next", "previous", "Ok", "Okay", "Cancel", "Tab", "tab", "link")
_WORDS = ("Submit", "Cancel", "Search", "Home", "Next", "Previous", "Login", "Email", "Password", "Name", "OK", "Yes", "No")


def _corpus(ui_words: bool = False) -> Iterator[str]:
    """Text the tokenizer should compress well: the renderer's prompts and action strings (and page words)."""
    if ui_words:
        for k in range(40):
            yield "\n".join(f'[{k + j}] button \'{w}\' Click on the "{w}" button. Tab #{j % 4}' for j, w in enumerate(_UI_WORDS))
        for _ in range(4):
            yield "\n".join(f"Click on Tab #{n}. [{n + 20}] tab 'Tab #{n}'" for n in range(1, 10))
    yield prompts.SYSTEM_PROMPT
    yield prompts.SYSTEM_PROMPT_SCREENSHOT
    for i in range(300):
        yield f"click('{i}')"
        yield f"fill('{i}', '{_WORDS[i % len(_WORDS)]}')"
        yield f"select_option('{i}', '{_WORDS[(i + 3) % len(_WORDS)]}')"
        yield f"press('{i}', 'Enter')"
    yield "scroll(0, 200)\nnoop()\nsend_msg_to_user('done')\nmouse_click(100, 200)\nkeyboard_type('text')"
    for k in range(60):
        elements = "\n".join(
            f"  [{k + j}] {_ROLES[(k + j) % len(_ROLES)]} '{_WORDS[(k * j) % len(_WORDS)]}'" for j in range(8)
        )
        observation = f"RootWebArea 'Page {k}'\n{elements}"
        history = [f"click('{k + j}')" for j in range(k % 4)]
        yield prompts.dumps(
            prompts.render_messages(f"Click the {_WORDS[k % len(_WORDS)]} button.", f"file:///miniwob/task-{k}.html", observation, history)
        )
        for m in prompts.render_messages(f"Enter {_WORDS[k % len(_WORDS)]} and press Submit.", f"http://localhost/{k}", observation, history):
            yield f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"


def build_tokenizer(
    vocab_size: int = VOCAB_SIZE, special_tokens: tuple[str, ...] = SPECIAL_TOKENS, chat_template: str = CHAT_TEMPLATE
):
    """A byte-level BPE tokenizer with Qwen's special tokens, chat template and pre-tokenizer (so a saved and
    reloaded tokenizer splits text exactly as this one does); above 512 entries, MiniWoB's words are whole tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    # The pipeline Qwen2Tokenizer rebuilds when AutoTokenizer loads a qwen2 checkpoint (NFC, Qwen's split, byte
    # level): trained with it, the merges are the ones every later load applies. Digits are single pieces, as in
    # Qwen: an id '19' is '1' '9', 'Tab #2' is 'Tab', ' #', '2'.
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    ui_words = vocab_size > VOCAB_SIZE
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(ui_words=ui_words), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        model_max_length=8192,
        padding_side="right",
    )
    fast.chat_template = chat_template
    return fast


def build_model(tokenizer, seed: int = 0, hidden_size: int = 64, layers: int = 2):
    """A randomly initialised Qwen2ForCausalLM sized for seconds-long CPU training (by default)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False, max_new_tokens=16
    )
    return model


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    warmup_lake: str | os.PathLike[str] | None = None,
    steps: int = 60,
    seed: int = 0,
    lr: float = 3e-3,
    where: str | None = None,
    batch_size: int = 8,
    hidden_size: int = 64,
    layers: int = 2,
    vocab_size: int = VOCAB_SIZE,
    top_percent: float | None = None,
) -> Path:
    """Write a tiny model + tokenizer to ``out_dir``; with ``warmup_lake``, first fine-tune it on bc_rows for ``steps``.

    ``top_percent`` is bc_rows' cut of the progress ranking (the view's default when None); 100 takes
    every valid step, whatever its episode's outcome: a warm start on the action format only.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    model = build_model(tokenizer, seed=seed, hidden_size=hidden_size, layers=layers)
    warmup: dict = {"steps": 0}
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if warmup_lake is not None:
        from transformers import AutoTokenizer

        # Warm up with the tokenizer as every later job loads it (AutoTokenizer on the saved folder).
        loaded = AutoTokenizer.from_pretrained(out)
        view_params = {} if top_percent is None else {"top_percent": float(top_percent)}
        warmup = _warm_up(model, loaded, str(warmup_lake), steps=steps, seed=seed, lr=lr, where=where,
                          batch_size=batch_size, view_params=view_params)
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    (out / "halo_tiny_model.json").write_text(
        json.dumps({"kind": "halo-tiny-model", "vocab_size": len(tokenizer), "warmup": warmup}, indent=2)
    )
    log.info("tiny model written to %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
    return out


def _warm_up(model, tokenizer, lake: str, steps: int, seed: int, lr: float, where: str | None, batch_size: int,
             view_params: dict) -> dict:
    """Full fine-tuning on bc_rows, so the model's outputs already look like actions."""
    import tempfile

    from trl import SFTConfig, SFTTrainer

    from halo_train.data import EMPTY_VIEW_HINTS, EmptyViewError, bc_dataset, read_view
    from halo_train.trainer_utils import activation_checkpointing, quiet_hub, show_progress

    quiet_hub()
    read = read_view(lake, "bc_rows", where=where, view_params=view_params, job_type="bc")
    if read.table.num_rows == 0:
        raise EmptyViewError(f"{EMPTY_VIEW_HINTS['bc_rows']}; lake: {lake}")
    # The view returns rows in the order of the lake's files; sorted, the same rows warm up the same model in any lake.
    dataset = bc_dataset(read.table.sort_by([("prompt", "ascending"), ("completion", "ascending")]))
    with tempfile.TemporaryDirectory(prefix="halo-tiny-warmup-") as tmp:
        args = SFTConfig(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            learning_rate=lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            logging_steps=max(1, steps // 4),
            save_strategy="no",
            report_to="none",
            seed=seed,
            bf16=False,
            **activation_checkpointing(False),
            max_length=None,
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        show_progress(trainer, "warm-up")
        result = trainer.train()
    model.cpu()
    return {"steps": steps, "batch_size": batch_size, "rows": len(dataset), "final_loss": float(result.training_loss),
            "lineage": read.lineage, "where": where, "view_params": view_params}
