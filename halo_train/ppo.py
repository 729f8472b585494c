"""Clipped PPO over a LoRA model with a value head and GAE, on the os environment (online) or on lake steps (offline).

    halo-train ppo --base-model models/tiny --serve --env os --subset short \\
        --epochs 4 --samples-per-epoch 16 --ppo-epochs 4 --batch-size 8 --output-dir out/ppo
    halo-train ppo --base-model models/tiny --from-lake --where "env = 'os'" --epochs 2 --output-dir out/ppo-offline

    from halo_train.ppo import PPOConfig, train_ppo
    result = train_ppo(PPOConfig(base_model="models/tiny", serve=True, subset="short", epochs=2))

One epoch, top to bottom:

1. Data. Online: the engine (HALO's chat server with ``--serve``, or vLLM at ``--engine-url``: the same
   engine, runtime LoRA load and reload as online GRPO) serves ``RUN-policy-{N}``; ``halo-agent``'s rollout
   runs ``--samples-per-epoch`` episodes of the tasks into the lake (run ``RUN-e{N}``), every step with
   the sampled tokens' logprobs. Offline (``--from-lake``): the ``steps`` rows ``--where`` selects.
   Either way the rows are read back from the lake at one snapshot (its table versions are the
   epoch's lineage in ``runs``).
2. Rewards. Each step's reward is its ``success`` component (``r_success``): the reward map's value
   of the episode's outcome (+1 correct, -0.5 incorrect, 0 unknown by default) on the step that ended
   it, 0 before. Online, ``--reward-map`` is the environment's, so the stored steps carry it; offline,
   the steps keep the map they were collected with.
3. Values and advantages. A value head (a linear layer on the adapter model's last hidden state at the
   prompt's last token) estimates V(s_t) per turn. GAE runs over the turns of each episode:
   delta_t = r_t + gamma V(s_{t+1}) - V(s_t) (V = 0 past the last turn), A_t = sum (gamma lambda)^k delta,
   returns R_t = A_t + V(s_t). Every completion token of turn t gets A_t (advantages whitened per batch).
   The head learns at ``--value-lr`` (``--lr`` by default).
   A value head and GAE rather than a group baseline: os episodes are multi-turn with the reward at
   the end, so a per-turn critic credits the turns, where one episode-level baseline would not.
4. Loss, ``--ppo-epochs`` passes over the batch in minibatches of ``--batch-size``:
   ratio_i = exp(log pi_theta(token_i) - log pi_old(token_i)) per completion token, against the
   logprobs stored at rollout time. A token-exact step (stored ``completion_token_ids``) is scored on
   those ids under the distribution its logprobs are of (``halo_train.behaviour``: the softmax at the
   sampling temperature; a guided choice's masked, renormalised one), so every ratio starts at 1.
   Steps of older lakes keep the earlier behaviour: the completion re-tokenised with the end-of-turn
   token appended, the raw softmax, and the current weights' logprobs where a step has none or they do
   not align with the re-tokenized completion (and for the end-of-turn token); policy loss -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) averaged over tokens;
   value loss 0.5 (V - R)^2 (clipped around the old value by ``--clip-range-value``); an entropy
   bonus ``--entropy-coef`` x the mean token entropy; with ``--kl-coef`` > 0 a KL penalty to the
   base model (the adapter disabled; the k3 estimator).
5. Checkpoint. ``OUTPUT/epoch_{N}/``: the adapter, ``value_head.pt``, ``optimizer.pt`` and
   ``training_stats.json``; online, it is loaded into the engine as ``RUN-policy-{N}`` for the next epoch.
6. Metrics. ``train_metrics`` (step = epoch): ``policy_loss``, ``value_loss``, ``entropy``, ``kl``,
   ``approx_kl``, ``clip_fraction``, ``reward`` (mean episode reward), ``accuracy`` (share of episodes
   correct), ``explained_variance``, ``episodes``, ``tokens``; the ``runs`` row carries the lineage.

``--resume-from OUTPUT/epoch_N`` continues the run (its run id, adapter, value head and optimizer) at
epoch N+1. Evaluate an adapter with ``halo-agent eval --env os`` (modes ``os_adapter`` or a mode file),
or merge it with ``halo-train merge``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import random
import sys
from pathlib import Path
from typing import Any, Iterator

from halo_train.config import TrainConfig, TrainConfigError, _field

log = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.pt"
OPTIMIZER_FILE = "optimizer.pt"

STEPS_SQL = """
SELECT run_id, episode_id, step_idx, prompt, model_output, logprobs, r_success, success, is_last,
    completion_token_ids, logprobs_mode, draw, choices, temperature
