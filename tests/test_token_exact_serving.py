"""Token-exact answers from HALO's chat server, in vLLM's shapes: the tokens generated (EOS included), one logprob
each, of the distribution each token was drawn from (``processed_logprobs``) or the model's own (``raw_logprobs``)."""

from __future__ import annotations

import collections
import json
import math
import urllib.request

import pytest

torch = pytest.importorskip("torch")

from halo_agent.chat_server import ChatCompletionServer  # noqa: E402
from halo_agent.policies.guided_choice import ChoiceMask, sequence_token_logprobs  # noqa: E402
from halo_agent.policies.hf_policy import LocalChatModel  # noqa: E402

MESSAGES = [{"role": "user", "content": "Click the Submit button.\n[12] button 'Submit'\n[13] link 'Tab #2'"}]
CHOICES = ["# 'Submit'\nclick('12')", "# 'Tab #2'\nclick('13')", "# 'Tab #2'\nclick('13') twice", "noop()"]


@pytest.fixture(scope="module")
def engine(tiny_lora_models):
    base, _ = tiny_lora_models
    return LocalChatModel(base, device="cpu")


@pytest.fixture(scope="module")
def server(engine):
    with ChatCompletionServer(engine, served_model_name="tiny") as s:
        yield s


def post(server, **body) -> dict:
    body = {"model": "tiny", "messages": MESSAGES, **body}
    request = urllib.request.Request(f"{server.url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def token_ids(choice: dict) -> list[int]:
    """The ids of ``return_tokens_as_token_ids`` tokens (``"token_id:N"``)."""
    names = [t["token"] for t in choice["logprobs"]["content"]]
    assert all(name.startswith("token_id:") for name in names)
    return [int(name.split(":", 1)[1]) for name in names]


def raw_choice_logprobs(engine, choices):
    prompt_ids, _ = engine.chat_prompt(MESSAGES)
    completions = [engine.tokenizer(c, add_special_tokens=False)["input_ids"] + [engine.tokenizer.eos_token_id] for c in choices]
    with torch.inference_mode():
        return completions, engine._score(prompt_ids, completions)


def tempered_logprobs(engine, prompt_ids: list[int], completion: list[int], temperature: float) -> list[float]:
    """Each completion token's log-softmax at the temperature, from one forward over prompt and completion."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prompt_ids + completion])).logits[0].float()
    logprobs = (logits[len(prompt_ids) - 1:-1] / temperature).log_softmax(-1)
    return [float(logprobs[j, t]) for j, t in enumerate(completion)]


def masked_path_logprobs(engine, path: list[int], choices, temperature: float, messages=MESSAGES) -> list[float]:
    """Each token of a guided choice's path under vLLM's mask, from one forward over prompt and path: the logits at
    the temperature renormalised over the tokens the mask allowed there (0.0 where one was allowed)."""
    prompt_ids = engine.chat_prompt(messages)[0]
    mask = ChoiceMask(engine.tokenizer, choices, engine.tokenizer.eos_token_id)
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prompt_ids + list(path)])).logits[0, len(prompt_ids) - 1:-1].float()
    out = []
    for j, token in enumerate(path):
        allowed = mask.allowed(path[:j])
        out.append(0.0 if len(allowed) == 1 else float((logits[j, allowed] / temperature).log_softmax(-1)[allowed.index(token)]))
    return out


def test_a_guided_choice_answers_its_tokens_with_the_masked_draws_logprobs(server, engine):
    answer = post(server, n=8, temperature=0.7, seed=3, logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True,
                  return_token_ids=True, structured_outputs={"choice": CHOICES})
    for choice in answer["choices"]:
        ids = token_ids(choice)
        assert ids == choice["token_ids"] and ids[-1] == engine.tokenizer.eos_token_id  # the tokens drawn, then EOS
        assert engine.tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"] in CHOICES
        logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert len(logprobs) == len(ids)
        assert logprobs == pytest.approx(masked_path_logprobs(engine, ids, CHOICES, 0.7), abs=1e-5)
        assert (choice["halo_logprobs_mode"], choice["halo_draw"]) == ("processed_logprobs", "masked_choice")
        for entry in choice["logprobs"]["content"]:  # the allowed tokens, most likely first
            assert 1 <= len(entry["top_logprobs"]) <= 3
            assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
    assert answer["prompt_token_ids"] == engine.chat_prompt(MESSAGES)[0]
    # One choice alone is not forced token by token: the mask still allows each way of spelling it (a token that
    # is the only one allowed, EOS at the end among them, is 0.0).
    forced = post(server, temperature=1.0, logprobs=True, return_token_ids=True, structured_outputs={"choice": CHOICES[:1]})
    alone = forced["choices"][0]
    assert alone["message"]["content"] == CHOICES[0] and alone["logprobs"]["content"][-1]["logprob"] == 0.0
    assert [t["logprob"] for t in alone["logprobs"]["content"]] == pytest.approx(
        masked_path_logprobs(engine, alone["token_ids"], CHOICES[:1], 1.0), abs=1e-5)
    # Greedy: the most likely allowed token at each step, the masked distribution at temperature 1 reported.
    greedy = post(server, temperature=0, logprobs=True, top_logprobs=20, return_token_ids=True,
                  structured_outputs={"choice": CHOICES})["choices"][0]
    assert greedy["halo_draw"] == "greedy"
    reported = [t["logprob"] for t in greedy["logprobs"]["content"]]
    assert reported == pytest.approx(masked_path_logprobs(engine, greedy["token_ids"], CHOICES, 1.0), abs=1e-5)
    assert all(t["logprob"] >= max(o["logprob"] for o in t["top_logprobs"]) - 1e-6 for t in greedy["logprobs"]["content"])


def test_raw_logprobs_are_vllms_under_the_mask_and_the_sequence_draw_is_written_token_by_token(tiny_lora_models, engine):
    base, _ = tiny_lora_models
    completions, raw = raw_choice_logprobs(engine, CHOICES)
    # raw_logprobs under a guided choice: vLLM masks the logits before its sampler computes them, so the masked
    # distribution at temperature 1 (not at the request's 1.5).
    masked = LocalChatModel(base, device="cpu", logprobs_mode="raw_logprobs")
    for g in masked.choose(MESSAGES, CHOICES, n=6, temperature=1.5, seed=1).generations:
        assert g.logprobs == pytest.approx(masked_path_logprobs(engine, g.token_ids, CHOICES, 1.0), abs=1e-5)
        assert (g.logprobs_mode, g.draw) == ("raw_logprobs", "masked_choice")
    for mode, expected in [("raw_logprobs", raw), ("processed_logprobs", sequence_token_logprobs(completions, raw, 1.5))]:
        other = LocalChatModel(base, device="cpu", logprobs_mode=mode, choice_draw="sequence")
        batch = other.choose(MESSAGES, CHOICES, n=6, temperature=1.5, seed=1)
        for g in batch.generations:
            i = CHOICES.index(g.text)
            assert g.token_ids == completions[i] and g.logprobs == pytest.approx(expected[i], abs=1e-5)
            assert (g.logprobs_mode, g.draw) == (mode, "sequence_choice")
    # Token by token, the whole-sequence draw is its softmax over the choices' sequence scores.
    by_sequence = torch.tensor([sum(r) / 1.5 for r in raw], dtype=torch.float64).log_softmax(0).tolist()
    assert [sum(row) for row in sequence_token_logprobs(completions, raw, 1.5)] == pytest.approx(by_sequence, abs=1e-9)


def test_sampled_tokens_carry_the_tempered_softmax_they_were_drawn_from(server, engine):
    answer = post(server, n=3, temperature=1.3, seed=5, max_tokens=12, logprobs=True, top_logprobs=2,
                  return_tokens_as_token_ids=True, return_token_ids=True)
    prompt_ids = answer["prompt_token_ids"]
    assert prompt_ids == engine.chat_prompt(MESSAGES)[0]
    stopped = 0
    for choice in answer["choices"]:
        ids = token_ids(choice)
        assert ids == choice["token_ids"]
        assert engine.tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
        logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert len(logprobs) == len(ids) == (12 if choice["finish_reason"] == "length" else len(ids))
        assert logprobs == pytest.approx(tempered_logprobs(engine, prompt_ids, ids, 1.3), abs=1e-4)
        assert (choice["halo_logprobs_mode"], choice["halo_draw"]) == ("processed_logprobs", "sample")
        if choice["finish_reason"] == "stop":  # stopped on EOS: the EOS is the last token, with its logprob
            assert ids[-1] in engine.eos_token_ids
            stopped += 1
        assert all(len(t["top_logprobs"]) == 2 for t in choice["logprobs"]["content"])
    greedy = post(server, temperature=0, max_tokens=8, logprobs=True, return_token_ids=True)["choices"][0]
    assert greedy["halo_draw"] == "greedy"
    assert [t["logprob"] for t in greedy["logprobs"]["content"]] == pytest.approx(
        tempered_logprobs(engine, prompt_ids, greedy["token_ids"], 1.0), abs=1e-4)
    assert greedy["logprobs"]["content"][0]["token"] == engine.tokenizer.decode([greedy["token_ids"][0]])


def test_prompt_logprobs_follow_vllm(server, engine):
    answer = post(server, temperature=0, max_tokens=2, prompt_logprobs=2)
    prompt_ids = engine.chat_prompt(MESSAGES)[0]
    entries = answer["prompt_logprobs"]
    assert len(entries) == len(prompt_ids) and entries[0] is None
    with torch.inference_mode():
        logprobs = engine.model(input_ids=torch.tensor([prompt_ids])).logits[0].float().log_softmax(-1)
    for j, (token, entry) in enumerate(zip(prompt_ids[1:], entries[1:])):
        own = entry[str(token)]
        assert own["logprob"] == pytest.approx(float(logprobs[j, token]), abs=1e-4)
        assert own["decoded_token"] == engine.tokenizer.decode([token])
        assert own["rank"] == int((logprobs[j] > logprobs[j, token]).sum()) + 1
        assert {v["rank"] for v in entry.values()} >= {1, 2} and 2 <= len(entry) <= 3
        assert all(v["logprob"] <= 0 and not math.isinf(v["logprob"]) for v in entry.values())
    assert "prompt_logprobs" not in post(server, temperature=0, max_tokens=1)


def test_the_cached_walk_answers_as_a_fresh_prefill_of_the_whole_prompt(tiny_lora_models, engine):
    base, adapters = tiny_lora_models
    full = LocalChatModel(base, device="cpu", score_mode="full")
    completions, raw = raw_choice_logprobs(engine, CHOICES)
    for mode in ("processed_logprobs", "raw_logprobs"):
        engine.logprobs_mode = full.logprobs_mode = mode
        try:
            cached_batch = engine.choose(MESSAGES, CHOICES, n=16, temperature=1.0, seed=2, top_logprobs=5)
            full_batch = full.choose(MESSAGES, CHOICES, n=16, temperature=1.0, seed=2, top_logprobs=5)
        finally:
            engine.logprobs_mode = full.logprobs_mode = "processed_logprobs"
        for g, other in zip(cached_batch.generations, full_batch.generations):  # the same draws, logprobs, allowed tokens
            assert g.token_ids == other.token_ids and g.logprobs == pytest.approx(other.logprobs, abs=1e-5)
            assert [[t for t, _ in row] for row in g.top_logprobs] == [[t for t, _ in row] for row in other.top_logprobs]
    assert engine.choose(MESSAGES, CHOICES, temperature=0).generations[0].token_ids == full.choose(MESSAGES, CHOICES, temperature=0).generations[0].token_ids
    # The walk draws each path with the probability its logprobs say: 400 draws against the likeliest path's.
    drawn = [g for seed in range(25) for g in engine.choose(MESSAGES, CHOICES, n=16, temperature=1.0, seed=seed).generations]
    paths = collections.Counter(tuple(g.token_ids) for g in drawn)
    top, count = paths.most_common(1)[0]
    logprob = math.fsum(next(g.logprobs for g in drawn if tuple(g.token_ids) == top))
    assert count / len(drawn) == pytest.approx(math.exp(logprob), abs=0.07)
    # The whole-sequence draw scores every choice from the cache as the full scoring does.
    sequence = LocalChatModel(base, device="cpu", choice_draw="sequence")
    answer = sequence.choose(MESSAGES, CHOICES, n=4, temperature=1.0, seed=0, top_logprobs=2)
    for g in answer.generations:
        assert g.logprobs == pytest.approx(sequence_token_logprobs(completions, raw, 1.0)[CHOICES.index(g.text)], abs=1e-5)


def test_a_prompt_sharing_a_prefix_with_a_recent_one_is_prefilled_from_where_they_part(tiny_lora_models):
    base, adapters = tiny_lora_models
    engine = LocalChatModel(base, device="cpu")
    later = [MESSAGES[0], {"role": "assistant", "content": "click('12')"}, {"role": "user", "content": "Next action:"}]
    engine.choose(MESSAGES, CHOICES, temperature=1.0, seed=0)
    cache = engine.prompt_cache
    assert (cache.hits, cache.tokens_reused) == (0, 0)
    engine.choose(MESSAGES, CHOICES, temperature=1.0, seed=1)
    assert cache.hits == 1
    prefilled = cache.tokens_prefilled
    reused = engine.choose(later, CHOICES, n=8, temperature=1.0, seed=3, top_logprobs=1)
    prompt_ids = engine.chat_prompt(later)[0]
    assert 0 < cache.tokens_reused and cache.tokens_prefilled - prefilled < len(prompt_ids)
    fresh = LocalChatModel(base, device="cpu", score_mode="full").choose(later, CHOICES, n=8, temperature=1.0, seed=3)
    for g, other in zip(reused.generations, fresh.generations):
        assert g.token_ids == other.token_ids and g.logprobs == pytest.approx(other.logprobs, abs=1e-5)
    # An adapter loaded under a name changes what the name serves: the caches are dropped.
    engine.load_adapter("policy-1", adapters["policy-1"])
    assert len(engine.prompt_cache) == 0
    with_adapter = engine.choose(MESSAGES, CHOICES, n=4, temperature=1.0, seed=0, adapter="policy-1")
    reference = LocalChatModel(base, adapters={"policy-1": adapters["policy-1"]}, device="cpu", score_mode="full")
    expected = reference.choose(MESSAGES, CHOICES, n=4, temperature=1.0, seed=0, adapter="policy-1").generations
    for g, other in zip(with_adapter.generations, expected):
        assert g.token_ids == other.token_ids and g.logprobs == pytest.approx(other.logprobs, abs=1e-5)


def test_metrics_count_requests_and_the_prompt_tokens_the_cache_spared(server, engine):
    def metrics() -> dict[str, float]:
        with urllib.request.urlopen(server.url.rsplit("/v1", 1)[0] + "/metrics", timeout=30) as r:
            return {name: float(value) for name, value in (line.split() for line in r.read().decode().splitlines())}

    before = metrics()
    for seed in range(2):
        post(server, temperature=1.0, seed=seed, structured_outputs={"choice": CHOICES})
    after = metrics()
    prompt = len(engine.chat_prompt(MESSAGES)[0])
    assert after["halo_chat_requests_total"] - before["halo_chat_requests_total"] == 2
    assert after["halo_chat_guided_choice_requests_total"] - before["halo_chat_guided_choice_requests_total"] == 2
    assert after["halo_chat_prompt_tokens_total"] - before["halo_chat_prompt_tokens_total"] == 2 * prompt
    # The second request's prompt is the first's: none of it is prefilled again.
    assert after["halo_chat_prefix_cache_hit_tokens_total"] - before["halo_chat_prefix_cache_hit_tokens_total"] >= prompt
    assert after["halo_chat_engine_seconds_total"] > before["halo_chat_engine_seconds_total"]
