"""Token-exact steps: the engine's token ids and per-token logprobs land in the lake, and the trainers score them.

The ratio-is-one test runs real rollouts through HALO's chat server (a tiny model, a guided choice drawn under
the grammar mask and plain sampling, at a temperature other than 1) into a tmp lake, then the GRPO trainer's
ratio computation on the stored rows: before any update every token-level ratio is 1.
"""

from __future__ import annotations

import math

import pytest

from halo_data import schema as S
from halo_data.lake import Lake
from halo_data.records import RecordError, StepRecord
from test_lake import make_older_lake

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TEMPERATURE = 0.7  # not 1: a trainer that forgets the temperature cannot pass


# ------------------------------------------------------------------------------------------ the record


def test_a_step_keeps_one_logprob_per_token_and_names_its_distribution():
    step = StepRecord(step_idx=0, model_output="click('12')", completion_token_ids=[5, 9, 2], logprobs=[-0.5, 0.0, -1.25],
                      logprobs_mode="processed_logprobs", draw="masked_choice", choices=["click('12')", "click('13')"])
    row = step.row()
    assert (row["completion_token_ids"], row["logprobs"], row["logprobs_mode"], row["draw"], row["choices"]) == (
        [5, 9, 2], [-0.5, 0.0, -1.25], "processed_logprobs", "masked_choice", ["click('12')", "click('13')"])
    with pytest.raises(RecordError, match=r"'completion_token_ids' \(3\) and 'logprobs' \(2\) must have one logprob per token"):
        StepRecord(step_idx=0, completion_token_ids=[5, 9, 2], logprobs=[-0.5, 0.0])
    with pytest.raises(RecordError, match="'draw' must be one of masked_choice, sequence_choice, sample, greedy, got 'beam'"):
        StepRecord(step_idx=0, draw="beam")
    with pytest.raises(RecordError, match="'completion_token_ids' must be a list of token ids"):
        StepRecord(step_idx=0, completion_token_ids=["5"])


def test_an_older_lake_reads_the_token_columns_as_null(tmp_path):
    root = tmp_path / "lake"
    make_older_lake(root)
    got = Lake.open(root).query_arrow(
        "select completion_token_ids, logprobs_mode, draw, choices from steps order by step_idx").to_pylist()
    assert got == [{"completion_token_ids": None, "logprobs_mode": None, "draw": None, "choices": None}] * 2
    assert {c.name for c in S.TOKEN_COLUMNS} <= set(S.CANDIDATES.column_names)


def test_token_id_strings_parse_and_token_text_gives_no_ids():
    from halo_agent.policies.openai_policy import token_ids

    assert token_ids(["token_id:12", "token_id:0", "token_id:151645"]) == [12, 0, 151645]
    assert token_ids(["click", "token_id:3"]) is None  # an endpoint that returns text: the ids are unknown
    assert token_ids(["token_id:-1"]) is None


# ------------------------------------------------------------------------------------- the trainer's math


def test_the_trainers_masked_logprobs_are_the_masked_draws_over_the_allowed_tokens():
    from halo_agent.policies.guided_choice import allowed_tokens
    from halo_agent.policies.hf_policy import masked_choice_logprobs
    from halo_train.behaviour import pad_allowed, processed_token_logps

    torch.manual_seed(0)
    choices = [[4, 7, 1, 0], [4, 7, 2, 0], [4, 3, 0], [5, 0]]  # shared prefixes, then where they part
    # One context per prefix: choices that share a prefix see the same logits there, as the model gives them.
    at_prefix = {}
    logits = torch.stack([torch.stack([at_prefix.setdefault(tuple(c[:j]), torch.randn(9)) for j in range(4)]) for c in choices])
    raw = logits.log_softmax(-1)
    per_token = [[float(raw[i, j, t]) for j, t in enumerate(c)] for i, c in enumerate(choices)]
    expected = masked_choice_logprobs(choices, per_token, TEMPERATURE)
    targets = torch.tensor([c + [0] * (4 - len(c)) for c in choices])
    trie = allowed_tokens(choices)  # where these token-level choices part, each prefix's next tokens
    allowed = pad_allowed([[[t] + [x for x in trie[tuple(c[:j])] if x != t] for j, t in enumerate(c)] for c in choices], 4)
    got = processed_token_logps(logits, targets, torch.full((4,), TEMPERATURE), allowed)
    for i, c in enumerate(choices):
        assert float(got[i, : len(c)].sum()) == pytest.approx(expected[i], abs=1e-5)
    assert float(got[0, 3]) == 0.0 and float(got[3, 1]) == 0.0  # tokens every remaining choice shares are forced
    assert sum(math.exp(v) for v in expected) == pytest.approx(1.0)
    # Unmasked positions: the softmax at the temperature.
    plain = processed_token_logps(logits, targets, torch.full((4,), TEMPERATURE), None)
    assert torch.allclose(plain, (logits / TEMPERATURE).log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1))


