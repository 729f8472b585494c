"""GRPO from the lake's stored groups: no generation, the rollouts are already in the lake.

    halo-train grpo --lake lake --base-model models/tiny --max-steps 5 --output-dir out/grpo

    from halo_train import GRPOConfig, train_grpo
    result = train_grpo(GRPOConfig(lake="lake", base_model="models/tiny", loss_type="dr_grpo"))

TRL's GRPOTrainer generates its own completions; here the completions, rewards
and groups come from ``grpo_groups``, so the update is a short loss over stored
rows (``StoredGroupsGRPOTrainer.compute_loss``), run by the transformers Trainer
for checkpoints, resuming, logging and progress bars.

Data. One training row per member step of an episode group (``level =
'episode'`` rows: attempts of one task with the same task_seed and
policy_version). The view computes its advantage, GiGPO's combination

    combined_advantage = A_episode + omega * A_step

where A_episode (the episode row's ``advantage``) compares the episode's shaped
return with its group's mean and A_step (the ``advantage`` of the member's
``level = 'step'`` row) compares the step's discounted return with the other
steps taken from the same anchor state (state_hash) in that group. The trainer
computes no advantage of its own: with the default ``--scale-rewards none`` it
trains on ``combined_advantage`` as the view gives it.

Scaling (``--scale-rewards``, TRL's meaning), applied on top of the view's
per-level advantages before they are combined with the same omega:
  none  (default, Dr. GRPO)  A = combined_advantage
  group                      A = A_episode / (episode group std + 1e-4) + omega * A_step / (step group std + 1e-4)
  batch                      the same with the std of all episode rewards / all step returns read

Per-state groups (``--group-by state``). One training row per scored candidate of
``state_groups``: the n actions the policy sampled in one call at a visited state,
each executed from that state restored by replay and scored with the dense reward
(``halo-agent rollout --candidates N``; ``halo-train online-grpo --group-by
state``). Its advantage is the view's ``advantage`` (score - group mean); there is
no second level, so omega does not apply. ``--scale-rewards group`` divides it by
the state group's std, ``batch`` by the std of all scores read. States that did
not reproduce are not in the view. Loss, importance ratio (against each
candidate's stored ``logprob_sum``) and ``--max-staleness`` are the same.

Zero-std groups. A group whose rewards are all equal carries no signal; the view
gives its members an advantage of exactly 0. Such episode groups are counted
(``frac_reward_zero_std``, the fraction of episode groups with zero reward std)
and their rows skipped where the row's advantage is 0 — a row whose anchor-state
group does have spread (omega > 0) keeps its A_step and is trained on.
Without a KL term (``--beta 0``), any other row whose advantage is exactly 0 (a
state group's lowest under ``--state-baseline min``, a score equal to its group's
mean) is left out of the batches too (``zero_advantage_rows`` in
training_stats.json): it adds nothing to the gradient and would only take the slot
of a row that does. Under the min baseline most covered candidates are such rows.

Loss. Token-exact rows (a step or candidate with ``completion_token_ids`` and one
stored logprob per token) are scored on exactly those token ids, never a
re-tokenisation of the text, under exactly the distribution their logprobs are of
(``halo_train.behaviour``: for a guided choice drawn under the grammar mask, the
allowed tokens' probabilities renormalised at the temperature, the mask rebuilt
from the stored ``choices``; for plain sampling the softmax at the temperature),
with one importance ratio per token

    r_t = exp(log pi_theta(token_t) - logprobs_t)

so before the first update every r_t is 1. Rows of older lakes (no token ids) keep
the earlier behaviour: the completion text tokenised with EOS appended; without
behaviour logprobs REINFORCE with the group mean as baseline (loss = -A * log
pi(completion | prompt)); where only ``logprob_sum`` is stored, a sequence-level
ratio (TRL's ``importance_sampling_level="sequence"``: the length-normalised log-ratio)

    r = exp((log pi_theta(completion) - logprob_sum) / completion_tokens)

against the raw softmax. Either ratio is clipped to [1 - epsilon, 1 + epsilon_high]
as in PPO/GRPO: loss_token = -min(r * A, clip(r) * A).

Choices (``--choice-softmax``, state groups). A guided-choice answer is drawn from the
page's choices only; the raw sequence probability also counts text the page never
offers (on click-button the choices held 0.01-0.9% of the tiny model's raw mass). The
policy that acts is pi_c(a) = p(a) / sum_a' p(a') over the state's candidates, p(a) the
choice's probability under its draw (token-exact candidates: the masked draw's, from
their stored ids; older rows: the raw sequence probability), and with
``--choice-softmax`` that is what is trained: each batch holds
``--batch-size`` whole state groups, each candidate's behaviour share comes from
the group's stored logprob_sums, and one ratio per candidate

    r = exp(log pi_c,theta(a) - log pi_c,behaviour(a))

is clipped as below; the loss is -min(r * A, clip(r) * A) summed over candidates
and averaged over groups. Raising one choice then lowers the page's other choices in
proportion to their share, the ones at advantage 0 included (they stay in the
batch, in their group's normaliser), where the sequence loss mostly moves mass off
text the page does not offer. Groups of covered choices (``online-grpo
--cover-choices``) hold every choice a page offers up to ``--candidates-per-state``;
past that the normaliser covers the most likely ones. positive_choice_share (the
current share of candidates with a positive advantage) goes to train_metrics.

Token aggregation (``--loss-type``, TRL's names): ``dr_grpo`` sums the token
losses and divides by batch size x ``--max-completion-length`` (no length
bias); ``grpo`` averages each sequence's tokens, then the sequences; ``bnpo``
averages over all completion tokens of the batch.

Policy versions. ``policy_version`` is a number of optimizer updates since the
base model: the base model is version 0 (a NULL or non-numeric version counts as
0; a tag such as ``grpo@12`` counts as 12, its trailing number). An adapter
trained from version V for N steps is version V + N; halo-train writes it to
``training_stats.json`` and to the run's ``runs`` row, for rollouts to store.
``--policy-version`` is the version of the weights this job starts from (the
newest in the rows by default) and ``--max-staleness K`` drops rows collected by
a policy more than K versions older (counted as ``stale_rows``).

Metrics (train_metrics): loss, reward (mean episode reward of the batch),
reward_std (mean group std), frac_reward_zero_std, advantage_mean,
advantage_abs_mean, completion_length, clip_ratio (fraction of importance-weighted
rows clipped), importance_ratio_mean, kl (with ``--beta`` > 0: the mean per-token KL to the base
model, the adapter disabled, k3 estimator as in TRL; ``beta * kl`` is added to the loss), frac_rows_off_policy, learning_rate,
grad_norm, tokens_per_second.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections import defaultdict
from typing import Any, Mapping, Sequence

from halo_train.config import GRPOConfig, TrainConfigError
from halo_train.data import NoTrainingSignalError, chat_text, prompt_messages, to_dataset
from halo_train.grpo_loss import batch_loss, behaviour_token_logps, clip_range
from halo_train.trainer_utils import JobSpec, TrainResult, common_training_args, run_job

log = logging.getLogger(__name__)

SCALE_EPS = 1e-4  # TRL's epsilon when dividing advantages by a std

# grpo_groups as it is (long form): each member step's episode row carries the view's
# combined_advantage and the training text; its step row (the anchor state's group) is read for
# --scale-rewards only. Episode rows come first, sorted as the training rows are.
_MEMBERS_SQL = """
SELECT
    level, group_key, run_id, task_id, policy_version, episode_id, step_idx,
    CASE WHEN level = 'episode' THEN prompt END AS prompt,
    CASE WHEN level = 'episode' THEN completion END AS completion,
    logprob_sum, reward, group_std, zero_std, advantage, combined_advantage,
    completion_token_ids, token_logprobs, logprobs_mode, draw, choices, temperature{columns}
