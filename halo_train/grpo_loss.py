"""GRPO's loss over stored rows: the clipped surrogate per token (or per choice), its importance ratios against
the stored behaviour logprobs, and the statistics a trainer logs. One loss for both learners: the
``halo-train grpo`` job's Trainer (``halo_train.grpo.make_trainer_class``) and the online learner
(``halo_train.learner``). What is trained on and why is in ``halo_train.grpo``'s docstring (Loss, Choices,
Token aggregation).

    loss, stats = batch_loss(model, GRPOCollator(pad_id)(rows), grpo_config, clip_range(grpo_config))
"""

from __future__ import annotations

import functools

from halo_train.config import GRPOConfig


def approx_kl_terms(log_ratio):
    """Per-sample terms of an estimate of KL(current || behaviour) from samples of the behaviour policy:
    r log r - (r - 1), r = exp(log_ratio) (non-negative, unbiased, low variance; Schulman's k3 read the other way)."""
    import torch

    ratio = torch.exp(log_ratio.clamp(max=20.0))
    return ratio * log_ratio.clamp(max=20.0) - (ratio - 1.0)


def grpo_loss(
    token_logps,
    completion_mask,
    advantage,
    behaviour_logprob,
    has_behaviour_logprob,
    loss_type: str,
    epsilon_low: float,
    epsilon_high: float,
    max_completion_length: int,
    token_behaviour=None,
    has_token_behaviour=None,
    token_weight=None,
):
    """Per-token clipped policy-gradient loss over stored completions; returns (loss, stats).

    token_logps: (B, T) log pi_theta of each target token (for token-exact rows, under the distribution their
    behaviour logprobs are of: ``halo_train.behaviour``); completion_mask: (B, T) 1 on completion tokens;
    token_behaviour: (B, T) the stored logprob of each target token, used where has_token_behaviour (B,);
    token_weight: (B, T) a detached weight per token loss (truncated importance sampling), 1 by default.
    """
    import torch

    mask = completion_mask.to(token_logps.dtype)
    n_tokens = mask.sum(-1).clamp(min=1.0)
    sequence_logp = (token_logps * mask).sum(-1)
    # On-policy rows: ratio exp(logp - logp.detach()) == 1 whose gradient is that of log pi (REINFORCE).
    on_policy_log_ratio = token_logps - token_logps.detach()
    # Off-policy rows: one length-normalised sequence ratio against the behaviour policy, shared by its tokens.
    sequence_log_ratio = ((sequence_logp - behaviour_logprob) / n_tokens).unsqueeze(-1).expand_as(token_logps)
    log_ratio = torch.where(has_behaviour_logprob.unsqueeze(-1), sequence_log_ratio, on_policy_log_ratio)
    if token_behaviour is not None:
        # Token-exact rows: one ratio per token against that token's stored logprob of the same distribution.
        has_behaviour_logprob = has_behaviour_logprob | has_token_behaviour
        log_ratio = torch.where(has_token_behaviour.unsqueeze(-1), token_logps - token_behaviour, log_ratio)
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    adv = advantage.unsqueeze(-1)
    per_token_loss = -torch.min(ratio * adv, clipped_ratio * adv)
    if token_weight is not None:
        per_token_loss = per_token_loss * token_weight

    if loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    elif loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / n_tokens).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")

    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - epsilon_low) & (adv < 0)) | ((ratio > 1.0 + epsilon_high) & (adv > 0))
        off = has_behaviour_logprob
        # Each off-policy row's share of clipped tokens and its mean ratio, over its completion tokens.
        row_clipped = (is_clipped.to(mask.dtype) * mask).sum(-1) / n_tokens
        row_ratio = (ratio * mask).sum(-1) / n_tokens
        # approx KL(current || behaviour) over the importance-weighted rows' tokens: E_behaviour[r log r - (r - 1)].
        row_kl = (approx_kl_terms(log_ratio) * mask).sum(-1) / n_tokens
        stats = {
            "clip_ratio": float(row_clipped[off].mean()) if off.any() else 0.0,
            "importance_ratio_mean": float(row_ratio[off].mean()) if off.any() else 1.0,
            "approx_kl": float(row_kl[off].mean()) if off.any() else 0.0,
            "frac_rows_off_policy": float(off.float().mean()),
            "completion_length": float(mask.sum(-1).mean()),
        }
    return loss, stats