FROM steps
WHERE prompt IS NOT NULL AND model_output IS NOT NULL {where}
ORDER BY run_id, episode_id, step_idx
"""


class PPOError(TrainConfigError):
    """A PPO run that cannot start or go on as configured; one line that says what to do."""


@dataclasses.dataclass
class PPOConfig(TrainConfig):
    """Clipped PPO over a LoRA model, a value head with GAE, on the os environment or on lake steps."""

    epochs: float = _field(1.0, "Epochs: each samples (or reads) a batch, runs --ppo-epochs passes over it and saves OUTPUT/epoch_N.")
    lora_dropout: float = _field(0.0, "Dropout on the LoRA branch (0: the update's ratios compare the function that sampled, not a dropped-out one).")
    target_modules: list = _field(["q_proj", "k_proj", "v_proj", "o_proj"], "Modules that get LoRA weights, comma-separated.")
    env: str = _field("os", "Environment to sample from online (os).")
    tasks: list = _field([], "Tasks to sample (comma-separated); --subset or every task when empty.")
    subset: str | None = _field("short", "Named subset of the environment's tasks (os: short, files, permissions, processes, text, users, all).")
    task_file: str | None = _field(None, "os tasks from this file (HALO YAML or LifelongAgentBench os_interaction JSON).")
    samples_per_epoch: int = _field(16, "Episodes sampled per epoch (online).")
    ppo_epochs: int = _field(4, "Optimisation passes over each epoch's batch.")
    reward_map: str | None = _field(None, "Reward per outcome, e.g. correct=1,incorrect=-0.5,unknown=0 (the default).")
    gamma: float = _field(1.0, "Discount between turns.")
    gae_lambda: float = _field(0.95, "GAE lambda.")
    clip_range: float = _field(0.2, "PPO ratio clip epsilon.")
    clip_range_value: float | None = _field(0.2, "Clip the value update around the old value (None: no clip).")
    value_coef: float = _field(0.5, "Weight of the value loss.")
    value_lr: float | None = _field(None, "Learning rate of the value head (None: --lr). The head starts at zero and learns only from "
                                    "the returns: at a policy's small --lr it explains little of them for many epochs.")
    entropy_coef: float = _field(0.01, "Weight of the entropy bonus.")
    kl_coef: float = _field(0.0, "Weight of the KL penalty to the base model (0: none).")
    max_grad_norm: float = _field(1.0, "Gradient clipping norm.")
    whiten_advantages: bool = _field(True, "Normalise advantages to mean 0, std 1 per batch.")
    temperature: float = _field(1.0, "Sampling temperature (1: the stored logprobs are the sampling policy's).")
    max_tokens: int = _field(48, "Most tokens a turn's answer may take.")
    max_episode_steps: int = _field(5, "Turns per episode (the os environment's round limit).")
    engine_url: str | None = _field(None, "An OpenAI-compatible engine already running (vLLM with runtime LoRA, or HALO's chat server).")
    engine_wait: float = _field(60.0, "Seconds to wait for the engine to answer at the start.")
    serve: bool = _field(False, "Start HALO's chat server (CPU) on 127.0.0.1 for the run and stop it at the end.")
    from_lake: bool = _field(False, "Offline: train on the steps --where selects instead of sampling.")
    workers: int = _field(1, "Rollout worker processes (online).")
    progress: bool = _field(False, "Progress bars of the rollouts.")

    job_type = "ppo"
    default_view = "steps"

    def __post_init__(self) -> None:
        resume_from, self.resume_from = self.resume_from, None  # a PPO epoch folder, not a Trainer checkpoint
        super().__post_init__()
        self.resume_from = resume_from
        if resume_from is not None and not (Path(resume_from) / VALUE_HEAD_FILE).exists():
            raise PPOError(f"--resume-from {resume_from} is not a ppo epoch folder (no {VALUE_HEAD_FILE}): pass OUTPUT_DIR/epoch_N")
        if isinstance(self.tasks, str):
            self.tasks = [t.strip() for t in self.tasks.split(",") if t.strip()]
        if self.tasks:
            self.subset = None
        for name in ("samples_per_epoch", "ppo_epochs", "max_tokens", "max_episode_steps", "workers"):
            if int(getattr(self, name)) < 1:
                raise PPOError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if int(self.epochs) != self.epochs or self.epochs < 1:
            raise PPOError(f"--epochs must be a whole number of at least 1 for ppo, got {self.epochs}")
        if not 0 < self.clip_range < 1:
            raise PPOError(f"--clip-range must be in (0, 1), got {self.clip_range}")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise PPOError("--gamma and --gae-lambda must be in [0, 1]")
        if self.value_lr is not None and self.value_lr <= 0:
            raise PPOError(f"--value-lr must be positive, got {self.value_lr}")
        if min(self.value_coef, self.entropy_coef, self.kl_coef) < 0:
            raise PPOError("--value-coef, --entropy-coef and --kl-coef must be 0 or more")
        if not self.from_lake and bool(self.engine_url) == bool(self.serve):
            raise PPOError("online ppo needs exactly one of --engine-url URL or --serve (or --from-lake to train on stored steps)")
        from halo_agent.envs.os_env import RewardMap

        try:
            RewardMap.parse(self.reward_map)
        except ValueError as e:
            raise PPOError(str(e)) from None


# ---------------------------------------------------------------------------------------- the model


class ValueHead:
    """V(s): a linear layer on the last hidden state at the prompt's last token (float32, beside the LoRA model)."""

    def __init__(self, hidden_size: int, device) -> None:
        import torch

        self.linear = torch.nn.Linear(hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def __call__(self, hidden):
        return self.linear(hidden.float()).squeeze(-1)

    def parameters(self):
        return self.linear.parameters()

    def save(self, folder: Path) -> None:
        import torch

        torch.save(self.linear.state_dict(), folder / VALUE_HEAD_FILE)

    def load(self, folder: Path) -> None:
        import torch

        self.linear.load_state_dict(torch.load(folder / VALUE_HEAD_FILE, map_location="cpu"))


@dataclasses.dataclass
class Turn:
    """One step as PPO trains on it."""

    episode_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float | None]  # per completion token; None where the rollout reported none
    reward: float
    last: bool
    correct: bool
    temperature: float = 1.0  # of the distribution behaviour_logprobs are of (halo_train.behaviour)
    allowed: list[list[int]] | None = None  # a masked draw's allowed tokens at each completion token
    old_logprobs: list[float] = dataclasses.field(default_factory=list)
    ref_logprobs: list[float] = dataclasses.field(default_factory=list)
    old_value: float = 0.0
    advantage: float = 0.0
    ret: float = 0.0


