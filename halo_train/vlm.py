"""Training a vision-language base model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) on the lake's screenshots.

    halo-train make-tiny-model --vision models/tiny-vlm
    halo-train bc  --lake lake --base-model models/tiny-vlm --max-steps 5 --output-dir out/bc-vlm
    halo-train dpo --lake lake --base-model models/tiny-vlm --max-steps 5 --output-dir out/dpo-vlm

``bc``, ``dpo`` and ``grpo`` switch to this path when the base model's config is a
Qwen-VL one (``halo_agent.vlm.is_vlm``). What changes:

- Rows carry a screenshot hash, never image bytes: the view's rows are joined to
  their step's ``screenshot_hash`` (the chosen step's, for DPO pairs). A prompt
  already stored with an image (screenshot mode) keeps its own; a text prompt (a
  text or random policy's step) is rendered as screenshot mode renders it
  (``halo_data.prompts.with_screenshot``), so any step trains a VLM.
- Images are read from the ``screenshots`` table when a batch is built (the lake
  snapshot the job pinned), each distinct hash decoded once per batch; nothing is
  base64-encoded or written anywhere. A hash missing from the lake stops the job
  with one line naming it, before training starts.
- Prompts go through the same ``halo_agent.vlm.encode_prompt`` the chat server
  uses (processor chat template, one pad token per merged image patch); the
  completion's tokens and the end-of-turn token follow.
- LoRA goes on the language model's linear layers only (``--target-modules``
  matched under ``language_model``); the vision tower and the merger stay frozen.
  ``training_stats.json`` says so under ``vlm``, with image counts and tokens.

DPO on a VLM is computed here (TRL's DPOTrainer does not read images from the
lake): sigmoid, ipo or hinge losses against the base model (the adapter switched
off), with TRL's ``rewards/*`` metrics. GRPO reuses ``grpo``'s stored-groups loss.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import defaultdict
from typing import Any, Iterable, Sequence

from halo_data import prompts
from halo_train.backends import vision_parameters
from halo_train.config import TrainConfig, TrainConfigError

log = logging.getLogger(__name__)

# The views' rows with their step's screenshot hash (the chosen step's for a DPO pair).
SCREENSHOT_SQL = {
    "bc": "SELECT selected.*, s.screenshot_hash FROM selected LEFT JOIN steps AS s USING (episode_id, step_idx)",
    "dpo": (
        "SELECT selected.*, s.screenshot_hash FROM selected LEFT JOIN steps AS s "
        "ON s.episode_id = selected.chosen_episode_id AND s.step_idx = selected.chosen_step_idx"
    ),
}
VLM_DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
SHA256 = re.compile(r"[0-9a-f]{64}")


class MissingScreenshotError(TrainConfigError):
    """A prompt refers to a screenshot hash the lake's screenshots table does not hold."""


# ---------------------------------------------------------------------------- model


def vlm_stats(model, processor) -> dict[str, Any]:
    """What training_stats.json says under ``vlm``; the batch counters start at 0 and the collator adds to them."""
    lora = [n for n, p in model.named_parameters() if p.requires_grad]
    return {
        "model_type": getattr(getattr(model, "config", None), "model_type", None),
        "processor": type(processor).__name__,
        "lora_on": "language_model",
        "vision_tower": "frozen",
        "trainable_parameters": sum(p.numel() for n, p in model.named_parameters() if p.requires_grad),
        "trainable_outside_language_model": [n for n in lora if "language_model" not in n],
        "vision_parameters": sum(p.numel() for p in vision_parameters(model).values()),
        "rows_without_screenshot": 0,
        "batches": 0,
        "images_decoded": 0,
        "image_tokens": 0,
        "pixel_patches": 0,
    }


# ---------------------------------------------------------------------------- rows and images


def row_messages(prompt_json: str, screenshot_hash: str | None) -> list[dict[str, Any]]:
    """The stored prompt as the VLM sees it: its own image, else its step's screenshot where screenshot mode puts it."""
    messages = prompts.loads(prompt_json)
    if screenshot_hash and not prompts.has_image(messages):
        messages = prompts.with_screenshot(messages, screenshot_hash)
    return messages


