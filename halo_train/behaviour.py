"""The behaviour distribution of a stored step, rebuilt under the current weights: what token-level ratios compare.

A model-generated step stores the tokens the engine drew (``completion_token_ids``), one logprob per token
(``logprobs``) and which distribution those are of (``logprobs_mode``, ``draw``, the step's ``temperature``
and, for a guided choice, its ``choices``; see ``halo_data.schema``). A trainer's importance ratio is only
1 before its first update if it scores the same tokens under the same distribution:

    processed_logprobs + masked_choice   the logits at the temperature, renormalised over the tokens the
                                         guided choice's mask allowed (vLLM's: every token whose bytes keep
                                         the text a prefix of some choice, EOS once it is a whole choice;
                                         ``halo_agent.policies.guided_choice.ChoiceMask``); a token that was
                                         the only one allowed is forced and has logprob 0
    processed_logprobs + sample          log softmax(logits / temperature)
    processed_logprobs + greedy          the same at temperature 1 (a guided choice's still masked), as
                                         HALO's chat server reports a temperature-0 draw
    raw_logprobs                         log softmax(logits): the model's raw distribution; for a guided
                                         choice the masked distribution at temperature 1, since vLLM applies
                                         the grammar's bitmask to the logits before its sampler computes them
    processed_logprobs + sequence_choice not rebuilt (each token's share of whole-sequence weights): the
                                         stored ids are scored on-policy, with no importance ratio

No other sampling parameter shapes a stored distribution: HALO's engines are sent (or, for transformers'
``generate``, given) neutral top_k, top_p, min_p and penalties on every request, whatever the model's
generation config says, and its policies refuse a top_p below 1 where they store logprobs (a nucleus cut
is not stored with the step, so no trainer could rebuild it).

Where the engine and the trainer cannot agree to the last bit (bf16 kernels, another attention path on a
GPU), :func:`truncated_importance_weight` measures the gap per token and gives the weight that corrects a
loss for it (as verl does for the vLLM/FSDP gap); on CPU the two are the same computation and it is not used.

A vision-language base model's GRPO batches are built from the text with its images (``halo_train.vlm``):
there a token-exact row is trained on-policy, with no importance ratio.

Rows without stored token ids (lakes of an older HALO, endpoints that return token text) are not token-exact:
``token_exact`` says so and trainers keep their older behaviour for them (a re-tokenised completion and, where
stored, a sequence-level ratio against ``logprob_sum``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

# A finite stand-in for -inf where a masked position's allowed tokens are padded: logsumexp over it stays
# finite and its gradient is 0 (true -inf gives NaN gradients through torch.where).
_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """How one stored completion was drawn, as a trainer needs it."""

    token_ids: list[int]  # the engine's tokens
    # one per token, of the distribution below; None where no trainer rebuilds that distribution (a sequence_choice
    # draw's, a masked draw's without its choices): the ids are scored on-policy, with no importance ratio
    logprobs: list[float] | None
    temperature: float  # the softmax temperature of that distribution (1 for raw logprobs)
    choices: list[str] | None  # the allowed answers of a draw under the guided choice's mask (None: no mask)


def token_exact(row: Mapping[str, Any]) -> Behaviour | None:
    """The stored completion's behaviour (columns ``completion_token_ids``, ``token_logprobs`` or ``logprobs``,
    ``logprobs_mode``, ``draw``, ``choices``, ``temperature``), or None for a row without stored token ids (or
    whose logprobs are not one per token)."""
    ids = row.get("completion_token_ids")
    logprobs = row.get("token_logprobs", row.get("logprobs"))
    if not ids or (logprobs is not None and len(ids) != len(logprobs)):
        return None
    draw, temperature, choices = row.get("draw"), row.get("temperature"), row.get("choices") or None
    hot = temperature is not None and float(temperature) > 0
    if row.get("logprobs_mode") != "processed_logprobs":  # raw_logprobs: vLLM masks the logits it computes them from
        scale, mask, known = 1.0, (choices if draw in ("masked_choice", "greedy") else None), True
    elif draw == "sample":  # top_p is not rebuilt (see the module docstring)
        scale, mask, known = float(temperature) if hot else 1.0, None, True
    elif draw == "masked_choice":
        scale, mask, known = float(temperature) if hot else 1.0, choices, choices is not None
    elif draw == "greedy":  # at temperature 0 the distributions at temperature 1, a guided choice's masked
        scale, mask, known = 1.0, choices, True
    else:  # sequence_choice: per-token shares of whole-sequence weights, which no trainer rebuilds
        scale, mask, known = 1.0, None, False
    return Behaviour(
        token_ids=[int(t) for t in ids],
        logprobs=[float(v) for v in logprobs] if known and logprobs is not None else None,
        temperature=scale,
        choices=list(mask) if mask is not None else None,
    )


def is_raw(behaviour: Behaviour) -> bool:
    """Are the logprobs those of the model's raw softmax (no temperature, no mask), the distribution a trainer
    that scores plain log pi (DPO's references) compares them with?"""
    return behaviour.logprobs is not None and behaviour.temperature == 1.0 and behaviour.choices is None


def choice_mask(tokenizer, choices: Sequence[str]):
    """The guided choice's mask as vLLM's grammar applies it (and HALO's chat server): a ``ChoiceMask``."""
    from halo_agent.policies.guided_choice import ChoiceMask

    return ChoiceMask(tokenizer, choices, tokenizer.eos_token_id)


def allowed_tokens(tokenizer, completion: Sequence[int], choices: Sequence[str]) -> list[list[int]]:
    """For each position of ``completion``, the tokens the guided choice's mask allowed there (the drawn token
    first, always among them): every token whose bytes keep the text a prefix of some choice, EOS once the text
    is a whole choice."""
    return choice_mask(tokenizer, choices).allowed_along(completion)


def processed_token_logps(logits, targets, temperature, allowed=None):
    """log p(target) under the behaviour distribution, per position.

    ``logits`` (B, T, V) predict ``targets`` (B, T); ``temperature`` (B,); ``allowed`` (B, T, K) token ids padded
    with -1, all -1 at a position without a mask (None: no mask anywhere). At a masked position the distribution
    is the allowed tokens' logits over the temperature, renormalised over them alone.
    """
    import torch

    scaled = logits / temperature.to(logits.dtype)[:, None, None]
    target_logit = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    norm = torch.logsumexp(scaled, dim=-1)
    if allowed is not None and allowed.numel() and bool((allowed >= 0).any()):
        valid = allowed >= 0
        picked = scaled.gather(-1, allowed.clamp(min=0)).masked_fill(~valid, _NEG)
        norm = torch.where(valid.any(-1), torch.logsumexp(picked, dim=-1), norm)
    return target_logit - norm


def pad_allowed(rows: Sequence[Sequence[Sequence[int]] | None], width: int):
    """Per row, per target position (``width`` of them), the allowed tokens -> a (B, width, K) tensor padded with -1."""
    import torch

    k = max((len(a) for r in rows if r for a in r), default=0)
    out = torch.full((len(rows), width, max(k, 1)), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        for j, allowed in enumerate(r or ()):
            if allowed:
                out[i, j, : len(allowed)] = torch.tensor(allowed, dtype=torch.long)
    return out


@dataclasses.dataclass(frozen=True)
class Completion:
    """A stored completion as a trainer feeds it: its token ids and, where token-exact, the behaviour of each."""

    token_ids: list[int]
    behaviour: Behaviour | None  # None: not token-exact (older rows); token_ids are then a re-tokenisation
    allowed: list[list[int]] | None  # per token, the tokens a masked_choice draw allowed there (None: no mask)

    @property
    def logprobs(self) -> list[float] | None:
        """The stored logprob of each token, None where there is no ratio to take (see ``Behaviour.logprobs``)."""
        if self.behaviour is None or self.behaviour.logprobs is None:
            return None
        return self.behaviour.logprobs[: len(self.token_ids)]

    @property
    def temperature(self) -> float:
        return self.behaviour.temperature if self.behaviour is not None else 1.0


def stored_completion(tokenizer, row: Mapping[str, Any], text: str | None, max_tokens: int, eos: int | None = None) -> Completion:
    """``row``'s stored tokens (cut to ``max_tokens``) with their behaviour; for a row that is not token-exact,
    ``text`` tokenised and ``eos`` (the tokenizer's EOS by default) appended, as trainers did before token ids
    were stored."""
    behaviour = token_exact(row)
    if behaviour is None:
        ids = list(tokenizer(text or "", add_special_tokens=False)["input_ids"])[: max_tokens - 1]
        return Completion(ids + [tokenizer.eos_token_id if eos is None else eos], None, None)
    ids = behaviour.token_ids[:max_tokens]
    allowed = None
    if behaviour.choices is not None:
        allowed = allowed_tokens(tokenizer, ids, behaviour.choices)
    return Completion(ids, behaviour, allowed)


def truncated_importance_weight(trainer_logps, behaviour_logps, mask, cap: float = 2.0):
    """Truncated importance sampling for an engine/trainer mismatch (verl's ``tis_imp_ratio_cap``; Yao et al.,
    "Your efficient RL framework secretly brings you off-policy RL training", 2025): per token
    min(pi_trainer(old) / pi_engine, ``cap``), detached, and the measured gap.

    ``trainer_logps`` (B, T): the trainer's logprobs of the stored tokens under the weights that sampled them
    (before any update; detached); ``behaviour_logps`` (B, T): the engine's stored ones; ``mask`` (B, T) 1 on
    completion tokens. Returns ``(weight, stats)``: ``weight`` (B, T), 1 where the two agree, to multiply into the
    per-token policy-gradient loss (whose own ratio is then taken against ``trainer_logps``); ``stats``: the mean
    and max |log ratio| and the share of tokens the cap truncated, over masked tokens (what a step should store
    as its engine/trainer mismatch). On CPU, where HALO's server and trainer compute the same, the weight is 1
    to float rounding and the loss needs none of this.
    """
    import torch

    log_ratio = (trainer_logps - behaviour_logps).detach()
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    weight = ratio.clamp(max=float(cap))
    on = mask.bool()
    gap = log_ratio.abs()[on]
    stats = {
        "engine_log_ratio_mean": float(gap.mean()) if gap.numel() else 0.0,
        "engine_log_ratio_max": float(gap.max()) if gap.numel() else 0.0,
        "engine_tis_truncated": float((ratio[on] > cap).float().mean()) if gap.numel() else 0.0,
    }
    return torch.where(on, weight, torch.ones_like(weight)), stats