# ---------------------------------------------------------------------------------------- data


def turns_from_rows(rows: list[dict[str, Any]], tokenizer) -> list[Turn]:
    """Tokenized turns from ``steps`` rows (ordered by episode and step): a token-exact step's stored ids and
    logprobs, else (older lakes) the re-tokenised completion and the stored logprobs where they align."""
    from halo_train.behaviour import stored_completion
    from halo_train.data import chat_text, prompt_messages

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else tokenizer.eos_token_id
    turns = []
    for row in rows:
        messages = prompt_messages(row["prompt"])
        prompt_ids = tokenizer(chat_text(tokenizer, messages, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        completion = stored_completion(tokenizer, row, row["model_output"], 1 << 30, eos=eos)
        if completion.behaviour is not None:  # token-exact: its logprobs, or none to compare (on-policy)
            behaviour: list[float | None] = list(completion.logprobs or [None] * len(completion.token_ids))
        else:
            stored = list(row["logprobs"] or [])
            aligned = len(stored) == len(completion.token_ids) - 1
            behaviour = [*stored, None] if aligned else [None] * len(completion.token_ids)
        turns.append(Turn(row["episode_id"], prompt_ids, completion.token_ids, behaviour, float(row["r_success"] or 0.0),
                          bool(row["is_last"]), bool(row["success"]), completion.temperature, completion.allowed))
    return turns


def read_steps(lake_root: str, where: str | None, as_of: Any = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The ``steps`` rows ``where`` selects, at one snapshot (the current one, or ``as_of``); and its table versions."""
    from halo_data.lake import Lake
    from halo_data.query import check_read_only
    from halo_train.data import resolve_versions

    lake = Lake.open(lake_root)
    versions = resolve_versions(lake, as_of)
    sql = STEPS_SQL.format(where=f"AND ({where})" if where else "")
    check_read_only(sql)
    con = lake.connect(as_of=versions)
    try:
        rows = con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()
    return rows, versions


# ---------------------------------------------------------------------------------------- forward


def _batch(turns: list[Turn], pad_id: int, device):
    """Right-padded input ids, attention mask, and each turn's prompt length and total length."""
    import torch

    seqs = [t.prompt_ids + t.completion_ids for t in turns]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def forward(model, value_head, turns: list[Turn], pad_id: int, with_values: bool = True):
    """Per turn: completion-token logprobs under the turn's behaviour distribution (``halo_train.behaviour``),
    entropies of the raw distribution (lists of tensors) and V(prompt) (a tensor)."""
    import torch

    from halo_train.behaviour import pad_allowed, processed_token_logps

    device = next(model.parameters()).device
    ids, mask = _batch(turns, pad_id, device)
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=with_values)
    logits = out.logits.float()
    logprobs, entropies, last_hidden = [], [], []
    for i, t in enumerate(turns):
        start, end = len(t.prompt_ids), len(t.prompt_ids) + len(t.completion_ids)
        step_logits = logits[i, start - 1 : end - 1]  # position p predicts token p + 1
        log_softmax = step_logits.log_softmax(-1)
        target = ids[i, start:end]
        if t.temperature == 1.0 and t.allowed is None:
            logprobs.append(log_softmax.gather(-1, target.unsqueeze(-1)).squeeze(-1))
        else:
            allowed = pad_allowed([t.allowed], len(target)).to(device) if t.allowed is not None else None
            temperature = torch.tensor([t.temperature], device=device)
            logprobs.append(processed_token_logps(step_logits[None], target[None], temperature, allowed)[0])
        entropies.append(-(log_softmax.exp() * log_softmax).sum(-1))
        if with_values:
            last_hidden.append(out.hidden_states[-1][i, start - 1])
    values = value_head(torch.stack(last_hidden)) if with_values else None
    return logprobs, entropies, values


def fill_old(model, value_head, turns: list[Turn], pad_id: int, batch_size: int, kl: bool) -> None:
    """Old logprobs (stored where aligned, else the current weights'), old values and reference logprobs."""
    import torch

    with torch.no_grad():
        for chunk in _chunks(turns, batch_size):
            logprobs, _, values = forward(model, value_head, chunk, pad_id)
            for t, lp, v in zip(chunk, logprobs, values):
                current = lp.tolist()
                t.old_logprobs = [c if b is None else b for b, c in zip(t.behaviour_logprobs, current)]
                t.old_value = float(v)
            if kl:
                with model.disable_adapter():
                    ref, _, _ = forward(model, value_head, chunk, pad_id, with_values=False)
                for t, lp in zip(chunk, ref):
                    t.ref_logprobs = lp.tolist()


def gae(turns: list[Turn], gamma: float, lam: float) -> None:
    """Turn-level GAE within each episode (turns ordered by episode and step)."""
    by_episode: dict[str, list[Turn]] = {}
    for t in turns:
        by_episode.setdefault(t.episode_id, []).append(t)
    for episode in by_episode.values():
        next_value, running = 0.0, 0.0
        for t in reversed(episode):
            delta = t.reward + gamma * next_value - t.old_value
            running = delta + gamma * lam * running
            t.advantage, t.ret = running, running + t.old_value
            next_value = t.old_value


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# ---------------------------------------------------------------------------------------- the update


def ppo_loss(cfg: PPOConfig, model, value_head, batch: list[Turn], pad_id: int, advantages: dict[int, float]):
    """The minibatch's loss and its statistics."""
    import torch

    logprobs, entropies, values = forward(model, value_head, batch, pad_id)
    device = values.device
    pg_terms, ent_terms, kl_terms, clipped, approx_kl = [], [], [], 0, []
    for t, lp, ent in zip(batch, logprobs, entropies):
        old = torch.tensor(t.old_logprobs, device=device)
        adv = advantages[id(t)]
        ratio = (lp - old).exp()
        pg_terms.append(-torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_range) * adv))
        clipped += int(((ratio - 1).abs() > cfg.clip_range).sum())
        approx_kl.append(((ratio - 1) - (lp - old)).detach())
        ent_terms.append(ent)
        if cfg.kl_coef > 0:
            delta = torch.tensor(t.ref_logprobs, device=device) - lp
            kl_terms.append(delta.exp() - delta - 1)
    tokens = torch.cat(pg_terms)
    policy_loss = tokens.mean()
    entropy = torch.cat(ent_terms).mean()
    kl = torch.cat(kl_terms).mean() if kl_terms else torch.zeros((), device=device)
    returns = torch.tensor([t.ret for t in batch], device=device)
    old_values = torch.tensor([t.old_value for t in batch], device=device)
    value_loss = (values - returns) ** 2
    if cfg.clip_range_value is not None:
        clipped_values = old_values + (values - old_values).clamp(-cfg.clip_range_value, cfg.clip_range_value)
        value_loss = torch.max(value_loss, (clipped_values - returns) ** 2)
    value_loss = 0.5 * value_loss.mean()
    loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy + cfg.kl_coef * kl
    stats = {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": entropy.item(), "kl": kl.item(),
             "approx_kl": float(torch.cat(approx_kl).mean()), "clip_fraction": clipped / max(1, tokens.numel()),
             "tokens": tokens.numel()}
    return loss, stats