FROM selected{join}
ORDER BY level, group_key, episode_id, step_idx
"""
# Each member's stored tokens and the distribution of their logprobs (halo_train.behaviour): from its step.
_TOKENS = "completion_token_ids, logprobs AS token_logprobs, logprobs_mode, draw, choices, temperature"
_STEP_TOKENS_JOIN = f"\nLEFT JOIN (SELECT episode_id, step_idx, {_TOKENS} FROM steps) AS tokens USING (episode_id, step_idx)"
MEMBERS_SQL = _MEMBERS_SQL.format(columns="", join=_STEP_TOKENS_JOIN)
# For a vision-language base model: each member's step screenshot too (halo_train.vlm).
_SHOTS_JOIN = "\nLEFT JOIN (SELECT episode_id, step_idx, screenshot_hash FROM steps) AS shots USING (episode_id, step_idx)"
VLM_MEMBERS_SQL = _MEMBERS_SQL.format(columns=", screenshot_hash", join=_STEP_TOKENS_JOIN + _SHOTS_JOIN)

# state_groups (--group-by state): one row per scored candidate, already a training row; its level is 'state'.
_STATE_MEMBERS_SQL = """
SELECT
    'state' AS level, group_key, run_id, task_id, policy_version, episode_id, step_idx, candidate_idx,
    prompt, completion, logprob_sum, score AS reward, group_std, group_min, zero_std, advantage,
    advantage AS combined_advantage,
    completion_token_ids, token_logprobs, logprobs_mode, draw, choices, temperature{columns}
