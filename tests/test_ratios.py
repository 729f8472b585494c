"""Importance ratios that start at 1 on every sampling path: a stored step's logprobs are those of the
distribution its tokens were drawn from, and the trainer rebuilds exactly that one before its first update.

A tiny model whose generation_config.json sets repetition_penalty, min_new_tokens, top_k and top_p (none of which
a step stores) samples through ``HFPolicy`` (transformers' ``generate``) and through HALO's chat server (plain
sampling, greedy and guided choices under vLLM's string-prefix mask, in both logprobs modes); a warm-started
adapter with dropout configured; screenshot prompts for a text model; covered choices trained with
``--choice-softmax``. Each ratio is the GRPO trainer's (``halo_train.grpo``) on the stored row.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from halo_data import prompts  # noqa: E402
from test_openai_policy import ELEMENTS, IMAGE_MESSAGES, PNG, TEXT_MESSAGES, _observation  # noqa: E402

TEMPERATURE = 0.7
# What Qwen2.5-Instruct's generation_config.json does, harder: every one of them would shape the draw.
GENERATION_CONFIG = {"do_sample": True, "temperature": 0.3, "repetition_penalty": 1.3, "min_new_tokens": 3,
                     "top_k": 5, "top_p": 0.5}
# Choices that share prefixes and tokenise differently in context: "no" is 'n' 'o', "noop()" is 'n' 'oop' '()'.
CHOICES = ["no", "noop()", "click('12')", "click('1')", "scroll(0, 200)", "scroll(0, 20)"]


@pytest.fixture(scope="module")
def model_dir(build_once) -> str:
    def build(root):
        from halo_train.tiny_model import build_tiny_model

        folder = build_tiny_model(root / "tiny")
        config = json.loads((folder / "generation_config.json").read_text())
        (folder / "generation_config.json").write_text(json.dumps({**config, **GENERATION_CONFIG}))
        return str(folder)

    return build_once("ratios-generation-config", build)


@pytest.fixture(scope="module")
def served(model_dir):
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel

    torch.set_num_threads(1)
    engine = LocalChatModel(model_dir, device="cpu")
    with ChatCompletionServer(engine, served_model_name="tiny") as server:
        yield server


@pytest.fixture(scope="module")
def trainer_model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def row_of(sample, messages, temperature: float) -> dict:
    """A stored step as the lake keeps it (``StepRecord``'s token columns) and the trainer reads it."""
    return {"prompt": prompts.dumps(messages), "completion": sample.model_output, "logprob_sum": sample.logprob_sum,
            "completion_token_ids": sample.completion_token_ids, "logprobs": sample.logprobs,
            "logprobs_mode": sample.logprobs_mode, "draw": sample.draw, "choices": sample.choices,
            "temperature": temperature}


def worst_ratio(model, tokenizer, rows: list[dict]) -> float:
    """max |ratio - 1| over the rows' completion tokens: the GRPO trainer's token-level ratio before any update."""
    from halo_train.grpo import pad_members, tokenize_member
    from halo_train.grpo_loss import behaviour_token_logps

    encoded = [tokenize_member(tokenizer, r["prompt"], r["completion"], 256, r) for r in rows]
    batch = pad_members(encoded, tokenizer.pad_token_id)
    assert bool(batch["has_token_logprobs"].all())
    with torch.no_grad():
        token_logps, mask = behaviour_token_logps(model, batch)
    ratios = torch.exp(token_logps - batch["token_logprobs"])[mask.bool()]
    return float((ratios - 1).abs().max())


def test_every_sampling_path_starts_at_ratio_one_whatever_the_models_generation_config(served, model_dir, trainer_model):
    from halo_agent.policies.hf_policy import HFPolicy, LocalChatModel
    from halo_agent.policies.openai_policy import OpenAIPolicy

    model, tokenizer = trainer_model
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(model_dir).repetition_penalty == 1.3  # the folder's, which no draw may use
    obs = _observation()
    rows: dict[str, list[dict]] = {}
    for temperature in (TEMPERATURE, 0.0):  # transformers' generate, sampled and greedy
        policy = HFPolicy(model=model_dir, temperature=temperature, n=2 if temperature else 1, max_new_tokens=8,
                          device="cpu", seed=4)
        policy.act(obs)
        rows[f"hf {policy.last_samples[0].draw}"] = [row_of(s, obs.messages, temperature) for s in policy.last_samples]
    for constrain in (False, True):  # HALO's chat server, as vLLM serves it
        for temperature in (TEMPERATURE, 0.0):
            policy = OpenAIPolicy(model="tiny", base_url=served.url, temperature=temperature, n=3 if temperature else 1,
                                  max_tokens=8, constrain_actions=constrain, seed=2)
            policy.act(obs)
            samples = policy.last_samples
            rows[f"server {samples[0].draw}"] = [row_of(s, obs.messages, temperature) for s in samples]
    # vLLM's raw logprobs under a guided choice are of the masked logits at temperature 1: stored and rebuilt so.
    raw = LocalChatModel(model_dir, device="cpu", logprobs_mode="raw_logprobs")
    batch = raw.choose(obs.messages, CHOICES, n=4, temperature=TEMPERATURE, seed=1)
    rows["raw masked_choice"] = [
        {"prompt": prompts.dumps(obs.messages), "completion": g.text, "completion_token_ids": g.token_ids,
         "logprobs": g.logprobs, "logprobs_mode": g.logprobs_mode, "draw": g.draw, "choices": CHOICES,
         "temperature": TEMPERATURE} for g in batch.generations]
    assert set(rows) == {"hf sample", "hf greedy", "server sample", "server greedy", "server masked_choice",
                         "raw masked_choice"}
    for name, of_path in rows.items():
        worst = worst_ratio(model, tokenizer, of_path)
        print(f"{name}: {len(of_path)} rows, max |ratio - 1| = {worst:.2e}")
        assert worst < 1e-4, name


def test_a_warm_started_adapter_with_dropout_configured_scores_ratios_of_one(tiny_lora_models, tmp_path):
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_train.backends import load_for_training
    from halo_train.config import GRPOConfig

    base, adapters = tiny_lora_models
    engine = LocalChatModel(base, adapters={"policy": adapters["policy-1"]}, device="cpu")
    batch = engine.generate(TEXT_MESSAGES, n=3, temperature=TEMPERATURE, max_new_tokens=8, seed=0, adapter="policy")
    rows = [{"prompt": prompts.dumps(TEXT_MESSAGES), "completion": g.text, "completion_token_ids": g.token_ids,
             "logprobs": g.logprobs, "logprobs_mode": g.logprobs_mode, "draw": g.draw, "temperature": TEMPERATURE}
            for g in batch.generations]
    cfg = GRPOConfig(lake=str(tmp_path / "lake"), base_model=base, init_adapter=adapters["policy-1"], lora_dropout=0.3,
                     target_modules=["q_proj", "v_proj"])
    loaded = load_for_training(cfg)
    loaded.model.train()  # as the Trainer runs its forwards
    assert worst_ratio(loaded.model, loaded.tokenizer, rows) < 1e-4
    assert all(m.p == 0 for m in loaded.model.modules() if isinstance(m, torch.nn.Dropout))


def test_a_text_model_is_served_a_screenshot_prompt_as_the_trainer_scores_it(served, trainer_model):
    from halo_agent.policies.openai_policy import OpenAIPolicy
    from halo_train.grpo import tokenize_member

    model, tokenizer = trainer_model
    policy = OpenAIPolicy(model="tiny", base_url=served.url, temperature=TEMPERATURE, n=2, max_tokens=6,
                          use_screenshot=True, seed=5)
    obs = _observation(IMAGE_MESSAGES, screenshot=PNG)
    policy.act(obs)
    assert served.received[-1]["images"] == 1  # the image went to the server
    stored = prompts.dumps(obs.messages)  # the lake's prompt: the image by reference
    prompt_ids = tokenize_member(tokenizer, stored, "", 256)["input_ids"][:-1]  # without an empty completion's EOS
    assert policy.last_samples[0].prompt_tokens == len(prompt_ids)
    assert worst_ratio(model, tokenizer, [row_of(s, obs.messages, TEMPERATURE) for s in policy.last_samples]) < 1e-4


def string_prefix_mask(tokenizer, prefix: list[int], choices: list[str]) -> set[int]:
    """vLLM's guided-choice mask, computed apart from HALO's: every vocabulary token after which the decoded text
    (decoded in context, with the tokens before it) is still a prefix of some choice; EOS once it is a choice."""
    text = tokenizer.decode(prefix)
    allowed = {t for t in range(len(tokenizer))
               if len(after := tokenizer.decode(prefix + [t])) > len(text) and any(c.startswith(after) for c in choices)}
    return allowed | ({tokenizer.eos_token_id} if text in choices else set())


def test_the_guided_choice_mask_is_vllms_string_prefix_mask_in_the_server_and_the_trainer(served):
    from halo_train.behaviour import allowed_tokens

    engine, tokenizer = served.engine, served.engine.tokenizer
    canonical = {c: tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in CHOICES}
    assert canonical["noop()"][: len(canonical["no"]) - 1] != canonical["no"][:-1]  # "no" tokenises apart in "noop()"
    drawn = engine.choose(TEXT_MESSAGES, CHOICES, n=16, temperature=1.5, seed=0, top_logprobs=10_000).generations
    checked = 0
    for g in drawn:
        assert tokenizer.decode(g.token_ids, skip_special_tokens=True) == g.text and g.token_ids[-1] == tokenizer.eos_token_id
        masks = [string_prefix_mask(tokenizer, g.token_ids[:j], CHOICES) for j in range(len(g.token_ids))]
        assert [{t for t, _ in at} for at in g.top_logprobs] == masks  # the server's
        trainer = allowed_tokens(tokenizer, g.token_ids, CHOICES)
        for j in range(len(g.token_ids)):
            assert set(trainer[j]) == masks[j]  # the trainer's, the drawn token first
            assert trainer[j][0] == g.token_ids[j]
            served_logprobs = [v for _, v in g.top_logprobs[j]]
            assert math.fsum(math.exp(v) for v in served_logprobs) == pytest.approx(1.0, abs=1e-5)  # renormalised
            checked += 1
    assert checked > 16
    # The mask allows other tokenisations than each choice's own, and the draw takes them.
    assert any(g.token_ids != canonical[g.text] for g in drawn)
    # Over HTTP: the same draw, its top logprobs the mask's most likely (at most 20).
    answer = _post(served, {"model": "tiny", "messages": TEXT_MESSAGES, "n": 16, "temperature": 1.5, "seed": 0,
                            "logprobs": True, "top_logprobs": 20, "return_token_ids": True,
                            "structured_outputs": {"choice": CHOICES}})
    for choice, g in zip(answer["choices"], drawn):
        assert choice["token_ids"] == g.token_ids
        for j, entry in enumerate(choice["logprobs"]["content"]):
            assert len(entry["top_logprobs"]) == min(20, len(g.top_logprobs[j]))


def _post(server, body: dict) -> dict:
    request = urllib.request.Request(server.url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, **json.loads(e.read())}


def test_sampling_fields_that_would_shape_the_distribution_are_sent_neutral_or_refused(served):
    from halo_agent.policies.openai_policy import NEUTRAL_SAMPLING, OpenAIPolicy, PolicyConfigError
    from halo_train.serve import ServeSpec, vllm_command

    base = {"model": "tiny", "messages": TEXT_MESSAGES, "max_tokens": 2, "temperature": 1.0}
    assert "choices" in _post(served, {**base, **NEUTRAL_SAMPLING, "top_k": 0})
    refused = _post(served, {**base, "repetition_penalty": 1.05})
    assert refused["status"] == 400 and refused["error"]["param"] == "repetition_penalty"
    assert _post(served, {**base, "top_k": 20})["error"]["message"].startswith("top_k must be 0 or -1 here")
    with pytest.raises(PolicyConfigError, match="top_p 0.8 cuts the distribution the stored logprobs are of"):
        OpenAIPolicy(model="tiny", base_url=served.url, top_p=0.8)
    with pytest.raises(ValueError, match="top_p 0.9 cuts the distribution"):
        from halo_agent.policies.hf_policy import HFPolicy

        HFPolicy(model="unused", top_p=0.9)
    # An endpoint that refuses vLLM's fields (OpenAI's) is asked again without them and without token ids.
    from test_openai_policy import FlakyProxy

    with FlakyProxy(served.url, [(400, "Unrecognized request argument supplied: top_k", {})]) as proxy:
        out = OpenAIPolicy(model="tiny", base_url=proxy.url, max_tokens=2, temperature=1.0).act(_observation())
    assert [("top_k" in b, "return_tokens_as_token_ids" in b) for b in proxy.bodies] == [(True, True), (False, False)]
    assert out.api_error is None and out.completion_token_ids is None and proxy.bodies[0]["top_p"] == 1.0
    # vLLM as HALO starts it takes its own defaults, not the model's generation_config.json, unless told otherwise.
    command = vllm_command(ServeSpec("base", {}, engine="vllm"))
    assert command[command.index("--generation-config") + 1] == "vllm"
    told = vllm_command(ServeSpec("base", {}, engine="vllm", extra_args=["--generation-config", "auto"]))
    assert told.count("--generation-config") == 1 and told[-1] == "auto"


def test_cover_choices_with_choice_softmax_trains(served, model_dir, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from halo_agent.actions import page_actions
    from halo_agent.policies.openai_policy import OpenAIPolicy
    from halo_data import ids
    from halo_data.lake import Lake
    from halo_data.writer import append_rows
    from halo_train.cli import main

    policy = OpenAIPolicy(model="tiny", base_url=served.url, temperature=1.0, n=3, max_tokens=16,
                          constrain_actions=True, cover_choices=True, seed=1)
    obs = _observation()
    policy.act(obs)
    samples = policy.last_samples
    assert len(samples) == 3 and {s.model_output for s in samples} <= set(page_actions(ELEMENTS))
    # The action drawn carries its logprobs; the forced ones their tokens only (a one-choice mask says nothing).
    assert samples[0].logprob_sum is not None and all(s.logprobs is None and s.completion_token_ids for s in samples[1:])
    prompt = prompts.dumps(obs.messages)
    lake = Lake.init(tmp_path / "lake")
    append_rows(lake, "candidates", [
        dict(run_id="r", env="miniwob", episode_id="e1", task_id="miniwob.click-button", step_idx=0, state_hash="h-s0",
             candidate_idx=i, prompt=prompt, prompt_hash=ids.sha256_hex(prompt), model_output=s.model_output,
             action=s.action, score=score, score_source="env", policy_version="0", logprob_sum=s.logprob_sum,
             completion_token_ids=s.completion_token_ids, logprobs=s.logprobs, logprobs_mode=s.logprobs_mode,
             draw=s.draw, choices=s.choices, temperature=1.0)
        for i, (s, score) in enumerate(zip(samples, [1.0, 0.0, 0.5]))])
    out = tmp_path / "grpo"
    result = CliRunner().invoke(main, [
        "grpo", "--group-by", "state", "--choice-softmax", "--lake", str(lake.root), "--base-model", model_dir,
        "--output-dir", str(out), "--max-steps", "2", "--lr", "0.01", "--run-id", "covered"])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    assert stats["rows"] == 1  # the state's three choices, one group
    weights = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert any(float(w.abs().max()) > 0 for k, w in weights.items() if "lora_B" in k)  # the parameters moved


def test_the_truncated_importance_weight_corrects_an_engine_trainer_gap_and_is_one_without_one():
    from halo_train.behaviour import truncated_importance_weight

    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weight, stats = truncated_importance_weight(trainer, trainer.clone(), mask)
    assert torch.equal(weight, torch.ones_like(weight)) and stats["engine_log_ratio_max"] == 0.0
    engine = torch.tensor([[-1.1, -3.0, -0.5, -5.0]])  # the engine found the second token far less likely
    weight, stats = truncated_importance_weight(trainer, engine, mask, cap=2.0)
    assert weight[0].tolist() == pytest.approx([math.exp(0.1), 2.0, 1.0, 1.0])
    assert stats["engine_tis_truncated"] == pytest.approx(1 / 3) and stats["engine_log_ratio_max"] == pytest.approx(1.0)
    assert not weight.requires_grad