def choice_softmax_loss(token_logps, completion_mask, group_index, advantage, behaviour_logprob, epsilon_low: float, epsilon_high: float):
    """Clipped policy-gradient loss on each candidate's share of its state's candidates; returns (loss, stats).

    A candidate's log-probability is log p(a) - log sum_a' p(a') over its group (``group_index``), the
    distribution a guided-choice engine samples from; ``behaviour_logprob`` holds the same share under the
    behaviour policy. One ratio per candidate (an action is one choice, however many tokens it has); the loss
    is the clipped surrogate summed over candidates, averaged over groups. A candidate with advantage 0
    still counts in its group's normaliser, so raising a better choice lowers it. A NaN behaviour share (a group
    ``choice_groups`` trains on-policy) is the current share itself, detached: ratio 1.
    """
    import torch

    sequence_logp = (token_logps * completion_mask.to(token_logps.dtype)).sum(-1)
    groups = int(group_index.max()) + 1
    peak = torch.full((groups,), float("-inf"), dtype=sequence_logp.dtype, device=sequence_logp.device)
    peak = peak.scatter_reduce(0, group_index, sequence_logp.detach(), reduce="amax")
    total = torch.zeros_like(peak).index_add(0, group_index, torch.exp(sequence_logp - peak[group_index]))
    choice_logp = sequence_logp - (peak + torch.log(total))[group_index]
    behaviour_logprob = torch.where(torch.isnan(behaviour_logprob), choice_logp.detach(), behaviour_logprob)
    ratio = torch.exp((choice_logp - behaviour_logprob).clamp(max=20.0))
    clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    loss = -torch.min(ratio * advantage, clipped_ratio * advantage).sum() / groups

    with torch.no_grad():
        signal = advantage != 0
        is_clipped = ((ratio < 1.0 - epsilon_low) & (advantage < 0)) | ((ratio > 1.0 + epsilon_high) & (advantage > 0))
        positive = advantage > 0
        stats = {
            "clip_ratio": float(is_clipped[signal].float().mean()) if signal.any() else 0.0,
            "importance_ratio_mean": float(ratio[signal].mean()) if signal.any() else 1.0,
            "approx_kl": float(approx_kl_terms(choice_logp - behaviour_logprob).mean()),
            "frac_rows_off_policy": 1.0,
            "completion_length": float(completion_mask.sum(-1).float().mean()),
            # The current policy's share of the choices that scored above their group's baseline.
            "positive_choice_share": float(torch.exp(choice_logp[positive]).mean()) if positive.any() else 0.0,
        }
    return loss, stats


def _processed(logits, inputs):
    """(B, T-1) log-probability of each next token: under each token-exact row's behaviour distribution (its
    temperature, a masked draw's mask), the raw softmax for the other rows."""
    import torch

    from halo_train.behaviour import processed_token_logps

    targets = inputs["input_ids"][:, 1:]
    if "temperature" not in inputs:  # a batch without token-exact columns (a VLM batch)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return processed_token_logps(logits, targets, inputs["temperature"], inputs.get("allowed_token_ids"))


def behaviour_token_logps(model, inputs):
    """(B, T-1) log pi_theta of each next token (``_processed``), and the completion mask aligned with it."""
    from halo_train.vlm import model_inputs

    logits = model(**model_inputs(inputs)).logits[:, :-1].float()
    return _processed(logits, inputs), inputs["completion_mask"][:, 1:]


def prompt_spans(inputs) -> list[tuple[int, int]] | None:
    """Each row's (prompt length, completion length) when every row of the batch is one prompt followed by one
    completion (its completion mask is 0 then 1 up to its length), else None."""
    mask = inputs["completion_mask"].bool()
    starts = mask.int().argmax(-1).tolist()  # the first completion token (0 where there is none)
    spans = []
    for i, (start, length) in enumerate(zip(starts, inputs["attention_mask"].sum(-1).tolist())):
        if start < 1 or int(mask[i].sum()) != length - start:
            return None
        spans.append((int(start), int(length) - int(start)))
    return spans


