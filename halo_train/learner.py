"""The persistent learner: one model, one LoRA adapter, one optimizer for a whole online run.

    from halo_train.learner import Learner, LearnerOptions
    learner = Learner.start(GRPOConfig(base_model="models/tiny", lake="lake", lr=1e-5), LearnerOptions())
    update = learner.update(GRPOConfig(..., where="run_id = 'online-k0'"), runs=["online-k0"])
    learner.save("out/online/policy-1")          # adapter + learner_state.pt, renamed into place when complete
    learner = Learner.resume(GRPOConfig(...), LearnerOptions(), "out/online/policy-1")   # the same optimizer, step, RNG

An online loop (``halo-train online-grpo``) samples with the served version, lands the rows in the lake and
then updates. A job per update (load the base model, a fresh AdamW, a schedule that decays to zero inside the
job, a few optimizer steps) barely moves the policy: the optimizer's moments start from zero every time and an
iteration's rows are mostly never read. The learner here keeps, across iterations, what verl's actor and
CleanRL's ``ppo.py`` keep: the model with its adapter, the AdamW state, the learning-rate schedule (constant
after an optional linear warm-up), the random generators and the step count. Each update, top to bottom:

1. Data. The update's rows from the lake (``grpo_groups``, or ``state_groups`` with ``group_by="state"``), read
   with the job's own reader and encoder (``halo_train.grpo``): token-exact rows keep their stored ids and
   behaviour logprobs, so every importance ratio starts at 1.
2. Passes. ``epochs_per_update`` passes over **every** row, shuffled by the learner's generator, in
   minibatches of ``mini_batch_size`` rows (one optimizer step each), each minibatch in forward passes of
   ``batch_size`` rows with their gradients accumulated. ``max_steps`` caps the optimizer steps of one update.
   With ``share_prompts`` (the default for text models) the shuffle is of states: the rows of one prompt stay
   together, and a forward pass runs each distinct prompt once, its completions on its key/value cache
   (``halo_train.grpo_loss.shared_prompt_token_logps``). An agent's prompt is hundreds of tokens and its action
   a few, and a GRPO group's rows (an anchor state's samples) share their prompt: the same loss and gradient
   for a fraction of the work.
3. Loss. GRPO's clipped surrogate against the stored logprobs (``halo_train.grpo_loss.batch_loss``, the loss the
   ``halo-train grpo`` job computes), gradient norm clipped to ``max_grad_norm``.
4. What the update did (returned, and recorded per iteration by the loop): rows trained, optimizer steps,
   the mean loss and clip fraction, the adapter's displacement from the base model and from the version before
   (mean over LoRA modules of the Frobenius norm of (alpha/r)·B·A, and of its change), and, in one pass without
   gradients over the same rows after the update, the approximate KL(new || old) against the stored logprobs
   and the entropy of the distribution each token was drawn from (the temperature's softmax; a guided choice's
   mask) on up to ``measure_rows`` of them (a fixed sample per update: each row costs a forward pass), and the
   seconds spent loading, training, measuring and saving.
5. Checkpoint. ``save(folder)`` writes the adapter and ``learner_state.pt`` (optimizer, scheduler, generators,
   step, version) into a staging folder and renames it into place, so a version folder exists only complete;
   ``resume(folder)`` continues with exactly that state: the next update's adapter equals the one an
   uninterrupted learner would have produced from the same rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from halo_train.config import DPOConfig, GRPOConfig, LearnerOptions, TrainConfigError

log = logging.getLogger(__name__)

LEARNER_STATE = "learner_state.pt"
LEARNER_FORMAT = 1


@dataclasses.dataclass
class UpdateResult:
    rows: int  # distinct rows the update trained on (all it read, unless max_steps cut it short)
    optimizer_steps: int
    lineage: dict[str, int]
    extra: dict[str, Any]  # the dataset's figures (groups, zero-std groups, stale rows, ...)
    metrics: dict[str, float]
    step_log: list[dict[str, float]]  # one entry per optimizer step


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Learner:
    """The model, its adapter, the optimizer and the schedule of one online run; see the module docstring."""

    def __init__(self, template: GRPOConfig, options: LearnerOptions, loaded, load_seconds: float):
        import torch

        self.template = template
        self.options = options
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.backend = loaded.backend
        self.load_seconds = load_seconds
        self.version = 0
        self.step = 0
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise TrainConfigError("the model has no trainable parameters: is the adapter loaded as trainable?")
        self.optimizer = torch.optim.AdamW(self.params, lr=template.lr, weight_decay=options.weight_decay)
        warmup = options.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)) if warmup else 1.0
        )
        self.generator = torch.Generator().manual_seed(int(template.seed))
        self.vision = None
        from halo_agent.vlm import is_vlm
        from halo_train.config import base_model_path

        if is_vlm(base_model_path(template.base_model)):
            from halo_train.vlm import vlm_stats

            self.vision = vlm_stats(self.model, self.tokenizer)

    # ------------------------------------------------------------------ starting and resuming

    @classmethod
    def start(cls, template: GRPOConfig, options: LearnerOptions, version: int = 0) -> "Learner":
        """The base model with a fresh adapter (or ``template.init_adapter``'s weights), a fresh optimizer."""
        import torch

        from halo_train.backends import load_for_training
        from halo_train.trainer_utils import quiet_hub

        quiet_hub()
        torch.manual_seed(int(template.seed))  # the fresh adapter's initialisation
        t0 = time.perf_counter()
        loaded = load_for_training(template)
        learner = cls(template, options, loaded, time.perf_counter() - t0)
        learner.version = version
        log.info("learner: %s at version %d (%s), loaded in %.1f s", template.base_model, version,
                 f"warm start {template.init_adapter}" if template.init_adapter else "fresh adapter", learner.load_seconds)
        return learner

    @classmethod
    def resume(cls, template: GRPOConfig, options: LearnerOptions, folder: str | os.PathLike[str]) -> "Learner":
        """The learner as ``save(folder)`` left it: adapter, optimizer, schedule, generators, step and version."""
        import torch

        folder = Path(folder)
        state_file = folder / LEARNER_STATE
        if not state_file.exists():
            raise TrainConfigError(f"{folder} holds no {LEARNER_STATE}: it was not saved by the persistent learner")
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        if state.get("format") != LEARNER_FORMAT:
            raise TrainConfigError(f"{state_file} has learner format {state.get('format')}, this HALO reads {LEARNER_FORMAT}")
        learner = cls.start(dataclasses.replace(template, init_adapter=str(folder)), options, version=int(state["version"]))
        learner.optimizer.load_state_dict(state["optimizer"])
        learner.scheduler.load_state_dict(state["scheduler"])
        learner.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        learner.step = int(state["step"])
        log.info("learner resumed from %s: version %d, optimizer step %d", folder, learner.version, learner.step)
        return learner

    # ------------------------------------------------------------------ one update

    def update(self, cfg: GRPOConfig | DPOConfig) -> UpdateResult:
        """Train on every row ``cfg`` selects (its view, --where, parameters), ``epochs_per_update`` times: GRPO's
        loss for a GRPOConfig (online GRPO), DPO's for a DPOConfig (MCTS's pairs)."""
        import torch

        if isinstance(cfg, DPOConfig):
            rows, collate, loss_of, lineage, extra = self._dpo_rows(cfg)
        else:
            rows, collate, loss_of, lineage, extra = self._grpo_rows(cfg)
        opts = self.options
        guarded = opts.target_kl is not None and not isinstance(cfg, DPOConfig)  # a DPO pair has no sampling ratio
        before = lora_weights(self.model)
        self.model.train()
        step_log: list[dict[str, float]] = []
        trained: set[int] = set()
        prompts = [_prompt_ids(row) for row in rows] if self._shares_prompts(rows) else None
        stop_kl: float | None = None  # the approximate KL that stopped the update early (--target-kl)
        t0 = time.perf_counter()
        for _ in range(opts.epochs_per_update):
            if stop_kl is not None or (opts.max_steps is not None and len(step_log) >= opts.max_steps):
                break
            for minibatch in _chunks(self._epoch_order(rows, prompts), opts.mini_batch_size):
                if opts.max_steps is not None and len(step_log) >= opts.max_steps:
                    break
                self.optimizer.zero_grad(set_to_none=True)
                sums: dict[str, float] = {}
                for micro in _chunks(_pass_order(minibatch, rows, prompts), opts.batch_size):
                    batch = _to_device(collate([rows[i] for i in micro]), self.model.device)
                    loss, stats = loss_of(batch)
                    share = len(micro) / len(minibatch)  # the minibatch's loss is the mean of its rows'
                    (loss * share).backward()
                    for key, value in {"loss": float(loss.detach()), **stats}.items():
                        sums[key] = sums.get(key, 0.0) + share * float(value)
                if guarded and sums.get("approx_kl", 0.0) > 1.5 * opts.target_kl:
                    stop_kl = sums["approx_kl"]  # the policy has moved as far from the sampling one as allowed
                    self.optimizer.zero_grad(set_to_none=True)
                    break
                trained.update(minibatch)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, opts.max_grad_norm)
                lr = self.scheduler.get_last_lr()[0]
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                step_log.append({**sums, "grad_norm": float(grad_norm), "learning_rate": float(lr)})
        train_seconds = time.perf_counter() - t0
        self.version += 1
        after = lora_weights(self.model)
        t1 = time.perf_counter()
        measured = {}
        if opts.measure_rows and not isinstance(cfg, DPOConfig):
            sample = torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.step))[: opts.measure_rows]
            measured = self.measure([rows[i] for i in sorted(sample.tolist())], collate)
        measure_seconds = time.perf_counter() - t1

        def mean(key: str) -> float:
            values = [s[key] for s in step_log if key in s]
            return sum(values) / len(values) if values else 0.0

        metrics = {
            **{key: mean(key) for key in (step_log[0] if step_log else {})},  # every loss statistic, as a job logs them
            "rows_trained": float(len(trained)),
            "rows_read": float(len(rows)),
            "optimizer_steps": float(len(step_log)),
            "learner_step": float(self.step),
            "learning_rate": step_log[-1]["learning_rate"] if step_log else 0.0,
            "displacement_from_base": displacement(after),
            "displacement_from_previous": displacement(after, before),
            **measured,
            "update_train_seconds": train_seconds,
            "update_measure_seconds": measure_seconds,
            **({"early_stopped": float(stop_kl is not None), "stop_kl": stop_kl or 0.0} if guarded else {}),
        }
        return UpdateResult(len(trained), len(step_log), lineage, extra, metrics, step_log)

    def _epoch_order(self, rows: list[dict[str, Any]], prompts: list[tuple[int, ...]] | None) -> list[int]:
        """One pass's row order, drawn from the learner's generator: the rows shuffled or, when prompts are shared
        (``prompts``: each row's), the states shuffled with their rows together (a group's rows fill minibatches
        together, as verl counts its minibatches in prompts), so that each state's prompt is run once per minibatch."""
        import torch

        if prompts is None:
            return torch.randperm(len(rows), generator=self.generator).tolist()
        states: dict[tuple[int, ...], list[int]] = {}
        for i, prompt in enumerate(prompts):
            states.setdefault(prompt, []).append(i)
        groups = list(states.values())
        order = []
        for g in torch.randperm(len(groups), generator=self.generator).tolist():
            members = groups[g]
            order += [members[j] for j in torch.randperm(len(members), generator=self.generator).tolist()]
        return order

    def _shares_prompts(self, rows: list[dict[str, Any]]) -> bool:
        return self.options.share_prompts and self.vision is None and bool(rows) and "completion_mask" in rows[0] \
            and not isinstance(rows[0].get("advantage"), list)

    def _grpo_rows(self, cfg: GRPOConfig):
        """GRPO's training items (``halo_train.grpo``), their collator and loss; the lineage read; the figures."""
        from halo_train.data import NoTrainingSignalError, read_for
        from halo_train.grpo import GRPOCollator, members_sql, training_rows
        from halo_train.grpo_loss import batch_loss, clip_range

        read = read_for(cfg, sql=members_sql(cfg.group_by, self.vision is not None))
        dataset, dropped, extra, encoder = training_rows(cfg, read, self.tokenizer, self.vision)
        rows = dataset.to_list()
        if not rows:
            raise NoTrainingSignalError(f"no rows left to train on (read {read.table.num_rows}, dropped {dropped})")
        collate = GRPOCollator(getattr(self.tokenizer, "tokenizer", self.tokenizer).pad_token_id, encoder)
        if cfg.tis_cap:
            if cfg.choice_softmax or encoder is not None:
                raise TrainConfigError("--tis-cap weighs token-exact rows of text models: drop it with --choice-softmax "
                                       "or a vision-language base model")
            self._score_before_update(rows, collate)
        clip = clip_range(cfg)
        share = self._shares_prompts(rows)
        return (rows, collate, lambda batch: batch_loss(self.model, batch, cfg, clip, share_prompts=share), read.lineage,
                {**extra, "dropped_rows": dropped})

    def _score_before_update(self, rows: list[dict[str, Any]], collate) -> None:
        """Each token-exact row's ``trainer_logprobs``: the trainer's logprob of each stored token under the weights
        before this update (the distribution its stored logprobs are of), for truncated importance sampling."""
        import torch

        from halo_train.grpo_loss import _processed
        from halo_train.vlm import model_inputs

        self.model.eval()
        try:
            with torch.no_grad():
                for chunk in _chunks(list(range(len(rows))), self.options.batch_size):
                    batch = _to_device(collate([rows[i] for i in chunk]), self.model.device)
                    logps = _processed(self.model(**model_inputs(batch)).logits[:, :-1].float(), batch).cpu()
                    for j, i in enumerate(chunk):
                        if rows[i].get("token_logprobs") is not None:
                            rows[i]["trainer_logprobs"] = logps[j, : len(rows[i]["input_ids"]) - 1].tolist()
        finally:
            self.model.train()

    def _dpo_rows(self, cfg: DPOConfig):
        """DPO's pairs as items: each side's prompt and completion tokens (the stored ids where the pair has them,
        else the text and EOS) and the reference logprobs stored with it where both sides have them (the sampling
        policy, as Agent Q's off-policy DPO; ``halo_train.dpo.token_exact_pairs``), else the base model's."""
        from halo_train.data import EmptyViewError, chat_text, prompt_messages, read_for
        from halo_train.dpo import TOKENS_SQL, token_exact_pairs

        if list(cfg.loss_type) != ["sigmoid"]:
            raise TrainConfigError(f"the persistent learner trains DPO's sigmoid loss; --loss-type {','.join(cfg.loss_type)} "
                                   "needs an update job: --learner jobs")
        if self.vision is not None:
            raise TrainConfigError("the persistent learner's DPO is built for text base models: use --learner jobs")
        read = read_for(cfg, sql=TOKENS_SQL if cfg.view == "dpo_pairs" else None)
        pairs = token_exact_pairs(read.table).to_pylist()
        tokenizer = self.tokenizer
        rows, dropped = [], 0
        for pair in pairs:
            prompt = tokenizer(chat_text(tokenizer, prompt_messages(pair["prompt"]), add_generation_prompt=True),
                               add_special_tokens=False)["input_ids"]
            sides = []
            for side in ("chosen", "rejected"):
                ids = pair.get(f"{side}_token_ids")
                if ids is None:
                    ids = tokenizer(pair[side], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                sides.append({"input_ids": prompt + list(ids), "completion_mask": [0] * len(prompt) + [1] * len(ids)})
            if cfg.max_length is not None and max(len(x["input_ids"]) for x in sides) > cfg.max_length:
                dropped += 1
                continue
            reference = [pair.get("chosen_logprob_sum"), pair.get("rejected_logprob_sum")]
            rows.append({"chosen": sides[0], "rejected": sides[1], "reference": reference if None not in reference else None})
        if not rows:
            raise EmptyViewError(f"no DPO pairs left to train on (read {len(pairs)}, {dropped} longer than --max-length)")
        pad_id = tokenizer.pad_token_id
        extra = {"pairs": len(rows), "pairs_with_stored_reference": sum(r["reference"] is not None for r in rows),
                 "dropped_rows": dropped}
        return rows, lambda items: dpo_batch(items, pad_id), lambda batch: dpo_loss(self.model, batch, cfg.beta), read.lineage, extra


    def measure(self, rows: list[dict[str, Any]], collate) -> dict[str, float]:
        """After an update, without gradients over its rows: approx KL(new || old) against the stored token
        logprobs (token-exact rows; 0 where none are stored) and the mean entropy of the distribution each
        completion token was drawn from."""
        import torch

        from halo_train.grpo_loss import _processed, approx_kl_terms, shared_prompt_logits
        from halo_train.vlm import model_inputs

        kl_sum = kl_tokens = entropy_sum = entropy_tokens = 0.0
        self.model.eval()
        share = self._shares_prompts(rows)
        order = _pass_order(range(len(rows)), rows, [_prompt_ids(row) for row in rows] if share else None)
        try:
            with torch.no_grad():
                for chunk in _chunks(order, self.options.batch_size):
                    batch = _to_device(collate([rows[i] for i in chunk]), self.model.device)
                    logits = shared_prompt_logits(self.model, batch) if share else None
                    if logits is None:
                        logits = self.model(**model_inputs(batch)).logits[:, :-1].float()
                    mask = batch["completion_mask"][:, 1:].bool()
                    if "token_logprobs" in batch and "group_index" not in batch:
                        exact = batch["has_token_logprobs"].bool().unsqueeze(-1) & mask
                        log_ratio = _processed(logits, batch) - batch["token_logprobs"]
                        kl_sum += float(approx_kl_terms(log_ratio)[exact].sum())
                        kl_tokens += float(exact.sum())
                    entropy = processed_entropy(logits, batch, mask)
                    entropy_sum += float(entropy.sum())
                    entropy_tokens += float(entropy.numel())
        finally:
            self.model.train()
        return {
            "approx_kl": kl_sum / kl_tokens if kl_tokens else 0.0,
            "entropy": entropy_sum / entropy_tokens if entropy_tokens else 0.0,
        }

    # ------------------------------------------------------------------ checkpoint

    def save(self, folder: str | os.PathLike[str], extra_files: dict[str, str | Callable[[], str]] | None = None) -> Path:
        """The adapter (and tokenizer) and ``learner_state.pt`` in ``folder``, renamed into place when complete.

        ``extra_files`` are written last, before the rename; a callable is called then, so that what it writes (a
        stats file with the save's own seconds) is in the folder the moment the folder exists."""
        import torch

        final = Path(folder)
        staging = final.parent / f".{final.name}.saving"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self.model.save_pretrained(staging)
        self.tokenizer.save_pretrained(staging)
        torch.save({
            "format": LEARNER_FORMAT,
            "version": self.version,
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "options": dataclasses.asdict(self.options),
        }, staging / LEARNER_STATE)
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text() if callable(text) else text)
        if final.exists():  # a folder left by an update that was killed after its rename is complete: replace it
            shutil.rmtree(final)
        staging.rename(final)
        return final


