"""The openai policy over the real chat-completions protocol, against a tiny local model.

A tiny Qwen2 model (halo_train.tiny_model) is fine-tuned for a few steps to answer
``click('12')`` on the test page, and a LoRA adapter on it to answer ``click('13')``;
``halo_agent.chat_server`` serves both; ``OpenAIPolicy`` talks to it with the
official ``openai`` client. A flaky proxy in front of the server injects 429/500s
and bad-request answers, as hosted endpoints do.
"""

from __future__ import annotations

import dataclasses
import http.server
import io
import json
import math
import socket
import threading
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from halo_agent.chat_server import ChatCompletionServer  # noqa: E402
from halo_agent.local_http import reply  # noqa: E402
from halo_agent.policies.hf_policy import HFPolicy, LocalChatModel, chat_prompt_ids  # noqa: E402
from halo_agent.policies.openai_policy import OpenAIPolicy, PolicyConfigError  # noqa: E402
from halo_agent.types import Element, Observation  # noqa: E402
from halo_data.ids import image_hash  # noqa: E402

pytestmark = pytest.mark.slow

AXTREE = "RootWebArea 'Mail'\n\t[12] button 'Send'\n\t[13] button 'Discard'\n\t[14] textbox 'To'"
ELEMENTS = (Element("12", "button", "Send", "click"), Element("13", "button", "Discard", "click"), Element("14", "textbox", "To", "fill"))
GOAL = "Send the mail."
TEXT_MESSAGES = [{"role": "user", "content": f"Goal: {GOAL}\n{AXTREE}\nNext action:"}]
SECRET = "sk-halo-test-Qx81mZ0pLw77vB2cN5dT"


def _png(width: int = 64, height: int = 48) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()
PNG_HASH = image_hash(PNG)
IMAGE_MESSAGES = [
    {"role": "user", "content": [{"type": "image_ref", "hash": PNG_HASH}, {"type": "text", "text": TEXT_MESSAGES[0]["content"]}]}
]


def _observation(messages=None, screenshot: bytes | None = None, step_idx: int = 0) -> Observation:
    return Observation(
        goal=GOAL,
        url="http://127.0.0.1/mail",
        axtree=AXTREE,
        elements=ELEMENTS,
        screenshot=screenshot,
        screenshot_hash=image_hash(screenshot) if screenshot else None,
        messages=messages or TEXT_MESSAGES,
        history=(),
        step_idx=step_idx,
        task_id="test.mail",
        extra={"viewport": (64, 48)} if screenshot else {},
    )


def _teach(model, tokenizer, answer: str, steps: int = 60, lr: float = 5e-3, prompts=None) -> float:
    """A few steps of supervised fine-tuning so greedy decoding answers ``answer`` on the test prompts (or ``prompts``)."""
    sequences = []
    target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    for messages in prompts or (TEXT_MESSAGES, IMAGE_MESSAGES):
        prompt_ids, _ = chat_prompt_ids(tokenizer, messages)
        sequences.append((torch.tensor([prompt_ids + target]), torch.tensor([[-100] * len(prompt_ids) + target])))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        input_ids, labels = sequences[step % len(sequences)]
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return loss.item()


