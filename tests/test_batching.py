"""The chat server batches guided choices continuously: each answer equals the answer to the same request sent
alone to a server that runs every request alone (same seed, same draw; logprobs within 1e-5)."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import urllib.request

import pytest

torch = pytest.importorskip("torch")

from halo_agent.chat_server import ChatCompletionServer, main  # noqa: E402
from halo_agent.policies.hf_policy import ChoiceRequest, LocalChatModel  # noqa: E402
from halo_agent.policies.prefix_cache import PromptCache  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a browser agent. Answer with one action."}
CHOICES = ["# 'Submit'\nclick('12')", "# 'Tab #2'\nclick('13')", "# 'Tab #2'\nclick('13') twice", "noop()"]


def page(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"Click the button.\n{text}"}]


# Guided choices (some continuing a cached prompt's prefix, one on an adapter, n > 1, greedy) and plain sampling.
REQUESTS = [
    {"messages": page("[12] button 'Submit'\n[13] link 'Tab #2'"), "structured_outputs": {"choice": CHOICES}, "seed": 1},
    {"messages": page("[12] button 'Submit'\n[13] link 'Tab #2'\n[14] text 'more'"), "structured_outputs": {"choice": CHOICES},
     "seed": 2, "n": 3},
    {"messages": page("[40] link 'Next page' and a longer line of text"), "structured_outputs": {"choice": CHOICES[1:]},
     "seed": 3, "temperature": 0.7},
    {"messages": [{"role": "user", "content": "nothing shared with the others"}], "structured_outputs": {"choice": CHOICES},
     "temperature": 0},
    {"messages": page("[12] button 'Submit'"), "structured_outputs": {"choice": CHOICES}, "seed": 5, "model": "policy-1"},
    {"messages": page("[12] button 'Submit'\n[15] link"), "structured_outputs": {"choice": CHOICES}, "seed": 6, "model": "policy-1"},
    {"messages": page("[12] button 'Submit'"), "seed": 7, "max_tokens": 6},
]
WARM = [page("[12] button 'Submit'"), page("[40] link 'Next page'")]


@pytest.fixture(scope="module")
def servers(tiny_lora_models):
    """A batching server and one that runs every request alone, each with its own engine (and prefix cache)."""
    base, adapters = tiny_lora_models
    with ChatCompletionServer(LocalChatModel(base, adapters={"policy-1": adapters["policy-1"]}, device="cpu"),
                              served_model_name="tiny", max_batch=8, batch_window_ms=50) as batching, \
         ChatCompletionServer(LocalChatModel(base, adapters={"policy-1": adapters["policy-1"]}, device="cpu"),
                              served_model_name="tiny", max_batch=1) as alone:
        yield batching, alone


def post(server, body: dict) -> dict:
    body = {"model": "tiny", "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True, **body}
    request = urllib.request.Request(f"{server.url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.origin}/metrics", timeout=30) as r:
        return {name: float(value) for name, value in (line.split() for line in r.read().decode().splitlines())}


def assert_same(batched: dict, alone: dict) -> None:
    assert len(batched["choices"]) == len(alone["choices"])
    for b, a in zip(batched["choices"], alone["choices"]):
        assert b["message"]["content"] == a["message"]["content"]
        assert (b["halo_draw"], b["finish_reason"]) == (a["halo_draw"], a["finish_reason"])
        b_tokens, a_tokens = b["logprobs"]["content"], a["logprobs"]["content"]
        assert [t["token"] for t in b_tokens] == [t["token"] for t in a_tokens]
        for bt, at in zip(b_tokens, a_tokens):
            assert bt["logprob"] == pytest.approx(at["logprob"], abs=1e-5)
            assert [t["token"] for t in bt["top_logprobs"]] == [t["token"] for t in at["top_logprobs"]]
            assert [t["logprob"] for t in bt["top_logprobs"]] == pytest.approx([t["logprob"] for t in at["top_logprobs"]], abs=1e-5)


def test_concurrent_requests_run_as_one_batch_and_answer_as_alone(servers):
    batching, alone = servers
    for server in (batching, alone):  # the same prompts cached in both: later prompts continue from their prefixes
        for messages in WARM:
            post(server, {"messages": messages, "structured_outputs": {"choice": CHOICES}, "seed": 0})
    expected = [post(alone, body) for body in REQUESTS]
    before = metrics(batching)
    # Hold the engine thread while every request arrives, so they queue up and run as one turn.
    holding_engine, release = threading.Event(), threading.Event()

    def hold() -> None:
        holding_engine.set()
        release.wait()

    holding = threading.Thread(target=batching.loop.call, args=(hold,))
    holding.start()
    holding_engine.wait()
    choices, plain = REQUESTS[:-1], REQUESTS[-1]
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = [pool.submit(post, batching, body) for body in choices]
        while batching.loop.queued < len(choices):
            release.wait(0.01)
        futures.append(pool.submit(post, batching, plain))  # queued last: it runs alone once the choices are answered
        while batching.loop.queued < len(REQUESTS):
            release.wait(0.01)
        release.set()
        answers = [f.result() for f in futures]
    holding.join()
    for got, want in zip(answers, expected):
        assert_same(got, want)
    after = metrics(batching)
    delta = {name: after[name] - before[name] for name in after}
    # The base model's four prompts prefilled in one forward, the adapter's two in another; then each forward
    # advanced every walk in progress of one adapter: the four base walks in the first.
    assert delta["halo_chat_batched_prefills_total"] == 2 and delta["halo_chat_batched_prefill_prompts_total"] == 6
    assert after["halo_chat_largest_batch"] == 4
    assert delta["halo_chat_batched_requests_total"] == len(choices)
    assert delta["halo_chat_walk_rows_total"] > delta["halo_chat_walk_forwards_total"] > 0
    assert metrics(alone)["halo_chat_largest_batch"] == 1 and metrics(alone)["halo_chat_batched_requests_total"] == 0
    # Sent again alone, each answer is the same (its prompt now a cache hit).
    assert_same(post(batching, REQUESTS[1]), expected[1])


def test_a_request_joins_the_walks_in_progress_and_answers_as_alone(tiny_lora_models):
    """Continuous batching at the engine: a request admitted while another's walk is part way joins its next
    forward, and both answer as they do alone."""
    engine = LocalChatModel(tiny_lora_models[0], device="cpu")
    engine.walk_batch_from = 2  # two walks in one forward, whichever linear kernel this torch has
    engine.choice_draft = 0  # walks of several forwards (a draft may answer a walk in its prompt's prefill)
    first = ChoiceRequest(page("[12] button 'Submit'\n[13] link 'Tab #2'"), CHOICES, n=2, temperature=1.0, seed=11)
    second = ChoiceRequest(page("[40] link 'Next page'"), CHOICES, n=2, temperature=1.0, seed=12, top_logprobs=2)
    alone = [engine.choose_many([request])[0] for request in (first, second)]
    engine.prompt_cache.clear()
    jobs = engine.start_choices([first])
    assert engine.step_choices(jobs) == [1] and not jobs[0].done
    jobs += engine.start_choices([second])
    sizes = []
    while active := [job for job in jobs if not job.done]:
        sizes += engine.step_choices(active)
    assert sizes[0] == 2  # the second's first forward shared the first's
    for job, want in zip(jobs, alone):
        got = job.answer
        assert [g.token_ids for g in got.generations] == [g.token_ids for g in want.generations]
        for g, w in zip(got.generations, want.generations):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
            assert [[t for t, _ in row] for row in g.top_logprobs or []] == [[t for t, _ in row] for row in w.top_logprobs or []]


def test_batched_prefill_stores_each_prompt_as_prefilled_alone(tiny_lora_models):
    engine = LocalChatModel(tiny_lora_models[0], device="cpu")
    prompts = [engine.chat_prompt(page(text))[0] for text in ("[12] button 'Submit' and more", "[40] link", "x " * 30)]
    prompts.append(prompts[0])  # the same prompt twice in one batch
    one, many = PromptCache(), PromptCache()
    # a draft tree fed after each prompt (none after one): its places come back with the prompt's cache
    drafts = [[(7,), (7, 8), (7, 9), (10,)], [], [(11,), (11, 12), (11, 12, 13)]]
    drafts.append(drafts[0])
    with torch.inference_mode():
        for cache in (one, many):
            cache.prefill(engine.model, engine.chat_prompt(page("[12] button 'Submit'"))[0], None, "cpu")
        alone = [one.prefill(engine.model, p, None, "cpu", d) for p, d in zip(prompts, drafts)]
        together = many.prefill_many(engine.model, prompts, None, "cpu", drafts)
    assert many.batched_prefills == 1 and many.batched_prompts == 3
    assert many.tokens_prefilled == one.tokens_prefilled and many.tokens_reused < one.tokens_reused  # no hit for the twin
    for a, b in zip(alone, together):
        assert a.ids == b.ids
        torch.testing.assert_close(b.next_logprobs, a.next_logprobs, atol=1e-5, rtol=0)
        assert (a.ahead is None) == (b.ahead is None)
        if a.ahead is not None:
            assert a.ahead[0] == b.ahead[0]
            torch.testing.assert_close(b.ahead[1], a.ahead[1], atol=1e-5, rtol=0)
        for (ka, va), (kb, vb) in zip(a.layers, b.layers):
            assert ka.shape == kb.shape
            torch.testing.assert_close(kb, ka, atol=1e-5, rtol=0)
            torch.testing.assert_close(vb, va, atol=1e-5, rtol=0)


def test_a_failing_request_fails_alone(tiny_lora_models):
    engine = LocalChatModel(tiny_lora_models[0], device="cpu")
    good = ChoiceRequest(page("[12] button 'Submit'"), CHOICES, seed=1, temperature=1.0)
    answers = engine.choose_many([good, ChoiceRequest(page("[13] link"), []), ChoiceRequest(page("[14]"), CHOICES, adapter="gone")])
    assert answers[0].generations[0].text == engine.choose(good.messages, CHOICES, seed=1, temperature=1.0).generations[0].text
    assert isinstance(answers[1], ValueError) and "choices" in str(answers[1])
    assert isinstance(answers[2], ValueError) and "unknown adapter" in str(answers[2])


def test_batching_flags_are_checked(capsys):
    assert main(["--model", "unused", "--max-batch", "0"]) == 2
    assert capsys.readouterr().err.startswith("Error: --max-batch")
    assert main(["--model", "unused", "--walk-batch-from", "1"]) == 2
    assert capsys.readouterr().err == "Error: --walk-batch-from must be at least 2\n"


def test_onednn_linear_layers_answer_as_torch_s(tiny_lora_models):
    """The served engine's linear layers on oneDNN (the CPU default) draw what torch's sgemm draws, logprobs within
    float rounding, on the base model and through a LoRA adapter loaded on top."""
    base, adapters = tiny_lora_models
    engines = {kernel: LocalChatModel(base, adapters={"policy-1": adapters["policy-1"]}, device="cpu", linear_kernel=kernel)
               for kernel in ("torch", "auto")}
    assert engines["torch"].linear_kernel == "torch" and engines["torch"].walk_batch_from == 3
    if engines["auto"].linear_kernel != "onednn":
        pytest.skip("this torch build has no oneDNN linear")
    assert engines["auto"].walk_batch_from == 2
    for adapter in (None, "policy-1"):
        request = ChoiceRequest(page("[12] button 'Submit'\n[13] link 'Tab #2'"), CHOICES, n=3, temperature=1.0, seed=4,
                                adapter=adapter)
        want, got = (engines[k].choose_many([request])[0] for k in ("torch", "auto"))
        assert [g.token_ids for g in got.generations] == [g.token_ids for g in want.generations]
        for g, w in zip(got.generations, want.generations):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="linear_kernel"):
        LocalChatModel(base, device="cpu", linear_kernel="mkl")


def test_a_drafted_walk_draws_the_same_paths_with_fewer_forwards(tiny_lora_models):
    """Each forward of a walk (and a prompt's prefill) also feeds a tree of every open choice's rest
    (``ChoiceMask.draft``): the same draws and log-probabilities as a walk that feeds only what it needs, in fewer
    forwards."""
    from halo_agent.policies.guided_choice import ChoiceMask
    from halo_agent.policies.prefix_cache import ChoiceWalk

    engine = LocalChatModel(tiny_lora_models[0], device="cpu")
    eos = engine.tokenizer.eos_token_id
    mask = ChoiceMask(engine.tokenizer, CHOICES, eos)
    tree = mask.draft(())
    for choice in CHOICES:  # each choice as the tokenizer splits it, up to its last place with a choice of token
        split = tuple(engine.tokenizer(choice, add_special_tokens=False)["input_ids"])
        needed = [k for k in range(1, len(split) + 1) if len(mask.allowed(split[:k])) > 1]
        assert all(split[:k] in tree for k in range(1, max(needed, default=0) + 1))
        assert all(split[:k] not in tree for k in range(max(needed, default=0) + 1, len(split) + 1))
    assert all(len(path) == 1 or path[:-1] in tree[:k] for k, path in enumerate(tree))  # parents first
    assert len(set(tree)) == len(tree) and len(mask.draft((), limit=5)) <= 5 and mask.draft(()) is tree
    assert all(len(mask.allowed(path)) > 1 or any(p[:len(path)] == path for p in tree if p != path) for path in tree)
    assert mask.draft(tree[0] + (eos,)) == []
    forwards = {}
    prompt = engine.chat_prompt(page("[12] button 'Submit'"))[0]
    with torch.inference_mode():
        plain = PromptCache().prefill(engine.model, prompt, None, "cpu")
        # the prompt's prefill fed the tree too: the cache kept is the prompt's, the tree's places come along
        kept = PromptCache()
        primed = kept.prefill(engine.model, prompt, None, "cpu", draft=tree)
        assert primed.ids == plain.ids and primed.ahead[0] == tuple(tree) and len(primed.ahead[1]) == len(tree)
        assert kept.prefill(engine.model, prompt, None, "cpu") is primed and kept.hits == 1  # a hit gets them too
        torch.testing.assert_close(primed.next_logprobs, plain.next_logprobs, atol=1e-5, rtol=0)
        for (k, v), (pk, pv) in zip(primed.layers, plain.layers):
            torch.testing.assert_close(k, pk, atol=1e-5, rtol=0)
        for name, root, draft in (("plain", plain, 0), ("drafted", plain, 48), ("primed", primed, 48)):
            walk = ChoiceWalk(engine.model, root, ChoiceMask(engine.tokenizer, CHOICES, eos), draft=draft)
            generator = torch.Generator().manual_seed(3)
            paths = [walk.draw(1.0, generator) for _ in range(8)]
            forwards[name] = (walk.forwards, paths, [walk.token_logprobs(p, 1.0)[0] for p in paths])
    for fast in ("drafted", "primed"):
        assert forwards[fast][1] == forwards["plain"][1]
        for got, want in zip(forwards[fast][2], forwards["plain"][2]):
            assert got == pytest.approx(want, abs=1e-5)
    assert forwards["primed"][0] < forwards["drafted"][0] < forwards["plain"][0]