# --------------------------------------------------------------------------- the ratio-is-one test, end to end


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model served by HALO's chat server, and its folder."""
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_train.tiny_model import build_tiny_model

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    with ChatCompletionServer(LocalChatModel(folder, device="cpu"), served_model_name="tiny") as server:
        yield server, str(folder)
    torch.set_num_threads(previous)


def test_an_endpoint_that_refuses_token_ids_is_asked_again_without_them(served):
    from halo_agent.policies.openai_policy import OpenAIPolicy
    from test_openai_policy import FlakyProxy, _observation

    server, _ = served
    refusal = (400, "Unrecognized request argument supplied: return_tokens_as_token_ids", {})
    with FlakyProxy(server.url, [refusal]) as proxy:
        policy = OpenAIPolicy(model="tiny", base_url=proxy.url, max_tokens=4, temperature=TEMPERATURE)
        out = policy.act(_observation())
        policy.act(_observation())
    assert [b.get("return_tokens_as_token_ids") for b in proxy.bodies] == [True, None, None]
    assert out.api_error is None and out.completion_token_ids is None and len(out.logprobs) == out.completion_tokens
    assert (out.draw, out.logprobs_mode, out.choices) == ("sample", "processed_logprobs", None)


def test_the_hf_policy_stores_the_generations_tokens_and_their_distribution(served):
    from halo_agent.policies.hf_policy import HFPolicy
    from test_openai_policy import _observation

    _, folder = served
    policy = HFPolicy(model=folder, temperature=TEMPERATURE, max_new_tokens=6, device="cpu", seed=1)
    out = policy.act(_observation())
    assert len(out.completion_token_ids) == len(out.logprobs) == out.completion_tokens > 0
    assert (out.logprobs_mode, out.draw, out.choices) == ("processed_logprobs", "sample", None)


def _rollout(server, lake: str, run_id: str, constrain: bool, candidates: int = 0):
    from halo_agent.rollout import RolloutConfig, run_rollouts

    return run_rollouts(RolloutConfig(
        env="miniwob", tasks=["click-button"], rollouts_per_task=2, policy="openai", model="tiny", temperature=TEMPERATURE,
        policy_options={"base_url": server.url, "max_tokens": 12, "constrain_actions": constrain},
        candidates_per_state=candidates, observation="elements", max_steps=2, seed=3, task_seed=3,
        lake=lake, run_id=run_id, progress=False,
    ))