@pytest.fixture(scope="module")
def one_thread():
    # Two shared cores: intra-op threads only fight each other on a model this small.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, one_thread):
    """(base model folder, LoRA adapter folder): base answers click('12'), the adapter click('13')."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    base_dir = build_tiny_model(root / "base")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    assert _teach(model, tokenizer, "click('12')") < 0.1
    model.save_pretrained(base_dir)

    # LoRA on lm_head too: the tiny model's small tied embeddings cap how far attention/MLP deltas move logits.
    # ensure_weight_tying: the LoRA on lm_head also applies to the embeddings tied to it.
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "lm_head"], ensure_weight_tying=True)
    lora = get_peft_model(model, config)
    assert _teach(lora, tokenizer, "click('13')", steps=40, lr=1e-2) < 0.1
    adapter_dir = root / "adapter-discard"
    lora.save_pretrained(adapter_dir, save_embedding_layers=True)
    return base_dir, adapter_dir


@pytest.fixture(scope="module")
def server(tiny_models):
    base_dir, adapter_dir = tiny_models
    engine = LocalChatModel(base_dir, adapters={"discard": adapter_dir}, device="cpu")
    with ChatCompletionServer(engine, served_model_name="tiny") as s:
        yield s


@pytest.fixture(autouse=True)
def no_endpoint_env(monkeypatch):
    for var in ("HALO_VLLM_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


class FlakyProxy:
    """Answers the first calls with scripted failures (None: forward that call), then forwards to ``upstream``;
    records what it saw."""

    def __init__(self, upstream: str, failures: list[tuple[int, str, dict]] = ()):
        self.upstream = upstream.rstrip("/")
        self.failures = list(failures)
        self.calls = 0
        self.authorization: list[str] = []
        self.bodies: list[dict] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.calls += 1
                proxy.authorization.append(self.headers.get("Authorization", ""))
                proxy.bodies.append(json.loads(body))
                if proxy.failures and proxy.failures[0] is None:
                    proxy.failures.pop(0)
                elif proxy.failures:
                    status, message, headers = proxy.failures.pop(0)
                    payload = json.dumps({"error": {"message": message, "type": "error", "code": status}}).encode()
                    return reply(self, status, payload, "application/json", headers)
                path = self.path[len("/v1"):] if self.path.startswith("/v1") else self.path
                request = urllib.request.Request(proxy.upstream + path, data=body, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, data = answer.status, answer.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                reply(self, status, data, "application/json")

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lake_fields(output) -> str:
    return json.dumps(dataclasses.asdict(output), default=str)


# ----------------------------------------------------------------------------- the protocol


def test_text_mode_action_tokens_and_logprobs(server):
    policy = OpenAIPolicy(model="tiny", base_url=server.url, temperature=0.0, max_tokens=16)
    out = policy.act(_observation())
    assert out.api_error is None and out.parse_error is None
    assert out.action == "click('12')"
    assert out.model_output.strip() == "click('12')"
    assert out.action_source == "model"
    assert out.prompt_tokens > 10 and out.completion_tokens >= 3
    assert len(out.logprobs) == out.completion_tokens
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.logprob_sum == pytest.approx(sum(out.logprobs))
    assert out.latency_ms > 0
    request = server.received[-1]
    assert request["model"] == "tiny" and request["logprobs"] is True and request["images"] == 0
    policy.close()


def test_n_samples_temperature_and_seed(server):
    policy = OpenAIPolicy(model="tiny", base_url=server.url, temperature=1.8, n=4, max_tokens=8)
    policy.reset(seed=11)
    first = policy.act(_observation())
    samples = [s.model_output for s in policy.last_samples]
    assert len(samples) == 4 and first.model_output == samples[0]
    assert len(set(samples)) > 1, "temperature 1.8 should give different samples"
    assert server.received[-1]["n"] == 4 and server.received[-1]["temperature"] == 1.8
    assert all(s.action is not None or s.parse_error for s in policy.last_samples)
    # The same episode seed and step replay the same samples; another step draws new ones.
    policy.reset(seed=11)
    policy.act(_observation())
    assert [s.model_output for s in policy.last_samples] == samples
    policy.act(_observation(step_idx=1))
    assert [s.model_output for s in policy.last_samples] != samples


def test_screenshot_mode_sends_png_and_parses(server):
    policy = OpenAIPolicy(model="tiny", base_url=server.url, use_screenshot=True, max_tokens=16)
    obs = _observation(messages=IMAGE_MESSAGES, screenshot=PNG)
    sent = policy.request_messages(obs)
    part = sent[0]["content"][0]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    out = policy.act(obs)
    request = server.received[-1]
    assert request["images"] == 1 and request["image_bytes"] == len(PNG)
    assert out.action == "click('12')"
    # The stored prompt keeps the reference, never the base64.
    assert obs.messages[0]["content"][0] == {"type": "image_ref", "hash": PNG_HASH}


def test_text_mode_drops_images(server):
    policy = OpenAIPolicy(model="tiny", base_url=server.url, use_screenshot=False, max_tokens=16)
    policy.act(_observation(messages=IMAGE_MESSAGES, screenshot=PNG))
    assert server.received[-1]["images"] == 0


def test_unparseable_output_is_a_parse_error_not_an_api_error(server):
    policy = OpenAIPolicy(model="tiny", base_url=server.url, max_tokens=1)
    out = policy.act(_observation())
    assert out.api_error is None
    assert out.action is None and out.parse_error
    assert out.model_output and out.completion_tokens == 1


def test_lora_adapter_selected_by_name(server):
    models = json.loads(urllib.request.urlopen(server.url + "/models", timeout=10).read())
    assert [m["id"] for m in models["data"]] == ["tiny", "discard"]
    policy = OpenAIPolicy(model="tiny", adapter="discard", base_url=server.url, max_tokens=16)
    out = policy.act(_observation())
    assert server.received[-1]["model"] == "discard"
    assert out.action == "click('13')"
    assert policy.config()["adapter"] == "discard" and policy.policy_version == "openai:discard"


# ----------------------------------------------------------------------------- failures


def test_retries_429_and_500_then_succeeds(server):
    failures = [(429, "Rate limit reached", {"retry-after": "0"}), (500, "upstream crashed", {})]
    with FlakyProxy(server.url, failures) as proxy:
        policy = OpenAIPolicy(model="tiny", base_url=proxy.url, max_retries=3, backoff_s=0.01, max_tokens=16)
        out = policy.act(_observation())
    assert proxy.calls == 3 and policy.last_retries == 2
    assert out.api_error is None and out.action == "click('12')"


def test_retries_count_every_request_of_a_covered_step(server):
    """A covered step sends one draw, then a forced request per other choice (in parallel): the retries of the
    forced ones count too, and the next act() starts from 0."""
    failures = [None, (429, "Rate limit reached", {"retry-after": "0"}), (500, "upstream crashed", {})]
    with FlakyProxy(server.url, failures) as proxy:
        policy = OpenAIPolicy(model="tiny", base_url=proxy.url, max_retries=3, backoff_s=0.01, n=4,
                              constrain_actions=True, cover_choices=True)
        out = policy.act(_observation())
        assert out.api_error is None and len(policy.last_samples) == len(ELEMENTS)
        assert proxy.calls == len(ELEMENTS) + 2 and policy.last_retries == 2
        policy.act(_observation())
    assert policy.last_retries == 0


def test_exhausted_retries_and_client_errors_are_api_errors(server):
    with FlakyProxy(server.url, [(503, "overloaded", {})] * 3) as proxy:
        policy = OpenAIPolicy(model="tiny", base_url=proxy.url, max_retries=2, backoff_s=0.01)
        out = policy.act(_observation())
    assert proxy.calls == 3
    assert out.action is None and out.parse_error is None
    assert "HTTP 503" in out.api_error and "after 2 retries" in out.api_error
    # An unknown model is not retried.
    policy = OpenAIPolicy(model="no-such-model", base_url=server.url, max_retries=3, backoff_s=0.01)
    out = policy.act(_observation())
    assert "HTTP 404" in out.api_error and "no-such-model" in out.api_error and policy.last_retries == 0


def test_dead_endpoint_is_an_api_error():
    policy = OpenAIPolicy(model="tiny", base_url=f"http://127.0.0.1:{_free_port()}/v1", max_retries=1, backoff_s=0.01, timeout_s=5)
    out = policy.act(_observation())
    assert out.action is None and out.parse_error is None and out.model_output is None
    assert out.api_error.startswith("cannot connect to http://127.0.0.1:") and "after 1 retries" in out.api_error


def test_unsupported_parameter_is_dropped(server):
    failures = [(400, "logprobs is not supported with this model", {})]
    with FlakyProxy(server.url, failures) as proxy:
        policy = OpenAIPolicy(model="tiny", base_url=proxy.url, max_tokens=16)
        out = policy.act(_observation())
        assert "logprobs" in proxy.bodies[0] and "logprobs" not in proxy.bodies[1]
        policy.act(_observation())
        assert "logprobs" not in proxy.bodies[2]
    assert out.action == "click('12')" and out.logprobs is None and out.api_error is None


def test_api_key_from_env_never_reaches_the_lake(server, monkeypatch):
    masked = SECRET[:6] + "*" * 20 + SECRET[-4:]
    failures = [(401, f"Incorrect API key provided: {masked}. Your key {SECRET} is invalid.", {})]
    with FlakyProxy(server.url, failures) as proxy:
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        monkeypatch.setenv("HALO_VLLM_URL", proxy.url)
        policy = OpenAIPolicy(model="tiny", max_tokens=16)
        failed = policy.act(_observation())
        ok = policy.act(_observation())
        assert proxy.authorization == [f"Bearer {SECRET}"] * 2  # the key was used ...
    assert "HTTP 401" in failed.api_error and ok.action == "click('12')"
    for record in (_lake_fields(failed), _lake_fields(ok), json.dumps(policy.config()), *map(_lake_fields, policy.last_samples)):
        assert SECRET not in record and masked not in record and SECRET[-10:] not in record  # ... and never recorded
    assert policy.config()["base_url"] == proxy.url


def test_server_requiring_a_key(tiny_models, monkeypatch):
    base_dir, _ = tiny_models
    engine = LocalChatModel(base_dir, device="cpu")
    with ChatCompletionServer(engine, served_model_name="tiny", api_key=SECRET) as keyed:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-000000")
        out = OpenAIPolicy(model="tiny", base_url=keyed.url, max_retries=0).act(_observation())
        assert "HTTP 401" in out.api_error and "sk-wrong-key" not in out.api_error
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        assert OpenAIPolicy(model="tiny", base_url=keyed.url, max_tokens=16).act(_observation()).action == "click('12')"


def test_openai_default_endpoint_needs_a_key():
    with pytest.raises(PolicyConfigError, match="OPENAI_API_KEY"):
        OpenAIPolicy(model="gpt-4o")


def test_chat_server_rejects_bad_requests(server):
    def post(body):
        request = urllib.request.Request(server.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]
        raise AssertionError("the server accepted a bad request")

    assert post({"model": "gpt-9", "messages": TEXT_MESSAGES})[0] == 404
    status, error = post({"model": "tiny", "messages": TEXT_MESSAGES, "n": 0})
    assert status == 400 and error["param"] == "n"
    assert post({"model": "tiny", "messages": TEXT_MESSAGES, "stream": True})[0] == 400
    remote = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]
    status, error = post({"model": "tiny", "messages": remote})
    assert status == 400 and "base64" in error["message"]
    assert post({"model": "tiny", "messages": []})[0] == 400


# ----------------------------------------------------------------------------- hf policy


def test_hf_policy_with_adapter_and_seeded_sampling(tiny_models):
    base_dir, adapter_dir = tiny_models
    policy = HFPolicy(model=str(base_dir), adapter=str(adapter_dir), temperature=0.0, max_new_tokens=16, device="cpu")
    out = policy.act(_observation())
    assert out.action == "click('13')" and out.parse_error is None
    assert len(out.logprobs) == out.completion_tokens and out.logprob_sum == pytest.approx(sum(out.logprobs))
    assert policy.policy_version == f"hf:base+{adapter_dir.name}"

    sampler = HFPolicy(model=str(base_dir), temperature=1.8, n=3, max_new_tokens=8, device="cpu")
    sampler.reset(seed=5)
    sampler.act(_observation())
    first = [s.model_output for s in sampler.last_samples]
    sampler.reset(seed=5)
    sampler.act(_observation())
    assert [s.model_output for s in sampler.last_samples] == first and len(first) == 3
    assert len(set(first)) > 1


# ----------------------------------------------------------------------------- decoding constrained to the page's actions

CHOICES = ["click('12')", "click('13')", "click('14')"]


def _post(server, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]


def test_guided_choice_answers_only_allowed_choices_with_the_draws_or_the_trainers_logprobs(server):
    from halo_data import prompts
    from halo_train.grpo import stored_completion_logprob

    body = {"model": "tiny", "messages": TEXT_MESSAGES, "n": 12, "temperature": 2.0, "logprobs": True, "seed": 1,
            "return_token_ids": True, "structured_outputs": {"choice": CHOICES}}
    status, answer = _post(server, body)
    assert status == 200
    texts = [c["message"]["content"] for c in answer["choices"]]
    assert set(texts) <= set(CHOICES)
    engine = server.engine

    def trainers(choice: dict, mode: str) -> float:
        """What the trainer scores the answer's tokens at, under the distribution the row names (vLLM's mask)."""
        row = {"prompt": prompts.dumps(TEXT_MESSAGES), "model_output": choice["message"]["content"], "temperature": 2.0,
               "completion_token_ids": choice["token_ids"], "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
               "logprobs_mode": mode, "draw": "masked_choice", "choices": CHOICES}
        with torch.inference_mode(), engine.model.disable_adapter():  # "tiny" is the base model
            return stored_completion_logprob(engine.model, engine.tokenizer, row)

    for choice in answer["choices"]:
        content = choice["logprobs"]["content"]
        assert content[-1]["token"] == "<|im_end|>"  # the EOS is one of the choice's tokens, as the trainer scores it
        # Processed (the default): a path's logprobs sum to the log-probability the masked draw gave it.
        assert sum(t["logprob"] for t in content) == pytest.approx(trainers(choice, "processed_logprobs"), abs=1e-4)
        assert choice["finish_reason"] == "stop"
        assert (choice["halo_logprobs_mode"], choice["halo_draw"]) == ("processed_logprobs", "masked_choice")
    # Raw: as vLLM computes them, from the masked logits at temperature 1; what the trainer rebuilds for them.
    engine.logprobs_mode = "raw_logprobs"
    try:
        for choice in _post(server, body)[1]["choices"]:
            content = choice["logprobs"]["content"]
            assert sum(t["logprob"] for t in content) == pytest.approx(trainers(choice, "raw_logprobs"), abs=1e-4)
            assert choice["halo_logprobs_mode"] == "raw_logprobs"
    finally:
        engine.logprobs_mode = "processed_logprobs"

    # Temperature 0 is the most likely choice: the base answers click('12'), the adapter click('13'); the older field works too.
    greedy = {"messages": TEXT_MESSAGES, "temperature": 0, "guided_choice": list(reversed(CHOICES))}
    assert _post(server, {"model": "tiny", **greedy})[1]["choices"][0]["message"]["content"] == "click('12')"
    assert _post(server, {"model": "discard", **greedy})[1]["choices"][0]["message"]["content"] == "click('13')"
    # Without the answer the model prefers, it still answers only what is allowed.
    others = _post(server, {**body, "structured_outputs": {"choice": CHOICES[1:]}})[1]["choices"]
    assert {c["message"]["content"] for c in others} <= set(CHOICES[1:])


def test_masked_choice_draw_weighs_only_the_tokens_where_choices_part():
    import math

    from halo_agent.policies.hf_policy import greedy_masked_choice, masked_choice_logprobs

    eos = 0
    # "# textbox / click(..)" against two labelled buttons, in miniature: the first token parts 1 from 2; after 1
    # the choices part again (5 or 6); after 2 every token is forced, however unlikely the raw model finds it.
    completions = [[1, 5, eos], [1, 6, eos], [2, 7, 8, eos]]
    raw = [[math.log(0.3), math.log(0.1), math.log(0.9)],
           [math.log(0.3), math.log(0.3), math.log(0.9)],
           [math.log(0.6), math.log(1e-4), math.log(1e-3), math.log(0.5)]]
    probs = [math.exp(x) for x in masked_choice_logprobs(completions, raw)]
    assert probs == pytest.approx([1 / 3 * 1 / 4, 1 / 3 * 3 / 4, 2 / 3])
    assert sum(probs) == pytest.approx(1.0)
    # By whole-sequence probability the third choice would be the least likely by far (6e-8 against 0.027).
    assert max(range(3), key=lambda i: sum(raw[i])) == 1
    assert greedy_masked_choice(completions, raw) == 2
    # A forced token weighs nothing: make it more or less likely and the draw stays.
    raw[2][1] = math.log(0.9)
    assert [math.exp(x) for x in masked_choice_logprobs(completions, raw)] == pytest.approx(probs)
    # The temperature applies where the choices part: very hot, each branch is a coin.
    assert [math.exp(x) for x in masked_choice_logprobs(completions, raw, temperature=1e6)] == pytest.approx(
        [0.25, 0.25, 0.5], abs=1e-4)


def mask_choice_probabilities(engine, messages, choices) -> list[float]:
    """Each choice's probability under vLLM's string-prefix mask at temperature 1, exactly: the mask's tree of
    token paths explored until each path's text can only end as one choice."""
    from halo_agent.policies.guided_choice import ChoiceMask
    from halo_agent.policies.prefix_cache import ChoiceWalk, PromptCache

    mask = ChoiceMask(engine.tokenizer, choices, engine.tokenizer.eos_token_id)
    probs = [0.0] * len(choices)
    with torch.inference_mode(), engine.model.disable_adapter():
        walk = ChoiceWalk(engine.model, PromptCache(1).prefill(engine.model, engine.chat_prompt(messages)[0], None, "cpu"), mask)
        paths = [((), 0.0)]
        while paths:
            prefix, logprob = paths.pop()
            open_choices = [i for i, c in enumerate(choices) if c.encode().startswith(mask.text(prefix))]
            if mask.finished(prefix) or len(open_choices) == 1:
                probs[mask.choice_index(prefix) if mask.finished(prefix) else open_choices[0]] += math.exp(logprob)
                continue
            allowed = mask.allowed(prefix)
            for token, value in zip(allowed, walk.logprobs(prefix)[allowed].log_softmax(-1).tolist()):
                paths.append((prefix + (token,), logprob + value))
    return probs