class ScreenshotStore:
    """Screenshots by hash from the lake snapshot a job read (``lineage``); decodes on request, keeps nothing."""

    def __init__(self, lake_root: str, lineage: dict[str, int]):
        from halo_data.lake import Lake

        self._con = Lake.open(lake_root).connect(as_of=lineage)

    def _where(self, hashes: Sequence[str]) -> str:
        """Inlined, validated literals: DuckDB prunes the hash_prefix partitions only on constants."""
        prefixes = sorted({h[0] for h in hashes})
        return (f"hash_prefix IN ({', '.join(repr(p) for p in prefixes)}) "
                f"AND hash IN ({', '.join(repr(h) for h in hashes)})")

    def present(self, hashes: Iterable[str]) -> set[str]:
        wanted = [h for h in sorted(set(hashes)) if SHA256.fullmatch(h)]  # anything else cannot be in the lake
        if not wanted:
            return set()
        return {r[0] for r in self._con.execute(f"SELECT DISTINCT hash FROM screenshots_all WHERE {self._where(wanted)}").fetchall()}

    def check(self, hashes: Iterable[str]) -> None:
        wanted = set(hashes)
        missing = sorted(wanted - self.present(wanted))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise MissingScreenshotError(
                f"screenshot {missing[0]}{more} is referenced by a prompt but missing from the lake's screenshots table: "
                "collect with screenshots on, or leave those rows out with --where"
            )

    def images(self, hashes: Iterable[str]) -> dict[str, Any]:
        """Each distinct hash decoded once: {hash: RGB PIL image}."""
        from halo_agent.vlm import decode_image

        wanted = sorted(set(hashes))
        valid = [h for h in wanted if SHA256.fullmatch(h)]
        rows = self._con.execute(
            f"SELECT hash, any_value(image) FROM screenshots_all WHERE {self._where(valid)} GROUP BY hash"
        ).fetchall() if valid else []
        found = {h: decode_image(bytes(image)) for h, image in rows}
        self.check_found(wanted, found)
        return found

    def sizes(self, hashes: Iterable[str]) -> dict[str, tuple[int, int]]:
        """(height, width) of each screenshot, from the table's columns (no image read)."""
        valid = sorted({h for h in hashes if SHA256.fullmatch(h)})
        if not valid:
            return {}
        rows = self._con.execute(
            f"SELECT hash, any_value(height), any_value(width) FROM screenshots_all WHERE {self._where(valid)} GROUP BY hash"
        ).fetchall()
        return {h: (int(height), int(width)) for h, height, width in rows}

    @staticmethod
    def check_found(wanted: Sequence[str], found: dict[str, Any]) -> None:
        missing = [h for h in wanted if h not in found]
        if missing:
            raise MissingScreenshotError(f"screenshot {missing[0]} is referenced by a prompt but missing from the lake's screenshots table")


def check_rows(store: ScreenshotStore, rows: Sequence[dict[str, Any]], stats: dict[str, Any]) -> None:
    """Every hash the rows refer to is in the lake; counts rows that have no screenshot at all."""
    hashes: set[str] = set()
    without = 0
    for r in rows:
        found = prompts.image_hashes(row_messages(r["prompt"], r.get("screenshot_hash")))
        hashes.update(found)
        without += not found
    store.check(hashes)
    stats["rows_without_screenshot"] = without
    if without:
        log.warning("%d row(s) have no screenshot (collected with screenshots off): trained on their text alone", without)


# ---------------------------------------------------------------------------- batches


@dataclasses.dataclass
class Encoded:
    input_ids: list[int]
    mm_token_type_ids: list[int]
    completion_mask: list[int]
    pixel_values: Any  # (patches, dim) tensor, or None
    image_grid_thw: Any  # (images, 3) tensor, or None