def _length(row: dict[str, Any]) -> int:
    """A training item's tokens (a choice group's: all its candidates')."""
    ids = row.get("input_ids") or row.get("chosen", {}).get("input_ids") or []
    return sum(len(x) for x in ids) if ids and isinstance(ids[0], list) else len(ids)


def _pass_order(indices, rows: list[dict[str, Any]], prompts: list[tuple[int, ...]] | None) -> list[int]:
    """How rows are ordered into forward passes: by prompt where prompts are shared (a state's rows in one pass),
    else by length (the same gradient with less padding)."""
    if prompts is None:
        return sorted(indices, key=lambda i: _length(rows[i]))
    return sorted(indices, key=lambda i: (len(prompts[i]), prompts[i]))


def _prompt_ids(row: dict[str, Any]) -> tuple[int, ...]:
    """A tokenised row's prompt: its ids before the first completion token."""
    mask = row["completion_mask"]
    return tuple(row["input_ids"][: mask.index(1) if 1 in mask else len(mask)])


def _to_device(batch: dict[str, Any], device) -> dict[str, Any]:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


def dpo_batch(items: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Chosen sides then rejected sides, right-padded (``halo_train.grpo.pad_members``), and the stored references."""
    import torch

    from halo_train.grpo import pad_members

    batch = pad_members([r["chosen"] for r in items] + [r["rejected"] for r in items], pad_id)
    batch["reference"] = torch.tensor([r["reference"] if r["reference"] is not None else [0.0, 0.0] for r in items])
    batch["has_reference"] = torch.tensor([r["reference"] is not None for r in items])
    return batch


def _completion_logps(model, batch):
    """Each row's log pi(completion | prompt) under the raw softmax, the distribution DPO scores."""
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    targets = batch["input_ids"][:, 1:]
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (token_logps * batch["completion_mask"][:, 1:].to(token_logps.dtype)).sum(-1)


def dpo_loss(model, batch, beta: float):
    """DPO's sigmoid loss, -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))), over a ``dpo_batch``; the reference is
    the stored one where a pair has it, the base model's (the adapter disabled) elsewhere. Returns (loss, stats) with
    TRL's metric names."""
    import torch

    n = batch["has_reference"].shape[0]
    logps = _completion_logps(model, batch)
    reference = batch["reference"].to(logps.dtype)
    if not bool(batch["has_reference"].all()):
        with torch.no_grad(), model.disable_adapter():
            base = _completion_logps(model, batch)
        reference = torch.where(batch["has_reference"].unsqueeze(-1), reference, torch.stack([base[:n], base[n:]], -1))
    chosen = beta * (logps[:n] - reference[:, 0])
    rejected = beta * (logps[n:] - reference[:, 1])
    loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
    chosen, rejected = chosen.detach(), rejected.detach()
    stats = {"rewards/chosen": float(chosen.mean()), "rewards/rejected": float(rejected.mean()),
             "rewards/margins": float((chosen - rejected).mean()),
             "rewards/accuracies": float((chosen > rejected).float().mean())}
    return loss, stats


def processed_entropy(logits, inputs, mask):
    """Entropy, at each completion position (``mask``), of the distribution the token there was drawn from: the
    softmax at the row's temperature, restricted to the allowed tokens where a guided choice masked the draw."""
    import torch

    temperature = inputs.get("temperature")
    scaled = logits if temperature is None else logits / temperature.to(logits.dtype)[:, None, None]
    allowed = inputs.get("allowed_token_ids")
    picked = scaled[mask]  # (N, V): the completion positions only
    if allowed is not None and allowed.numel() and bool((allowed >= 0).any()):
        allowed = allowed[mask]  # (N, K)
        valid = allowed >= 0
        keep = torch.zeros_like(picked, dtype=torch.bool).scatter_(-1, allowed.clamp(min=0), valid)
        picked = torch.where(valid.any(-1, keepdim=True) & ~keep, torch.finfo(picked.dtype).min, picked)
    logp = torch.log_softmax(picked, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def lora_weights(model) -> dict[str, tuple[Any, Any, float]]:
    """Each LoRA module's (A, B, scale) as CPU copies: what the adapter adds to the base is scale · B · A."""
    out = {}
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if not lora_a or "default" not in lora_a:
            continue
        out[name] = (lora_a["default"].weight.detach().float().cpu().clone(),
                     module.lora_B["default"].weight.detach().float().cpu().clone(),
                     float(module.scaling["default"]))
    return out


def displacement(now: dict[str, tuple[Any, Any, float]], before: dict[str, tuple[Any, Any, float]] | None = None) -> float:
    """Mean over LoRA modules of ||scale · B · A||_F (how far the adapter moves the base), or with ``before`` of
    ||scale · (B·A - B0·A0)||_F (how far this update moved it)."""
    if not now:
        return 0.0
    total = 0.0
    for name, (a, b, scale) in now.items():
        delta = scale * (b @ a)
        if before is not None:
            a0, b0, scale0 = before[name]
            delta = delta - scale0 * (b0 @ a0)
        total += float(delta.norm())
    return total / len(now)


def adapter_lora_weights(folder: str | os.PathLike[str]) -> dict[str, tuple[Any, Any, float]]:
    """``lora_weights`` of a saved PEFT adapter folder (its safetensors and adapter_config.json's alpha / r)."""
    import json

    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    scale = float(config["lora_alpha"]) / float(config["r"])
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    out = {}
    for key, a in tensors.items():
        if ".lora_A." in key:
            module = key.split(".lora_A.")[0]
            out[module] = (a.float(), tensors[key.replace(".lora_A.", ".lora_B.")].float(), scale)
    return out


# The learner each process holds between updates, by run (output folder): the main process's, or a pipelined
# run's update process's.
_HELD: dict[str, Learner] = {}


def held_learner(key: str, template, options: LearnerOptions, version: int, path: str | None) -> tuple[Learner, float]:
    """The learner at ``version`` (adapter folder ``path``) for run ``key``: the one this process holds, else the one
    saved in ``path`` (its learner state), else a new one from the base model (version 0, or the warm start ``path``);
    with the seconds spent loading it (0 when held)."""
    held = _HELD.get(key)
    if held is not None and held.version == version:
        return held, 0.0
    _HELD.pop(key, None)
    if path and version > 0 and (Path(path) / LEARNER_STATE).exists():
        learner = Learner.resume(template, options, path)
    else:
        if version > 0:
            log.warning("%s has no learner state: the learner starts from its adapter with a fresh optimizer", path)
        learner = Learner.start(dataclasses.replace(template, init_adapter=path), options, version=version)
    _HELD[key] = learner
    return learner, learner.load_seconds