def test_the_server_draws_a_guided_choice_as_vllm_masks_it_not_by_sequence_probability(server, tiny_models):
    # The base model answers click('12'): its digit 2 is likely, the words after it that only one choice carries
    # are not. Masked step by step (vLLM), those forced words weigh nothing; by sequence they sink the choice.
    choices = ["click('12') # then a long comment the model never saw", "click('14')"]
    drawn = []
    for seed in range(10):  # 160 draws, 16 (the server's most) a request
        body = {"model": "tiny", "messages": TEXT_MESSAGES, "n": 16, "temperature": 1.0, "seed": seed,
                "structured_outputs": {"choice": choices}}
        drawn += [c["message"]["content"] for c in _post(server, body)[1]["choices"]]
    engine = server.engine
    prompt_ids, _ = engine.chat_prompt(TEXT_MESSAGES)
    completions = [engine.tokenizer(c, add_special_tokens=False)["input_ids"] + [engine.tokenizer.eos_token_id] for c in choices]
    with torch.inference_mode(), engine.model.disable_adapter():
        raw = engine._score(prompt_ids, completions)
    masked = mask_choice_probabilities(engine, TEXT_MESSAGES, choices)
    assert sum(masked) == pytest.approx(1.0)
    by_sequence = torch.softmax(torch.tensor([sum(r) for r in raw]), 0).tolist()
    assert masked[0] > 0.8 and by_sequence[0] < 0.01  # the two draws disagree here
    assert drawn.count(choices[0]) / len(drawn) == pytest.approx(masked[0], abs=0.08)
    greedy = {"model": "tiny", "messages": TEXT_MESSAGES, "temperature": 0, "structured_outputs": {"choice": choices}}
    assert _post(server, greedy)[1]["choices"][0]["message"]["content"] == choices[0]
    # The draw this server made before (--choice-draw sequence) takes the whole sequence's probability.
    base_dir, _ = tiny_models
    sequence_engine = LocalChatModel(base_dir, device="cpu", choice_draw="sequence")
    batch = sequence_engine.choose(TEXT_MESSAGES, choices, n=50, temperature=1.0, seed=3)
    assert [g.text for g in batch.generations].count(choices[1]) >= 48
    assert sequence_engine.choose(TEXT_MESSAGES, choices, temperature=0).generations[0].text == choices[1]