class VLMBatchEncoder:
    """Prompt (+ images by hash) + completion -> token ids and vision inputs, through ``encode_prompt``."""

    def __init__(self, processor, store: ScreenshotStore, stats: dict[str, Any], max_completion_length: int | None = None):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.store = store
        self.stats = stats
        self.max_completion_length = max_completion_length
        self.eos_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)

    def encode_prompts(self, rows: Sequence[dict[str, Any]]) -> list[Encoded]:
        """The rows' prompts with their images, decoded once per distinct hash in the batch."""
        from halo_agent.vlm import encode_prompt, processor_messages

        prompted = [processor_messages(row_messages(r["prompt"], r.get("screenshot_hash"))) for r in rows]
        images = self.store.images(h for _, keys in prompted for h in keys)
        self.stats["images_decoded"] += len(images)
        out = []
        for messages, keys in prompted:
            inputs = encode_prompt(self.processor, messages, [images[k] for k in keys])
            ids = inputs["input_ids"][0].tolist()
            mm = inputs["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in inputs else [0] * len(ids)
            out.append(Encoded(ids, mm, [0] * len(ids), inputs.get("pixel_values"), inputs.get("image_grid_thw")))
        return out

    def with_completion(self, prompt: Encoded, completion: str | None) -> Encoded:
        """``prompt`` followed by the completion's tokens and the end-of-turn token (what generation stops at)."""
        ids = self.tokenizer(completion or "", add_special_tokens=False)["input_ids"]
        if self.max_completion_length is not None:
            ids = ids[: self.max_completion_length - 1]
        ids = ids + [self.eos_id]
        return dataclasses.replace(
            prompt,
            input_ids=prompt.input_ids + ids,
            mm_token_type_ids=prompt.mm_token_type_ids + [0] * len(ids),
            completion_mask=prompt.completion_mask + [1] * len(ids),
        )

    def encode(self, rows: Sequence[dict[str, Any]], completion_key: str = "completion") -> list[Encoded]:
        return [self.with_completion(p, r[completion_key]) for p, r in zip(self.encode_prompts(rows), rows)]

    def collate(self, encoded: Sequence[Encoded]) -> dict[str, Any]:
        """Right-padded tensors; vision inputs concatenated in row order (as the model consumes them)."""
        import torch

        from halo_agent.vlm import image_token_count

        width = max(len(e.input_ids) for e in encoded)
        pad_id = self.tokenizer.pad_token_id

        def pad(seq: list[int], value: int) -> list[int]:
            return list(seq) + [value] * (width - len(seq))

        batch: dict[str, Any] = {
            "input_ids": torch.tensor([pad(e.input_ids, pad_id) for e in encoded]),
            "attention_mask": torch.tensor([pad([1] * len(e.input_ids), 0) for e in encoded]),
            "mm_token_type_ids": torch.tensor([pad(e.mm_token_type_ids, 0) for e in encoded]),
            "completion_mask": torch.tensor([pad(e.completion_mask, 0) for e in encoded]),
        }
        pixels = [e.pixel_values for e in encoded if e.pixel_values is not None]
        if pixels:
            batch["pixel_values"] = torch.cat(pixels)
            batch["image_grid_thw"] = torch.cat([e.image_grid_thw for e in encoded if e.image_grid_thw is not None])
            self.stats["pixel_patches"] += int(batch["pixel_values"].shape[0])
        self.stats["image_tokens"] += image_token_count(batch, self.processor)
        self.stats["batches"] += 1
        return batch


VISION_INPUTS = ("pixel_values", "image_grid_thw", "mm_token_type_ids")


def model_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """What a forward pass takes from a batch: tokens, mask and the vision inputs where present."""
    keys = ("input_ids", "attention_mask", *VISION_INPUTS)
    return {k: inputs[k] for k in keys if k in inputs}


def completion_token_logps(model, inputs: dict[str, Any]):
    """(B, T-1) log pi of each next token, and the completion mask aligned with it."""
    import torch

    logits = model(**model_inputs(inputs)).logits[:, :-1].float()
    targets = inputs["input_ids"][:, 1:]
    logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, inputs["completion_mask"][:, 1:]


# ---------------------------------------------------------------------------- BC


class BCCollator:
    def __init__(self, encoder: VLMBatchEncoder):
        self.encoder = encoder

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.encoder.collate(self.encoder.encode(rows))
        batch["labels"] = batch["input_ids"].masked_fill(batch.pop("completion_mask") == 0, -100)
        return batch


# ---------------------------------------------------------------------------- DPO


class DPOCollator:
    """Chosen rows, then rejected rows, sharing each pair's prompt encoding."""

    def __init__(self, encoder: VLMBatchEncoder):
        self.encoder = encoder

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        prompts_ = self.encoder.encode_prompts(rows)
        chosen = [self.encoder.with_completion(p, r["chosen"]) for p, r in zip(prompts_, rows)]
        rejected = [self.encoder.with_completion(p, r["rejected"]) for p, r in zip(prompts_, rows)]
        return self.encoder.collate(chosen + rejected)


def dpo_losses(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float, loss_type: str):
    """Per-pair DPO losses from sequence log-probabilities (TRL's sigmoid, ipo and hinge)."""
    import torch.nn.functional as F

    logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * logits)
    if loss_type == "ipo":
        return (logits - 1 / (2 * beta)) ** 2
    if loss_type == "hinge":
        return F.relu(1 - beta * logits)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def make_dpo_trainer_class():
    from transformers import Trainer

    class VLMDPOTrainer(Trainer):
        """DPO over image + text pairs; the reference is the base model (adapter disabled)."""

        def __init__(self, *args, beta: float, loss_types: Sequence[str], loss_weights: Sequence[float] | None, **kwargs):
            super().__init__(*args, **kwargs)
            self.beta = beta
            self.loss_types = list(loss_types)
            self.loss_weights = list(loss_weights) if loss_weights else [1.0] * len(self.loss_types)
            self._metrics: dict[str, list[float]] = defaultdict(list)

        def _sequence_logps(self, model, inputs):
            logps, mask = completion_token_logps(model, inputs)
            return (logps * mask).sum(-1)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch

            half = inputs["input_ids"].shape[0] // 2
            policy = self._sequence_logps(model, inputs)
            with torch.no_grad(), model.disable_adapter():
                reference = self._sequence_logps(model, inputs)
            losses = sum(
                w * dpo_losses(policy[:half], policy[half:], reference[:half], reference[half:], self.beta, t)
                for t, w in zip(self.loss_types, self.loss_weights)
            )
            chosen = self.beta * (policy[:half] - reference[:half]).detach()
            rejected = self.beta * (policy[half:] - reference[half:]).detach()
            self._metrics["rewards/chosen"].append(float(chosen.mean()))
            self._metrics["rewards/rejected"].append(float(rejected.mean()))
            self._metrics["rewards/margins"].append(float((chosen - rejected).mean()))
            self._metrics["rewards/accuracies"].append(float((chosen > rejected).float().mean()))
            loss = losses.mean()
            return (loss, None) if return_outputs else loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self._metrics and "loss" in logs:
                logs.update({k: sum(v) / len(v) for k, v in self._metrics.items() if v})
                self._metrics.clear()
            super().log(logs, start_time)

    return VLMDPOTrainer