def update(cfg: PPOConfig, model, value_head, optimizer, turns: list[Turn], pad_id: int, seed: int) -> dict[str, float]:
    """``--ppo-epochs`` passes of clipped PPO over the batch; the mean of each statistic."""
    import torch

    advantages = [t.advantage for t in turns]
    mean = sum(advantages) / len(advantages)
    std = math.sqrt(sum((a - mean) ** 2 for a in advantages) / len(advantages))
    scale = (lambda a: (a - mean) / (std + 1e-8)) if cfg.whiten_advantages and len(turns) > 1 else (lambda a: a)
    scaled = {id(t): scale(t.advantage) for t in turns}
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad] + list(value_head.parameters())
    totals: dict[str, float] = {}
    n = 0
    model.train()
    for _ in range(cfg.ppo_epochs):
        order = list(turns)
        rng.shuffle(order)
        for batch in _chunks(order, cfg.batch_size):
            loss, stats = ppo_loss(cfg, model, value_head, batch, pad_id, scaled)
            optimizer.zero_grad()
            loss.backward()
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            optimizer.step()
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
            n += 1
    model.eval()
    out = {k: v / n for k, v in totals.items() if k != "tokens"}
    out["tokens"] = totals.get("tokens", 0.0) / cfg.ppo_epochs
    return out