def _ratios(model, tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The GRPO trainer's token-level ratios over each row's completion tokens, and its old sequence ratios."""
    from halo_train.grpo import pad_members, tokenize_member
    from halo_train.grpo_loss import behaviour_token_logps

    exact = [tokenize_member(tokenizer, r["prompt"], r["completion"], 256, r) for r in rows]
    batch = pad_members(exact, tokenizer.pad_token_id)
    with torch.no_grad():
        token_logps, mask = behaviour_token_logps(model, batch)
        ratios = torch.exp(token_logps - batch["token_logprobs"])[mask.bool()]
        # What the trainer did before token ids: the raw softmax of the re-tokenised text against logprob_sum.
        legacy = pad_members([tokenize_member(tokenizer, r["prompt"], r["completion"], 256) for r in rows], tokenizer.pad_token_id)
        raw, legacy_mask = behaviour_token_logps(model, legacy)
        sequence = (raw * legacy_mask).sum(-1)
        n_tokens = legacy_mask.sum(-1)
        old = torch.exp((sequence - torch.tensor([r["logprob_sum"] for r in rows])) / n_tokens)
    assert bool(batch["has_token_logprobs"].all())
    return ratios, old


@pytest.mark.slow
def test_every_token_ratio_is_one_before_the_first_update_under_the_masked_draw_and_plain_sampling(served, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.data import read_view
    from halo_train.grpo import MEMBERS_SQL, STATE_MEMBERS_SQL

    server, folder = served
    lake = str(tmp_path / "lake")
    _rollout(server, lake, "masked", constrain=True, candidates=2)
    _rollout(server, lake, "sampled", constrain=False)
    steps = Lake.open(lake).query_arrow(
        "select run_id, draw, logprobs_mode, temperature, len(completion_token_ids) = len(logprobs) as aligned, choices "
        "from steps").to_pylist()
    assert {(s["run_id"], s["draw"], s["logprobs_mode"], s["temperature"], s["aligned"]) for s in steps} == {
        ("masked", "masked_choice", "processed_logprobs", TEMPERATURE, True),
        ("sampled", "sample", "processed_logprobs", TEMPERATURE, True)}
    assert all((s["choices"] is not None) == (s["run_id"] == "masked") for s in steps)

    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    rows = read_view(lake, "grpo_groups", where="level = 'episode'", sql=MEMBERS_SQL).table.to_pylist()
    candidates = read_view(lake, "state_groups", sql=STATE_MEMBERS_SQL).table.to_pylist()
    assert candidates and all(c["draw"] == "masked_choice" for c in candidates)
    worst = {}
    for draw in ("masked_choice", "sample"):
        of_draw = [r for r in rows if r["draw"] == draw] + [c for c in candidates if c["draw"] == draw]
        ratios, old = _ratios(model, tokenizer, of_draw)
        worst[draw] = float((ratios - 1).abs().max())
        print(f"{draw}: {len(of_draw)} completions, {ratios.numel()} tokens, max |ratio - 1| = {worst[draw]:.2e}; "
              f"the old sequence ratio: max |r - 1| = {float((old - 1).abs().max()):.2e}")
        assert worst[draw] < 1e-4, draw
        # The old comparison (a raw whole-sequence logprob against the drawn distribution's) is not 1.
        assert float((old - 1).abs().max()) > 1e-3, draw

    # PPO's ratio on the same steps: its old logprobs are the stored ones, its current ones the same distribution's.
    from halo_train.ppo import forward, read_steps, turns_from_rows

    turns = turns_from_rows(read_steps(lake, None)[0], tokenizer)
    with torch.no_grad():
        current, _, _ = forward(model, None, turns, tokenizer.pad_token_id, with_values=False)
    ppo_worst = max(abs(math.exp(c - b) - 1) for t, lp in zip(turns, current) for c, b in zip(lp.tolist(), t.behaviour_logprobs))
    print(f"ppo: {len(turns)} steps, max |ratio - 1| = {ppo_worst:.2e}")
    assert len(turns) == len(steps) and ppo_worst < 1e-4


# ------------------------------------------------------------------------------------ DPO's stored references


def _logp(model, tokenizer, prompt: str, completion_ids: list[int]) -> float:
    """log pi(completion_ids | prompt) under ``model``'s raw softmax."""
    from halo_train.grpo import tokenize_member

    enc = tokenize_member(tokenizer, prompt, "", 256)
    prompt_ids = enc["input_ids"][:-1]  # without the EOS an empty completion gets
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    return float(sum(logps[len(prompt_ids) - 1 + j, t] for j, t in enumerate(completion_ids)))


@pytest.mark.slow
def test_dpo_scores_stored_token_ids_and_keeps_a_reference_only_of_the_raw_softmax(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_data.runs import RunRecord, upsert_runs
    from halo_data.writer import append_rows
    from halo_train import DPOConfig, train_dpo
    from halo_train.tiny_model import build_tiny_model
    from test_mcts_views import node, prompt_at

    folder = build_tiny_model(tmp_path / "tiny")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)

    def sampled(tree: str, node_id: str, action: str, q: float, mode: str, draw: str, temperature: float) -> dict:
        token_ids = list(tokenizer(action, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        stored = [-0.25] * len(token_ids)  # not the model's: a reference that is used shows in the rewards
        return {**node("s1", tree, node_id, action=action, q=q, logprob=sum(stored)), "completion_token_ids": token_ids,
                "logprobs": stored, "logprobs_mode": mode, "draw": draw, "temperature": temperature,
                "choices": ["click('A')", "click('B')"] if draw == "masked_choice" else None}

    lake = Lake.init(tmp_path / "lake")
    upsert_runs(lake, [RunRecord(run_id="s1", kind="rollout", mode="mcts", config={"search": {"theta": 0.1}})])
    append_rows(lake, "mcts_nodes", [
        node("s1", "raw", "0", visits=3),
        sampled("raw", "0.0", "click('A')", 0.9, "raw_logprobs", "sample", 1.0),
        sampled("raw", "0.1", "click('B')", 0.2, "raw_logprobs", "sample", 1.0),
        node("s1", "masked", "0", visits=3),
        sampled("masked", "0.0", "click('A')", 0.9, "processed_logprobs", "masked_choice", TEMPERATURE),
        sampled("masked", "0.1", "click('B')", 0.2, "processed_logprobs", "masked_choice", TEMPERATURE),
    ])
    beta = 0.1
    result = train_dpo(DPOConfig(lake=str(tmp_path / "lake"), base_model=str(folder), output_dir=str(tmp_path / "out"),
                                 max_steps=2, lr=1e-7, batch_size=1, lora_r=4, lora_alpha=8, beta=beta, source="mcts"))
    assert result.rows == 2
    metrics: dict = {}
    for r in lake.query_arrow(f"select step, metric, value from train_metrics where run_id = '{result.run_id}'").to_pylist():
        metrics.setdefault(r["step"], {})[r["metric"]] = r["value"]
    steps = [m for m in metrics.values() if "logps/chosen" in m]
    # Each pair is scored on its stored ids (the text and EOS, not TRL's tokens of the text and the chat turn's end).
    stored_ids = list(tokenizer("click('A')", add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    expected = {"raw": _logp(model, tokenizer, prompt_at("0"), stored_ids)}
    assert sorted(m["logps/chosen"] for m in steps) == pytest.approx([expected["raw"]] * 2, abs=1e-3)
    rewards = sorted(m["rewards/chosen"] for m in steps)
    # The raw pair's reference is its stored logprobs; the masked pair's is the base model on the same ids.
    assert rewards == pytest.approx(sorted([beta * (expected["raw"] + 0.25 * len(stored_ids)), 0.0]), abs=1e-3)