# ---------------------------------------------------------------------------- the jobs


def prompt_lengths(processor, store: ScreenshotStore, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Each row's prompt length in tokens, image pads included, from the screenshots' sizes (no image decoded)."""
    from halo_agent.vlm import processor_messages, prompt_text

    prompted = [processor_messages(row_messages(r["prompt"], r.get("screenshot_hash"))) for r in rows]
    sizes = store.sizes(k for _, keys in prompted for k in keys)
    image_tokens = dict(zip(sizes, processor._get_num_multimodal_tokens(image_sizes=list(sizes.values()))["num_image_tokens"])) if sizes else {}
    tokenizer = processor.tokenizer
    # The template writes one pad per image; the processor expands it to the image's token count.
    return [len(tokenizer(prompt_text(processor, messages), add_special_tokens=False)["input_ids"])
            + sum(image_tokens[k] - 1 for k in keys) for messages, keys in prompted]


def batch_encoder(cfg: TrainConfig, read, processor, rows: Sequence[dict[str, Any]], stats: dict[str, Any],
                  completion_keys: Sequence[str] = ("completion",),
                  max_completion_length: int | None = None) -> tuple[VLMBatchEncoder, list[dict[str, Any]], int]:
    """The encoder that builds the rows' batches, once every screenshot they refer to is known to be in the lake;
    and the rows that fit ``--max-length`` (prompt, image tokens and the longest completion), and how many did not."""
    store = ScreenshotStore(cfg.lake, read.lineage)
    check_rows(store, rows, stats)
    encoder = VLMBatchEncoder(processor, store, stats, max_completion_length)
    if cfg.max_length is None:
        return encoder, list(rows), 0
    tokenizer = processor.tokenizer
    kept = []
    for row, length in zip(rows, prompt_lengths(processor, store, rows)):
        completion = max(len(tokenizer(row[k] or "", add_special_tokens=False)["input_ids"]) for k in completion_keys) + 1
        if max_completion_length is not None:
            completion = min(completion, max_completion_length)
        if length + completion <= cfg.max_length:
            kept.append(row)
    dropped = len(rows) - len(kept)
    if dropped:
        log.warning("dropped %d of %d rows longer than --max-length %d tokens (image tokens included)", dropped, len(rows), cfg.max_length)
    return encoder, kept, dropped


def job_spec_for(cfg: TrainConfig, text_spec):
    """``text_spec`` for a text base model; the vision-language job for a Qwen-VL one."""
    from halo_agent.vlm import is_vlm
    from halo_train.config import base_model_path

    return vlm_job_spec(cfg) if is_vlm(base_model_path(cfg.base_model)) else text_spec


def vlm_job_spec(cfg: TrainConfig):
    """The JobSpec of ``bc`` or ``dpo`` for a vision-language base model."""
    from halo_train.trainer_utils import JobSpec, common_training_args

    if cfg.job_type == "dpo":
        bad = [t for t in cfg.loss_type if t not in VLM_DPO_LOSS_TYPES]
        if bad:
            raise TrainConfigError(f"--loss-type {','.join(bad)} is not built for vision-language models: use {', '.join(VLM_DPO_LOSS_TYPES)}")
    state: dict[str, Any] = {}

    def make_dataset(cfg_, read, processor):
        import pyarrow as pa

        from halo_train.data import to_dataset

        completions = ("completion",) if cfg_.job_type == "bc" else ("chosen", "rejected")
        rows = read.table.select(["prompt", *completions, "screenshot_hash"]).to_pylist()
        state["encoder"], rows, dropped = batch_encoder(cfg_, read, processor, rows, state["stats"], completions)
        table = pa.Table.from_pylist(rows) if rows else read.table.select(["prompt", *completions, "screenshot_hash"]).slice(0, 0)
        return to_dataset(table), dropped, {"vlm": state["stats"]}

    def make_trainer(cfg_, model, processor, dataset, callbacks):
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(**common_training_args(cfg_), remove_unused_columns=False)
        if args.gradient_checkpointing and hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
        common = dict(model=model, args=args, train_dataset=dataset, processing_class=processor, callbacks=callbacks)
        if cfg_.job_type == "bc":
            return Trainer(data_collator=BCCollator(state["encoder"]), **common)
        trainer_cls = make_dpo_trainer_class()
        return trainer_cls(data_collator=DPOCollator(state["encoder"]), beta=cfg_.beta, loss_types=cfg_.loss_type,
                           loss_weights=cfg_.loss_weights, **common)

    return JobSpec(make_dataset=make_dataset, make_trainer=make_trainer, sql=SCREENSHOT_SQL[cfg.job_type],
                   on_load=lambda model, processor: state.update(stats=vlm_stats(model, processor)))