def make_optimizer(cfg: PPOConfig, model, value_head):
    """AdamW over the LoRA weights at ``--lr`` and the value head at ``--value-lr``."""
    import torch

    return torch.optim.AdamW([
        {"params": [p for p in model.parameters() if p.requires_grad], "lr": cfg.lr},
        {"params": list(value_head.parameters()), "lr": cfg.value_lr if cfg.value_lr is not None else cfg.lr},
    ])


def batch_stats(turns: list[Turn]) -> dict[str, float]:
    """Episode reward and accuracy of the batch, and how much of the returns the old values explain."""
    episodes: dict[str, tuple[float, bool]] = {}
    for t in turns:
        reward, correct = episodes.get(t.episode_id, (0.0, False))
        episodes[t.episode_id] = (reward + t.reward, correct or t.correct)
    returns = [t.ret for t in turns]
    residual = [t.ret - t.old_value for t in turns]
    var = _variance(returns)
    return {
        "reward": sum(r for r, _ in episodes.values()) / len(episodes),
        "accuracy": sum(c for _, c in episodes.values()) / len(episodes),
        "episodes": float(len(episodes)),
        "explained_variance": 1.0 - _variance(residual) / var if var > 0 else 0.0,
    }


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


# ---------------------------------------------------------------------------------------- the run