@functools.cache
def _cache_argument(model_class: type) -> str:
    """The name a model class's forward takes its KV cache under: "cache" since transformers 5, else
    "past_key_values"."""
    import inspect

    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _forward_with_cache(model, **kwargs):
    """``model(...)`` with a KV cache in and out, under the name its transformers version gives it."""
    name = _cache_argument(type(getattr(model, "get_base_model", lambda: model)()))
    if "cache" in kwargs:
        kwargs[name] = kwargs.pop("cache")
    out = model(**kwargs)
    return out, getattr(out, name, None) if name == "cache" else out.past_key_values


def completion_logits(model, inputs, spans: list[tuple[int, int]]):
    """Per distinct prompt of the batch: (its rows, its length, the logits (k, longest, V) predicting each row's
    completion tokens). The prompt runs once, its key/value cache repeated for each of its rows, then only their
    completions; no logits are computed for the prompt's own tokens."""
    import torch

    ids = inputs["input_ids"]
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, (start, _) in enumerate(spans):
        by_prompt.setdefault(tuple(ids[i, :start].tolist()), []).append(i)
    for prompt, members in by_prompt.items():
        start, k = len(prompt), len(members)
        longest = max(spans[i][1] for i in members)
        first, cache = _forward_with_cache(model, input_ids=ids[members[0] : members[0] + 1, :start], use_cache=True,
                                           logits_to_keep=1)
        logits = first.logits[:, -1:].expand(k, 1, -1)  # predicts each row's first completion token
        if longest > 1:
            if k > 1:
                cache.batch_repeat_interleave(k)
            completion = ids[members, start : start + longest - 1]
            attention = torch.cat([torch.ones(k, start, dtype=inputs["attention_mask"].dtype, device=ids.device),
                                   inputs["attention_mask"][members, start : start + longest - 1]], dim=1)
            rest, _ = _forward_with_cache(model, input_ids=completion, attention_mask=attention, cache=cache, use_cache=True)
            logits = torch.cat([logits, rest.logits], dim=1)
        yield members, start, longest, logits.float()


def shared_prompt_token_logps(model, inputs):
    """``behaviour_token_logps`` computing each distinct prompt once (``completion_logits``): rows of one state
    share its prompt's forward pass, and only their completions are run per row. The same values as the full
    forward within float rounding (``tests/test_learner.py``), for a fraction of the work where a state's rows
    outnumber its prompts (GRPO's groups, an anchor state's samples): an agent's prompt is long and its action short.

    Rows that are not one prompt and one completion (``prompt_spans``) go through the full forward.
    """
    import torch
    import torch.nn.functional as F

    from halo_train.behaviour import processed_token_logps

    spans = prompt_spans(inputs)
    if spans is None:
        return behaviour_token_logps(model, inputs)
    ids = inputs["input_ids"]
    width = ids.size(1) - 1
    allowed = inputs.get("allowed_token_ids")
    rows: list = [None] * ids.size(0)
    for members, start, longest, logits in completion_logits(model, inputs, spans):
        targets = ids[members, start : start + longest]
        logps = processed_token_logps(logits, targets, inputs["temperature"][members],
                                      None if allowed is None else allowed[members, start - 1 : start - 1 + longest])
        for j, i in enumerate(members):
            length = spans[i][1]
            rows[i] = F.pad(logps[j, :length], (start - 1, width - (start - 1) - length))
    return torch.stack(rows), inputs["completion_mask"][:, 1:]