FROM selected{join}
ORDER BY group_key, candidate_idx
"""
_CANDIDATE_TOKENS_JOIN = (f"\nLEFT JOIN (SELECT run_id, episode_id, step_idx, candidate_idx, {_TOKENS} FROM candidates) AS tokens "
                          "USING (run_id, episode_id, step_idx, candidate_idx)")
STATE_MEMBERS_SQL = _STATE_MEMBERS_SQL.format(columns="", join=_CANDIDATE_TOKENS_JOIN)
# A candidate was sampled from its state's step: that step's screenshot is the one its prompt carried.
VLM_STATE_MEMBERS_SQL = _STATE_MEMBERS_SQL.format(columns=", screenshot_hash", join=_CANDIDATE_TOKENS_JOIN + _SHOTS_JOIN)


def members_sql(group_by: str, vision: bool) -> str:
    """The query over the filtered view (the CTE ``selected``) that a --group-by reads."""
    if group_by == "state":
        return VLM_STATE_MEMBERS_SQL if vision else STATE_MEMBERS_SQL
    return VLM_MEMBERS_SQL if vision else MEMBERS_SQL


# ---------------------------------------------------------------------------- advantages


def parse_policy_version(version: Any) -> int:
    """The number of updates a policy_version stands for (see the module docstring)."""
    if version is None:
        return 0
    if isinstance(version, int):
        return version
    m = re.search(r"(\d+)\s*$", str(version))
    return int(m.group(1)) if m else 0


def scaled(advantage: float, std: float, scale_rewards: str, batch_std: float | None = None) -> float:
    """One level's advantage from the view (reward - group mean) under TRL's ``scale_rewards``."""
    if scale_rewards == "none":
        return advantage
    if scale_rewards == "group":
        return advantage / (std + SCALE_EPS)
    if scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs the std of all rewards")
        return advantage / (batch_std + SCALE_EPS)
    raise ValueError(f"unknown scale_rewards {scale_rewards!r}")


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1), as DuckDB's stddev_samp and torch.std compute it."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


@dataclasses.dataclass
class GroupSummary:
    members: list[dict[str, Any]]  # one per member step kept: its episode row, "advantage" the one to train with
    episode_groups: int
    zero_std_groups: int
    skipped_rows: int
    stale_rows: int
    policy_version: int

    @property
    def frac_reward_zero_std(self) -> float:
        return self.zero_std_groups / self.episode_groups if self.episode_groups else 0.0


def training_members(
    rows: Sequence[dict[str, Any]],
    omega: float,
    scale_rewards: str = "none",
    policy_version: int | None = None,
    max_staleness: int | None = None,
) -> GroupSummary:
    """grpo_groups rows (long form, MEMBERS_SQL) -> one training row per member step, with its advantage.

    The advantage is the view's combined_advantage. Under ``scale_rewards`` group or batch, each
    level's advantage from the view (the episode row's and the step row's) is divided by its std
    before they are combined with the view's omega. Rows staler than ``max_staleness`` are dropped;
    rows of a zero-std episode group whose advantage is 0 (no anchor state with spread) are skipped.
    """
    versions = [parse_policy_version(r.get("policy_version")) for r in rows]
    current = policy_version if policy_version is not None else max(versions, default=0)
    fresh = [r for r, v in zip(rows, versions) if max_staleness is None or current - v <= max_staleness]
    episode_rows = [r for r in fresh if r["level"] == "episode"]
    step_rows = {(r["episode_id"], r["step_idx"]): r for r in fresh if r["level"] == "step"}
    stale = sum(1 for r in rows if r["level"] == "episode") - len(episode_rows)
    zero_std = {r["group_key"]: bool(r["zero_std"]) for r in episode_rows}

    batch_std_episode = batch_std_step = None
    if scale_rewards == "batch":
        # One reward per episode (not per step row), and one return per step member.
        batch_std_episode = sample_std(list({r["episode_id"]: float(r["reward"]) for r in episode_rows}.values()))
        batch_std_step = sample_std([float(r["reward"]) for r in step_rows.values()])

    kept: list[dict[str, Any]] = []
    skipped = 0
    for r in episode_rows:
        if scale_rewards == "none":
            advantage = float(r["combined_advantage"])
            episode_advantage = float(r["advantage"])
        else:
            advantage = episode_advantage = scaled(float(r["advantage"]), float(r["group_std"]), scale_rewards, batch_std_episode)
            if omega != 0:
                step = step_rows.get((r["episode_id"], r["step_idx"]))
                if step is None:
                    raise TrainConfigError(
                        f"--scale-rewards {scale_rewards} with omega {omega} needs grpo_groups' step rows: "
                        "keep level = 'step' in --where"
                    )
                advantage += omega * scaled(float(step["advantage"]), float(step["group_std"]), scale_rewards, batch_std_step)
        if r["zero_std"] and advantage == 0:
            skipped += 1
            continue
        kept.append({**r, "advantage": advantage, "episode_advantage": episode_advantage})
    return GroupSummary(
        members=kept,
        episode_groups=len(zero_std),
        zero_std_groups=sum(zero_std.values()),
        skipped_rows=skipped,
        stale_rows=stale,
        policy_version=current,
    )


def state_members(
    rows: Sequence[dict[str, Any]],
    scale_rewards: str = "none",
    policy_version: int | None = None,
    max_staleness: int | None = None,
    baseline: str = "mean",
) -> GroupSummary:
    """state_groups rows (STATE_MEMBERS_SQL) -> one training row per candidate, with its advantage.

    The advantage is the view's (score - state group mean), or with ``baseline`` "min" score - the
    group's lowest score; under ``scale_rewards`` group it is divided by the state group's std, under
    batch by the std of every score kept. Rows staler than
    ``max_staleness`` are dropped; the rows of a zero-std state group (advantage exactly 0) are skipped.
    """
    versions = [parse_policy_version(r.get("policy_version")) for r in rows]
    current = policy_version if policy_version is not None else max(versions, default=0)
    fresh = [r for r, v in zip(rows, versions) if max_staleness is None or current - v <= max_staleness]
    zero_std = {r["group_key"]: bool(r["zero_std"]) for r in fresh}
    batch_std = sample_std([float(r["reward"]) for r in fresh]) if scale_rewards == "batch" else None
    kept: list[dict[str, Any]] = []
    skipped = 0
    for r in fresh:
        centred = float(r["advantage"]) if baseline == "mean" else float(r["reward"]) - float(r["group_min"])
        advantage = scaled(centred, float(r["group_std"]), scale_rewards, batch_std)
        if r["zero_std"]:  # a flat state: no signal
            skipped += 1
            continue
        kept.append({**r, "advantage": advantage})
    return GroupSummary(
        members=kept,
        episode_groups=len(zero_std),
        zero_std_groups=sum(zero_std.values()),
        skipped_rows=skipped,
        stale_rows=len(rows) - len(fresh),
        policy_version=current,
    )


def step_credit(rows: Sequence[dict[str, Any]], members: Sequence[dict[str, Any]]) -> dict[str, float]:
    """What GiGPO's step level adds to an update: anchor-state groups with a spread in their returns, and the
    share of the trained advantage that comes from the step term, sum |A - A_episode| / (sum |A_episode| +
    sum |A - A_episode|) over the members kept (``A`` the advantage trained on, ``A_episode`` its episode part)."""
    anchors = {r["group_key"] for r in rows if r["level"] == "step" and not r["zero_std"]}
    episode_part = sum(abs(float(m["episode_advantage"])) for m in members)
    step_part = sum(abs(float(m["advantage"]) - float(m["episode_advantage"])) for m in members)
    total = episode_part + step_part
    return {"anchor_groups_with_spread": float(len(anchors)), "step_advantage_share": step_part / total if total else 0.0}


# ---------------------------------------------------------------------------- tokenising


# What tokenize_member adds for a token-exact row (None for the others).
TOKEN_EXACT_KEYS = ("token_logprobs", "temperature", "allowed")


def tokenize_member(tokenizer, prompt_json: str, completion: str, max_completion_length: int,
                    row: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prompt tokens as the chat template renders them for generation, then the completion: the stored token ids
    where ``row`` has them (token-exact, with each token's behaviour logprob, the temperature and a masked draw's
    allowed tokens, aligned with ``input_ids[1:]``), else the completion text tokenised and EOS."""
    from halo_train.behaviour import stored_completion

    prompt_text = chat_text(tokenizer, prompt_messages(prompt_json), add_generation_prompt=True)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    completion = stored_completion(tokenizer, row or {}, completion, max_completion_length)
    encoded: dict[str, Any] = {
        "input_ids": prompt_ids + completion.token_ids,
        "completion_mask": [0] * len(prompt_ids) + [1] * len(completion.token_ids),
        **dict.fromkeys(TOKEN_EXACT_KEYS),  # every row names the same columns
    }
    if completion.logprobs is not None:
        before = [0.0] * (len(prompt_ids) - 1)  # targets are input_ids[1:]
        encoded["token_logprobs"] = before + completion.logprobs
        encoded["temperature"] = completion.temperature
        encoded["allowed"] = [[]] * (len(prompt_ids) - 1) + completion.allowed if completion.allowed else None
    return encoded