@dataclasses.dataclass
class PPOState:
    run_id: str
    epoch: int  # epochs done
    started_at: dt.datetime
    history: list[dict[str, Any]]
    served: str | None = None  # the engine's name for the weights that sample next


def train_ppo(cfg: PPOConfig):
    """Run (or resume) PPO; returns a ``TrainResult`` like the other jobs."""
    import torch

    from halo_data.lake import Lake
    from halo_train import backends
    from halo_train.config import base_model_path
    from halo_train.trainer_utils import TrainResult, eval_command, quiet_hub, read_stats, serve_command

    quiet_hub()
    torch.manual_seed(cfg.seed)
    state = _start_state(cfg, read_stats(cfg.resume_from) if cfg.resume_from else {})
    if cfg.resume_from:
        cfg = dataclasses.replace(cfg, init_adapter=cfg.resume_from)
    lake = Lake.init(cfg.lake)
    loaded = backends.load_for_training(cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    value_head = ValueHead(model.config.hidden_size, device)
    optimizer = make_optimizer(cfg, model, value_head)
    if cfg.resume_from:
        value_head.load(Path(cfg.resume_from))
        saved = torch.load(Path(cfg.resume_from) / OPTIMIZER_FILE, map_location="cpu")
        if len(saved["param_groups"]) != len(optimizer.param_groups):
            raise PPOError(f"--resume-from {cfg.resume_from}: its optimizer.pt has one parameter group (saved before the value head "
                           "had its own learning rate); start a new run with --init-adapter on that folder instead")
        optimizer.load_state_dict(saved)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    base_model = base_model_path(cfg.base_model)
    _record(lake, cfg, state, base_model, "running", {})
    status = "failed"
    last: Path | None = Path(cfg.resume_from) if cfg.resume_from else None
    try:
        with _engine(cfg, output_dir) as engine:
            if engine is not None and last is not None:
                state.served = _serve(engine, state.run_id, state.epoch, last, None)
            for epoch in range(state.epoch + 1, int(cfg.epochs) + 1):
                rows, lineage = _collect(cfg, engine, state, epoch)
                turns = turns_from_rows(rows, tokenizer)
                if not turns:
                    raise PPOError(f"no steps to train on for epoch {epoch}" + (f" (--where {cfg.where!r})" if cfg.where else ""))
                model.eval()
                fill_old(model, value_head, turns, pad_id, cfg.batch_size, cfg.kl_coef > 0)
                gae(turns, cfg.gamma, cfg.gae_lambda)
                metrics = {**batch_stats(turns), **update(cfg, model, value_head, optimizer, turns, pad_id, cfg.seed + epoch)}
                metrics["learning_rate"] = cfg.lr
                last = _save_epoch(cfg, model, tokenizer, value_head, optimizer, state, epoch, metrics, lineage, base_model)
                _write_metrics(lake, state.run_id, epoch, metrics)
                state.epoch = epoch
                _record(lake, cfg, state, base_model, "running", lineage, policy_version=str(epoch))
                log.info("epoch %d: reward %.3f, accuracy %.0f%%, policy loss %.4f, value loss %.4f, clip %.2f",
                         epoch, metrics["reward"], 100 * metrics["accuracy"], metrics["policy_loss"], metrics["value_loss"],
                         metrics["clip_fraction"])
                if engine is not None and epoch < int(cfg.epochs):
                    state.served = _serve(engine, state.run_id, epoch, last, state.served)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        _record(lake, cfg, state, base_model, status, state.history[-1]["lineage"] if state.history else {},
                policy_version=str(state.epoch), ended=True)
    if last is None:
        raise PPOError(f"nothing trained: the run was already at epoch {state.epoch} of --epochs {int(cfg.epochs)}")
    name = cfg.adapter_name or "halo-ppo"
    return TrainResult(
        run_id=state.run_id, job_type="ppo", output_dir=output_dir, final_adapter=last,
        checkpoints=sorted(output_dir.glob("epoch_*"), key=lambda p: int(p.name.split("_")[-1])),
        global_step=state.epoch, rows=sum(int(h["metrics"].get("episodes", 0)) for h in state.history), dropped_rows=0,
        metrics=state.history[-1]["metrics"] if state.history else {}, lineage=state.history[-1]["lineage"] if state.history else {},
        policy_version=str(state.epoch), serve_command=serve_command(base_model, name, last.resolve(), cfg.lora_r),
        eval_command=eval_command("ppo", name), extra={"history": state.history},
    )


def _start_state(cfg: PPOConfig, resumed: dict[str, Any]) -> PPOState:
    from halo_data.ids import check_run_id
    from halo_train.trainer_utils import new_run_id

    if cfg.resume_from and resumed.get("job_type") != "ppo":
        raise PPOError(f"--resume-from {cfg.resume_from} is not a ppo epoch folder (no ppo training_stats.json)")
    run_id = cfg.run_id or resumed.get("run_id") or new_run_id("ppo")
    try:
        check_run_id(run_id)
    except ValueError as e:
        raise PPOError(str(e)) from None
    started = dt.datetime.fromisoformat(resumed["started_at"]) if resumed.get("started_at") else dt.datetime.now(dt.timezone.utc)
    return PPOState(run_id, int(resumed.get("epoch", 0)), started, list(resumed.get("history", [])))


@contextlib.contextmanager
def _engine(cfg: PPOConfig, out: Path):
    """The serving engine online (online GRPO's ``open_engine``), None offline."""
    if cfg.from_lake:
        yield None
        return
    from halo_train.served import OnlineError, open_engine

    try:
        with open_engine(cfg, out) as (engine, base_name):
            engine.base_name = base_name
            yield engine
    except OnlineError as e:
        raise PPOError(str(e)) from None


def _serve(engine, run_id: str, epoch: int, path: Path, retire: str | None) -> str | None:
    """Load epoch ``epoch``'s adapter under the run's name for it (``RUN-policy-{epoch}``) in place of ``retire``."""
    from halo_train.served import version_name

    name = version_name(run_id, epoch)
    swap = engine.swap_adapter(name, str(path.resolve()), retire=retire)
    if not swap.loaded:
        raise PPOError(f"the engine refused {path}: {swap.message}")
    return name


def _collect(cfg: PPOConfig, engine, state: PPOState, epoch: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The epoch's rows: a fresh rollout run through the engine (online), or the stored steps (offline)."""
    if engine is None:
        return read_steps(cfg.lake, cfg.where, cfg.as_of)
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake
    from halo_data.runs import existing_run

    run_id = f"{state.run_id}-e{epoch}"
    options = {"task_file": cfg.task_file, "max_rounds": cfg.max_episode_steps, "reward_map": cfg.reward_map}
    env_options = {k: v for k, v in options.items() if v is not None}
    n_tasks = len(cfg.tasks) if cfg.tasks else cfg.samples_per_epoch
    run_rollouts(RolloutConfig(
        env=cfg.env, tasks=list(cfg.tasks), subset=cfg.subset if not cfg.tasks else None,
        sample_size=min(n_tasks, cfg.samples_per_epoch) if not cfg.tasks else None,
        rollouts_per_task=max(1, math.ceil(cfg.samples_per_epoch / n_tasks)), policy="openai",
        model=engine.base_name, adapter=state.served, policy_version=str(epoch - 1),
        policy_options={"base_url": engine.base_url, "max_tokens": cfg.max_tokens}, temperature=cfg.temperature,
        seed=cfg.seed + epoch, max_steps=cfg.max_episode_steps, workers=cfg.workers, lake=cfg.lake, run_id=run_id,
        resume=existing_run(Lake.open(cfg.lake), run_id) is not None, progress=cfg.progress,
        env_options=env_options, command="halo-train ppo",
    )).stop_if_interrupted()
    where = f"run_id = '{run_id}'" + (f" AND ({cfg.where})" if cfg.where else "")
    return read_steps(cfg.lake, where)


def _save_epoch(cfg, model, tokenizer, value_head, optimizer, state: PPOState, epoch: int, metrics, lineage, base_model) -> Path:
    """``OUTPUT/epoch_N``: adapter, value head, optimizer, training_stats.json; renamed into place when complete."""
    import shutil

    import torch

    from halo_train.trainer_utils import STATS_FILE

    final = Path(cfg.output_dir) / f"epoch_{epoch}"
    staging = Path(cfg.output_dir) / f".epoch_{epoch}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    value_head.save(staging)
    torch.save(optimizer.state_dict(), staging / OPTIMIZER_FILE)
    state.history.append({"epoch": epoch, "metrics": metrics, "lineage": lineage})
    stats = {
        "job_type": "ppo", "run_id": state.run_id, "epoch": epoch, "base_model": base_model, "policy_version": str(epoch),
        "adapter_name": cfg.adapter_name, "started_at": state.started_at.isoformat(),
        "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(), "metrics": metrics, "lineage": lineage,
        "history": state.history, "config": cfg.to_dict(),
    }
    (staging / STATS_FILE).write_text(json.dumps(stats, indent=2, default=str))
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def _write_metrics(lake, run_id: str, epoch: int, metrics: dict[str, float]) -> None:
    from halo_data.writer import append_rows
    from halo_train.metrics import metric_rows

    append_rows(lake, "train_metrics", metric_rows(run_id, epoch, float(epoch), metrics))


def _record(lake, cfg: PPOConfig, state: PPOState, base_model: str, status: str, lineage: dict[str, int],
            policy_version: str | None = None, ended: bool = False) -> None:
    from halo_train.metrics import record_run

    command = " ".join(sys.argv) if sys.argv and "halo-train" in Path(sys.argv[0]).name else None
    record_run(
        lake, run_id=state.run_id, job_type="ppo", base_model=base_model, config_json=cfg.to_json(),
        source_view="steps" + (f" WHERE {cfg.where}" if cfg.where else ""), lineage=lineage,
        output_dir=str(Path(cfg.output_dir).resolve()), status=status, started_at=state.started_at,
        ended_at=dt.datetime.now(dt.timezone.utc) if ended else None, adapter=cfg.adapter_name, policy_version=policy_version,
        command=command,
    )