@pytest.mark.parametrize("extra, message", [
    ({"structured_outputs": {"choice": []}}, "structured_outputs choice must be a list of 1 to 512 non-empty strings"),
    ({"structured_outputs": {"choice": ["click('12')", 3]}}, "structured_outputs choice must be a list"),
    ({"structured_outputs": {"regex": "click.*"}}, "this server supports structured_outputs with a choice list only"),
    ({"guided_choice": "click('12')"}, "guided_choice choice must be a list"),
])
def test_a_bad_choice_list_is_one_clear_error(server, extra, message):
    status, error = _post(server, {"model": "tiny", "messages": TEXT_MESSAGES, **extra})
    assert status == 400 and error["message"].startswith(message)
    assert error["param"] == next(iter(extra))


def test_the_policy_sends_the_pages_actions_as_the_choice(server):
    from halo_agent.actions import page_actions

    policy = OpenAIPolicy(model="tiny", base_url=server.url, temperature=1.0, n=4, seed=3, constrain_actions=True)
    out = policy.act(_observation())
    assert server.received[-1]["choices"] == page_actions(ELEMENTS) == CHOICES
    assert all(s.action in CHOICES and s.parse_error is None for s in policy.last_samples)
    tokens = server.engine.tokenizer(out.action, add_special_tokens=False)["input_ids"]
    assert len(out.logprobs) == len(tokens) + 1 and out.logprob_sum == pytest.approx(sum(out.logprobs))
    assert policy.config()["constrain_actions"] is True
    with pytest.raises(PolicyConfigError, match="constrain_actions must be true or false"):
        OpenAIPolicy(model="tiny", base_url=server.url, constrain_actions="yes")