def shared_prompt_logits(model, inputs):
    """(B, T-1, V) next-token logits as ``model(...).logits[:, :-1]`` gives them at every completion position
    (``completion_logits``: each distinct prompt run once), zeros elsewhere; None where a row is not one prompt
    and one completion."""
    import torch

    spans = prompt_spans(inputs)
    if spans is None:
        return None
    out = None
    for members, start, longest, logits in completion_logits(model, inputs, spans):
        if out is None:
            out = torch.zeros(inputs["input_ids"].size(0), inputs["input_ids"].size(1) - 1, logits.size(-1),
                              dtype=logits.dtype, device=logits.device)
        for j, i in enumerate(members):
            length = spans[i][1]
            out[i, start - 1 : start - 1 + length] = logits[j, :length]
    return out


def batch_loss(model, inputs, grpo: GRPOConfig, clip_range: tuple[float, float], share_prompts: bool = False):
    """GRPO's loss on one collated batch (``GRPOCollator``) under ``model``; returns (loss, stats).

    The one loss both learners compute: the job's Trainer (``make_trainer_class``) and the online learner
    (``halo_train.learner``). Stats: the loss function's (clip_ratio, importance_ratio_mean, approx_kl, ...),
    the batch's rewards and advantages, and with ``grpo.beta`` > 0 the KL to the base model. ``share_prompts``:
    each distinct prompt's forward pass once (``shared_prompt_token_logps``) for rows of a text model.
    """
    import torch

    if share_prompts and "temperature" in inputs and "group_index" not in inputs:
        token_logps, completion_mask = shared_prompt_token_logps(model, inputs)
    else:
        token_logps, completion_mask = behaviour_token_logps(model, inputs)
    if "group_index" in inputs:
        loss, stats = choice_softmax_loss(
            token_logps, completion_mask, inputs["group_index"], inputs["advantage"].float(),
            inputs["behaviour_logprob"].float(), *clip_range,
        )
    else:
        token_behaviour, weight, tis = inputs.get("token_logprobs"), None, {}
        if grpo.tis_cap and "trainer_logprobs" in inputs:
            # The ratio against the trainer's own score before the update; the engine's gap as a capped weight.
            from halo_train.behaviour import truncated_importance_weight

            exact = inputs["has_token_logprobs"].bool().unsqueeze(-1) & completion_mask.bool()
            weight, tis = truncated_importance_weight(inputs["trainer_logprobs"], token_behaviour, exact, grpo.tis_cap)
            token_behaviour = torch.where(exact, inputs["trainer_logprobs"], token_behaviour)
        loss, stats = grpo_loss(
            token_logps,
            completion_mask,
            inputs["advantage"].float(),
            inputs["behaviour_logprob"].float(),
            inputs["has_behaviour_logprob"].bool(),
            loss_type=grpo.loss_type,
            epsilon_low=clip_range[0],
            epsilon_high=clip_range[1],
            max_completion_length=grpo.max_completion_length,
            token_behaviour=token_behaviour,
            has_token_behaviour=inputs.get("has_token_logprobs"),
            token_weight=weight,
        )
        stats.update(tis)
    if grpo.beta > 0:
        kl = _kl_to_reference(model, inputs, token_logps)
        loss = loss + grpo.beta * kl
        stats["kl"] = float(kl.detach())
    adv = inputs["advantage"].float()
    stats.update(
        reward=float(inputs["episode_reward"].mean()),
        reward_std=float(inputs["episode_group_std"].mean()),
        advantage_mean=float(adv.mean()),
        advantage_abs_mean=float(adv.abs().mean()),
    )
    return loss, stats


def _kl_to_reference(model, inputs, token_logps):
    """Mean per-token KL to the base model (adapter disabled) over completion tokens, k3 estimator (as TRL)."""
    import torch

    with torch.no_grad(), model.disable_adapter():
        ref_logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1].float()
    # The reference's distribution of the same kind as token_logps (a token-exact row's temperature and mask).
    ref_logps = _processed(ref_logits, inputs)
    delta = ref_logps - token_logps
    per_token = torch.exp(delta) - delta - 1.0
    mask = inputs["completion_mask"][:, 1:].to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def clip_range(grpo: GRPOConfig) -> tuple[float, float]:
    return grpo.epsilon, grpo.epsilon if grpo.epsilon_high is None else grpo.epsilon_high