def stored_completion_logprob(model, tokenizer, row: Mapping[str, Any], max_completion_length: int = 256) -> float:
    """log pi(the row's stored completion | its prompt) under ``model``, as the GRPO trainer scores it: a token-exact
    row's stored ids under its behaviour distribution (what its ``logprob_sum`` is, before any update), an older
    row's text and EOS under the raw softmax. ``row``: a steps or candidates row (``prompt``, ``model_output``, ...)."""
    import torch

    encoded = tokenize_member(tokenizer, row["prompt"], row["model_output"], max_completion_length, dict(row))
    batch = {k: v.to(model.device) for k, v in pad_members([encoded], tokenizer.pad_token_id).items()}
    with torch.no_grad():
        token_logps, mask = behaviour_token_logps(model, batch)
    return float((token_logps * mask).sum())


def completion_logprobs(model, tokenizer, prompt_json: str, completion: str, max_completion_length: int = 256) -> float:
    """log pi(completion + EOS | prompt) under ``model``: what a behaviour policy stores as logprob_sum."""
    import torch

    enc = tokenize_member(tokenizer, prompt_json, completion, max_completion_length)
    ids = torch.tensor([enc["input_ids"]], device=model.device)
    mask = torch.tensor([enc["completion_mask"]], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return float((logps * mask[:, 1:]).sum())


def pad_members(rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """Right-pads tokenised members (``tokenize_member``): input_ids, attention_mask and completion_mask tensors;
    and the token-exact rows' behaviour (``token_logprobs``, (B, T-1); ``has_token_logprobs``; ``temperature``;
    ``allowed_token_ids``, (B, T-1, K))."""
    import torch

    from halo_train.behaviour import pad_allowed

    width = max(len(r["input_ids"]) for r in rows)
    pad = lambda seq, value: list(seq) + [value] * (width - len(seq))  # noqa: E731
    exact = [r.get("token_logprobs") is not None for r in rows]
    return {
        "input_ids": torch.tensor([pad(r["input_ids"], pad_token_id) for r in rows]),
        "attention_mask": torch.tensor([pad([1] * len(r["input_ids"]), 0) for r in rows]),
        "completion_mask": torch.tensor([pad(r["completion_mask"], 0) for r in rows]),
        "token_logprobs": torch.tensor([list(r["token_logprobs"]) + [0.0] * (width - len(r["input_ids"])) if e
                                        else [0.0] * (width - 1) for r, e in zip(rows, exact)],
                                       dtype=torch.float32).reshape(len(rows), width - 1),
        "has_token_logprobs": torch.tensor(exact),
        **({"trainer_logprobs": torch.tensor([list(r["trainer_logprobs"]) + [0.0] * (width - len(r["input_ids"]))
                                              if r.get("trainer_logprobs") is not None else [0.0] * (width - 1) for r in rows],
                                             dtype=torch.float32).reshape(len(rows), width - 1)}
           if any(r.get("trainer_logprobs") is not None for r in rows) else {}),
        "temperature": torch.tensor([float(r.get("temperature") or 1.0) for r in rows]),
        "allowed_token_ids": pad_allowed([r.get("allowed") for r in rows], width - 1),
    }


class GRPOCollator:
    """Right-pads a batch of tokenised members (or, with a VLM ``encoder``, tokenises them with their
    images); scalars become float tensors."""

    def __init__(self, pad_token_id: int, encoder=None):
        self.pad_token_id = pad_token_id
        self.encoder = encoder

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        if self.encoder is not None:
            return {**self.encoder.collate(self.encoder.encode(rows)), **self.scalars(rows)}
        if rows and isinstance(rows[0]["advantage"], list):  # --choice-softmax: each item is one state's group
            import torch

            keys = ("input_ids", "completion_mask", "advantage", "logprob_sum", "episode_reward", "episode_group_std",
                    *TOKEN_EXACT_KEYS)
            members = [dict(zip(keys, values)) for group in rows for values in zip(*(group[k] for k in keys))]
            index = [g for g, group in enumerate(rows) for _ in group["advantage"]]
            return {**pad_members(members, self.pad_token_id), **self.scalars(members), "group_index": torch.tensor(index)}
        return {**pad_members(rows, self.pad_token_id), **self.scalars(rows)}

    @staticmethod
    def scalars(rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        return {
            "advantage": torch.tensor([float(r["advantage"]) for r in rows]),
            "behaviour_logprob": torch.tensor([0.0 if r["logprob_sum"] is None else float(r["logprob_sum"]) for r in rows]),
            "has_behaviour_logprob": torch.tensor([r["logprob_sum"] is not None for r in rows]),
            "episode_reward": torch.tensor([float(r["episode_reward"]) for r in rows]),
            "episode_group_std": torch.tensor([float(r["episode_group_std"]) for r in rows]),
        }


def make_trainer_class():
    from transformers import Trainer

    class StoredGroupsGRPOTrainer(Trainer):
        """The transformers Trainer with GRPO's loss over stored rows (``batch_loss``)."""

        loss_is_scaled_for_ga = False  # compute_loss returns a per-micro-batch mean; let the Trainer divide by GA

        def __init__(self, *args, grpo: GRPOConfig, frac_reward_zero_std: float, **kwargs):
            super().__init__(*args, **kwargs)
            self.grpo = grpo
            self.frac_reward_zero_std = frac_reward_zero_std
            self._metrics: dict[str, list[float]] = defaultdict(list)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, stats = batch_loss(model, inputs, self.grpo, clip_range(self.grpo))
            for key, value in stats.items():
                self._metrics[key].append(value)
            return (loss, None) if return_outputs else loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self._metrics and "loss" in logs:
                logs.update({k: sum(v) / len(v) for k, v in self._metrics.items() if v})
                logs["frac_reward_zero_std"] = self.frac_reward_zero_std
                self._metrics.clear()
            super().log(logs, start_time)

    return StoredGroupsGRPOTrainer


# ---------------------------------------------------------------------------- the job


def _make_dataset(cfg: GRPOConfig, read, tokenizer, vlm: dict[str, Any] | None = None):
    """Training rows with their advantages; ``vlm`` (the VLM path's stats) keeps prompts untokenised for its collator."""
    rows = read.table.to_pylist()
    by_state = cfg.group_by == "state"
    if by_state:
        summary = state_members(rows, cfg.scale_rewards, cfg.policy_version, cfg.max_staleness, cfg.state_baseline)
    else:
        summary = training_members(rows, cfg.omega, cfg.scale_rewards, cfg.policy_version, cfg.max_staleness)
    zero_advantage = 0
    if cfg.beta == 0 and not cfg.choice_softmax:  # --choice-softmax keeps them: they are in their group's normaliser
        # A row whose advantage is exactly 0 (the group's lowest under --state-baseline min, a score equal to its
        # group's mean) adds nothing to the policy gradient, and without a KL term nothing to the loss: it would
        # only take a batch slot from a row that teaches something.
        kept = [m for m in summary.members if m["advantage"] != 0]
        zero_advantage = len(summary.members) - len(kept)
        summary.members = kept
    log.info(
        "%d %s groups, %d with zero reward std (%.0f%%): %d rows skipped, %d with advantage 0 left out, "
        "%d stale rows dropped, %d rows kept",
        summary.episode_groups, cfg.group_by, summary.zero_std_groups, 100 * summary.frac_reward_zero_std,
        summary.skipped_rows, zero_advantage, summary.stale_rows, len(summary.members),
    )
    credit = step_credit(rows, summary.members) if not by_state else {}
    if not summary.members:
        raise NoTrainingSignalError(
            f"no GRPO rows with a reward signal: all {summary.episode_groups} {'state ' if by_state else ''}group(s) have zero reward std"
            f"{f' or are staler than --max-staleness {cfg.max_staleness}' if summary.stale_rows else ''}: "
            + ("sample more candidates per state, at a higher temperature" if by_state
               else "collect more attempts per task, at a higher temperature")
        )
    if cfg.choice_softmax:
        if vlm is not None:
            raise TrainConfigError("--choice-softmax is built for text base models; a vision-language base model trains without it")
        encoded, dropped = choice_groups(summary.members, tokenizer, cfg)
        if not encoded:
            raise NoTrainingSignalError("no state group with two or more scored candidates and a reward spread for --choice-softmax")
        behaviour_rows = sum(len(g["advantage"]) for g in encoded)
    else:
        encoded, dropped = _encode_members(summary.members, tokenizer, cfg, vlm)
        behaviour_rows = sum(1 for r in encoded if r["logprob_sum"] is not None or r.get("token_logprobs") is not None)
    if dropped:
        log.warning("dropped %d %s longer than --max-length %d tokens", dropped, "state groups with a candidate" if cfg.choice_softmax else "rows", cfg.max_length)
    import pyarrow as pa

    dataset = to_dataset(pa.Table.from_pylist(encoded)) if encoded else to_dataset(pa.table({"input_ids": pa.array([], pa.list_(pa.int64()))}))
    extra = {
        **({"vlm": vlm} if vlm is not None else {}),
        "group_by": cfg.group_by,
        f"{cfg.group_by}_groups": summary.episode_groups,
        "zero_std_groups": summary.zero_std_groups,
        "frac_reward_zero_std": summary.frac_reward_zero_std,
        "skipped_rows": summary.skipped_rows,
        "zero_advantage_rows": zero_advantage,
        "stale_rows": summary.stale_rows,
        "start_policy_version": summary.policy_version,
        "rows_with_behaviour_logprobs": behaviour_rows,
        **credit,
    }
    return dataset, dropped, extra


def _encode_members(members: list[dict[str, Any]], tokenizer, cfg: GRPOConfig, vlm: dict[str, Any] | None):
    """One training row per member; returns (rows, how many were longer than --max-length)."""
    from halo_train.behaviour import token_exact

    encoded = []
    dropped = 0
    for r in members:
        # A row with stored token ids is scored token by token (or on-policy), never by its sequence logprob.
        scalars = {"advantage": r["advantage"], "logprob_sum": r["logprob_sum"] if token_exact(r) is None else None,
                   "episode_reward": r["reward"], "episode_group_std": r["group_std"]}
        if vlm is not None:  # tokenised with its images when the batch is built
            encoded.append({"prompt": r["prompt"], "completion": r["completion"], "screenshot_hash": r["screenshot_hash"], **scalars})
            continue
        enc = tokenize_member(tokenizer, r["prompt"], r["completion"], cfg.max_completion_length, r)
        if cfg.max_length is not None and len(enc["input_ids"]) > cfg.max_length:
            dropped += 1
            continue
        encoded.append({**enc, **scalars})
    return encoded, dropped


def choice_groups(members: list[dict[str, Any]], tokenizer, cfg: GRPOConfig) -> tuple[list[dict[str, Any]], int]:
    """--choice-softmax: one item per state group, each distinct completion once (equal completions share
    the mean of their advantages), with its behaviour share log p(a) - log sum p(a') from the stored
    logprob_sums. A group of token-exact candidates some of which carry no stored logprob (a covered
    choice: ``--cover-choices`` forces it through a one-choice request, whose logprobs say nothing of the
    page's draw) is trained on-policy: its shares are NaN, which ``choice_softmax_loss`` reads as the current
    policy's own (ratio 1). Other groups missing a stored logprob, or with no spread left, are left out
    (logged); returns (items, groups dropped for --max-length)."""
    from halo_train.behaviour import token_exact

    by_group: dict[Any, dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    for m in members:
        by_group[m["group_key"]].setdefault(m["completion"], []).append(m)
    items, dropped, unscored = [], 0, 0
    for same in by_group.values():
        rows = [{**copies[0], "advantage": sum(c["advantage"] for c in copies) / len(copies)} for copies in same.values()]
        if len(rows) < 2 or all(r["advantage"] == 0 for r in rows):
            continue
        on_policy = any(r["logprob_sum"] is None for r in rows)
        if on_policy and not all(token_exact(r) is not None for r in rows):
            unscored += 1
            continue
        encs = [tokenize_member(tokenizer, r["prompt"], r["completion"], cfg.max_completion_length, r) for r in rows]
        if cfg.max_length is not None and any(len(e["input_ids"]) > cfg.max_length for e in encs):
            dropped += 1
            continue
        if on_policy:
            norm, rows = math.nan, [{**r, "logprob_sum": math.nan} for r in rows]
        else:
            top = max(float(r["logprob_sum"]) for r in rows)
            norm = top + math.log(sum(math.exp(float(r["logprob_sum"]) - top) for r in rows))
        items.append({
            "input_ids": [e["input_ids"] for e in encs],
            "completion_mask": [e["completion_mask"] for e in encs],
            "advantage": [float(r["advantage"]) for r in rows],
            "logprob_sum": [float(r["logprob_sum"]) - norm for r in rows],
            "episode_reward": [float(r["reward"]) for r in rows],
            "episode_group_std": [float(r["group_std"]) for r in rows],
            # token-exact candidates: their stored ids are scored under their draw's distribution (a masked draw's)
            **{k: [e[k] for e in encs] for k in TOKEN_EXACT_KEYS},
        })
    if unscored:
        log.warning("%d state groups left out: a candidate has no stored logprob, which --choice-softmax needs", unscored)
    return items, dropped


def _make_trainer(cfg: GRPOConfig, model, tokenizer, dataset, callbacks: list, frac_reward_zero_std: float, encoder=None):
    from transformers import TrainingArguments

    args = TrainingArguments(**common_training_args(cfg), remove_unused_columns=False)
    if args.gradient_checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    trainer_cls = make_trainer_class()
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=GRPOCollator(getattr(tokenizer, "tokenizer", tokenizer).pad_token_id, encoder),
        processing_class=tokenizer,
        callbacks=callbacks,
        grpo=cfg,
        frac_reward_zero_std=frac_reward_zero_std,
    )
    return trainer


def training_rows(cfg: GRPOConfig, read, tokenizer, vision: dict[str, Any] | None = None):
    """The rows ``read`` holds as training items: (dataset, rows dropped, figures for training_stats.json, the
    collator's encoder). ``vision`` (``halo_train.vlm.vlm_stats`` of a vision-language base model): the items keep
    their prompts and screenshots, tokenised with their images by the returned encoder when a batch is built."""
    import pyarrow as pa

    from halo_train import vlm

    dataset, dropped, extra = _make_dataset(cfg, read, tokenizer, vlm=vision)
    encoder = None
    if vision is not None:
        encoder, rows, dropped = vlm.batch_encoder(
            cfg, read, tokenizer, dataset.to_list(), vision, max_completion_length=cfg.max_completion_length)
        dataset = dataset.select(range(0)) if not rows else to_dataset(pa.Table.from_pylist(rows))
    return dataset, dropped, extra, encoder


def train_grpo(cfg: GRPOConfig) -> TrainResult:
    """Train a LoRA adapter on the stored groups (grpo_groups, or state_groups with group_by "state"); returns where it is and how to serve it."""
    from halo_agent.vlm import is_vlm
    from halo_train import vlm
    from halo_train.config import base_model_path

    if cfg.tis_cap:
        raise TrainConfigError("--tis-cap weighs each row by the trainer's score before the update, which the persistent "
                               "learner computes: use it with halo-train online-grpo")
    vision = is_vlm(base_model_path(cfg.base_model))

    def make_dataset(cfg_, read, tokenizer):
        dataset, dropped, extra, state["encoder"] = training_rows(cfg_, read, tokenizer, state.get("vlm"))
        state["extra"] = extra
        return dataset, dropped, extra

    def make_trainer(cfg_, model, tokenizer, dataset, callbacks):
        return _make_trainer(cfg_, model, tokenizer, dataset, callbacks, state["extra"]["frac_reward_zero_std"], state.get("encoder"))

    def on_load(model, tokenizer):
        if vision:
            state["vlm"] = vlm.vlm_stats(model, tokenizer)

    state: dict[str, Any] = {}
    spec = JobSpec(
        make_dataset=make_dataset,
        make_trainer=make_trainer,
        start_version=lambda cfg_, read: state["extra"]["start_policy_version"],
        sql=members_sql(cfg.group_by, vision),
        on_load=on_load,
    )
    return run_job(cfg, spec)
