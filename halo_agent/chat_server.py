"""A small OpenAI-compatible chat-completions server for a local transformers model.

    python -m halo_agent.chat_server --model path/to/model [--lora-modules dpo=path/to/adapter] [--port 8000]

It speaks the subset of the protocol HALO's ``openai`` policy uses, the way
vLLM does: ``POST /v1/chat/completions`` (``messages`` with text and image
content parts, ``n``, ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``seed``, ``stop``, ``logprobs``, ``top_logprobs``, and vLLM's guided
choice: ``structured_outputs: {"choice": [...]}`` or the older ``guided_choice: [...]``),
``GET /v1/models`` (the base model and its LoRA adapters, which requests select
by name, as with vLLM's ``--lora-modules``), ``GET /metrics`` (Prometheus text: requests, engine seconds,
prompt tokens, those the prefix cache spared a prefill, and the engine's batches), and OpenAI-style error bodies. It
binds to 127.0.0.1 only.

Adapters can be loaded and unloaded while serving with vLLM's runtime LoRA API
(what vLLM serves with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), with the same
request bodies, answers and errors: ``POST /v1/load_lora_adapter``
``{"lora_name": ..., "lora_path": ...}`` answers ``200`` with the plain text
``Success: LoRA adapter 'NAME' added successfully.``; a name already loaded is a
400 ``InvalidUserInput``, a path without an adapter a 404 ``NotFoundError``.
``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}`` answers ``Success: LoRA
adapter 'NAME' removed successfully.``, or 404 for a name not loaded. So one
client (``halo_agent.serving.EngineClient``) drives either engine. Image parts are checked (base64 data URLs); a
vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, e.g. ``halo-train make-tiny-model --vision``) sees them
through its processor, as vLLM serves it; a text model's prompt is ``halo_data.prompts.text_messages`` (image parts
dropped), the rendering the trainers score.

A guided-choice request is answered with one of the choices, drawn as vLLM's structured output
draws it: each decoding step masked to every token whose bytes keep the text a prefix of some choice (any
tokenisation of it, not only the choice's own) and EOS once the text is a whole choice, sampled from the
renormalised distribution at the temperature (``--choice-draw sequence`` draws by whole-sequence probability
of each choice's own tokens instead). Other sampling fields of vLLM's (``top_k``, ``min_p``,
``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``, ``min_tokens``) are accepted at their
neutral values only. The prompt is prefilled once
per request, from where it parts from a recent prompt's KV cache (``--prompt-cache-size`` prompts are kept,
as vLLM's automatic prefix caching), and the masked draw walks token by token from that cache, running the
model only where more than one token is allowed; ``--score-mode full`` prefills the whole prompt afresh for
each request instead (same draw, slower; ``--choice-draw sequence``: every choice scored after the whole prompt).

Guided choices are batched continuously, as vLLM's scheduler batches requests (:class:`EngineLoop`): one engine
thread owns the model; the HTTP threads queue their requests and wait. The engine keeps up to ``--max-batch`` (8)
guided choices in progress. Those that arrive (when it is idle, after waiting up to ``--batch-window-ms``, 10, for
more) have their prompts prefilled in one forward per adapter, each continuing from its own cached prefix (the
caches left-padded and masked, the fed tokens right-padded), each prompt's cache stored as its prefill alone
would store it. Then every turn advances each request's choice walk by one forward, the walks of one adapter in
one padded forward, and a request that arrives meanwhile joins at the next. Plain sampling (its seed drives
torch's global generator) and ``prompt_logprobs`` run alone, in order of arrival. Each prefill and walk forward
also feeds a tree of every open choice's rest, so a draw that follows it needs no forward of its own; on a CPU
the linear layers run on oneDNN (``--linear-kernel``). Every answer equals the one the request gets alone: the
same draw for the same seed, logprobs within float rounding.
``--max-batch 1`` runs each request alone, in order of arrival.

Token-exact answers, in vLLM's shapes:

- ``logprobs: true`` (with ``top_logprobs: K``) gives ``choices[i].logprobs.content``: one entry per token of
  the completion (``token``, ``logprob``, ``bytes``, ``top_logprobs``), EOS included where generation stopped
  on it. A guided choice's tokens are those drawn (one tokenisation of the choice), then EOS; its
  ``top_logprobs`` list the tokens the mask allowed at each position. Logprobs below -9999 (top-p's cut tokens) are given as -9999.0, as vLLM does.
- ``return_tokens_as_token_ids: true`` (vLLM's request field) writes each ``token`` as ``"token_id:N"``;
  ``bytes`` stay those of the decoded token.
- ``return_token_ids: true`` (vLLM) adds ``choices[i].token_ids`` (the same tokens) and ``prompt_token_ids``.
- ``prompt_logprobs: K`` (vLLM, 0 to 20) adds the top-level ``prompt_logprobs``: ``null`` for the first prompt
  token, then for each prompt token ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` for the token
  itself and the K most likely there, under the model's raw distribution (rank 1 = most likely).
- Each logprob is that of the distribution the token was drawn from (``--logprobs-mode processed_logprobs``,
  the default, as vLLM's flag): plain sampling, the softmax at the temperature with top-p applied; a guided
  choice under the mask, the token's share of the allowed tokens at the temperature where several are allowed,
  0.0 where a token is forced (a path's logprobs sum to the log-probability it was drawn with);
  ``--choice-draw sequence``, the whole-sequence draw token by token (the weight of the choices through the
  token over that of those through its prefix). At temperature 0 (greedy) the same distributions at
  temperature 1. ``--logprobs-mode raw_logprobs`` reports the model's raw log-softmax instead (before
  temperature and top-p), except under a guided choice's mask, which vLLM applies to the logits before its
  sampler: there the masked distribution at temperature 1.
- Each choice carries ``halo_logprobs_mode`` (``processed_logprobs`` or ``raw_logprobs``) and ``halo_draw``:
  ``masked_choice`` (a guided choice, masked token by token), ``sequence_choice`` (``--choice-draw sequence``),
  ``sample`` (plain sampling) or ``greedy`` (temperature 0, guided or not).

It is meant for tests and small local models; use vLLM for anything large.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import http.server
import json
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any, Mapping, Sequence

from halo_agent.engine_loop import EngineLoop
from halo_agent.local_http import LocalHTTPServer, reply, serve_until_interrupted
from halo_agent.policies.hf_policy import (CHOICE_DRAWS, LOGPROBS_MODES, SCORE_MODES, AdapterNotFoundError, ChoiceRequest,
                                          LocalChatModel, ModelLoadError)
from halo_agent.policies.linear_kernels import LINEAR_KERNELS
from halo_data.cli_support import passive_openmp

log = logging.getLogger(__name__)

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_CHOICES = 512
MIN_LOGPROB = -9999.0  # vLLM's floor for a logprob in an answer (JSON has no -inf)


class RequestError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI error type to answer."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def _check_image_part(part: Mapping[str, Any]) -> int:
    """Validate an image content part; returns its decoded size in bytes (remote URLs: 0)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if not isinstance(url, str) or not url:
        raise RequestError("image_url part without a url", param="messages")
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        if ";base64" not in header or not header[5:].startswith("image/"):
            raise RequestError("image data URLs must be data:image/<format>;base64,...", param="messages")
        try:
            return len(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            raise RequestError("image data URL is not valid base64", param="messages") from None
    if url.startswith(("http://", "https://")):
        raise RequestError("this server does not fetch remote images: send base64 data URLs", param="messages")
    raise RequestError(f"unsupported image url scheme in {url[:30]!r}", param="messages")


def _check_messages(messages: Any) -> dict[str, int]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    n_images, image_bytes = 0, 0
    for m in messages:
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise RequestError("each message needs a role: system, user, assistant, developer or tool", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind == "text":
                    if not isinstance(part.get("text"), str):
                        raise RequestError("text part without text", param="messages")
                elif kind == "image_url":
                    image_bytes += _check_image_part(part)
                    n_images += 1
                else:
                    raise RequestError(f"unsupported content part type {kind!r}", param="messages")
        elif content is not None and not isinstance(content, str):
            raise RequestError("message content must be a string or a list of parts", param="messages")
    return {"images": n_images, "image_bytes": image_bytes}


def _lora_fields(body: Any) -> tuple[str | None, str | None]:
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    name, path = body.get("lora_name"), body.get("lora_path")
    for key, value in (("lora_name", name), ("lora_path", path)):
        if value is not None and not isinstance(value, str):
            raise RequestError(f"{key} must be a string", kind="InvalidUserInput", param=key)
    return name, path


def _choices(body: Mapping[str, Any]) -> list[str] | None:
    """The allowed answers of a guided-choice request: vLLM's ``structured_outputs.choice`` or older ``guided_choice``."""
    structured, legacy = body.get("structured_outputs"), body.get("guided_choice")
    if structured is None and legacy is None:
        return None
    param = "structured_outputs" if structured is not None else "guided_choice"
    if structured is not None:
        if not isinstance(structured, Mapping) or set(structured) - {"choice"}:
            raise RequestError("this server supports structured_outputs with a choice list only, e.g. "
                               '{"choice": ["click(\'12\')", "click(\'14\')"]}', param=param)
        choices = structured.get("choice")
    else:
        choices = legacy
    if (not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES
            or not all(isinstance(c, str) and c for c in choices)):
        raise RequestError(f"{param} choice must be a list of 1 to {MAX_CHOICES} non-empty strings", param=param)
    return list(dict.fromkeys(choices))  # as in vLLM's grammar, a repeated choice is one choice


# vLLM's sampling fields this server does not apply, each with the values that leave the distribution as it is
# (vLLM's top_k: 0 or -1 for every token). A request may send them, as HALO's openai policy does to pin vLLM's
# defaults; any other value is refused, never silently ignored: the logprobs answered would not be those of
# the distribution the request asked for.
NEUTRAL_FIELDS = {"top_k": (0, -1), "min_p": (0,), "repetition_penalty": (1,), "frequency_penalty": (0,),
                  "presence_penalty": (0,), "min_tokens": (0,)}


def _check_neutral(body: Mapping[str, Any]) -> None:
    for key, neutral in NEUTRAL_FIELDS.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in neutral:
            raise RequestError(f"{key} must be {' or '.join(map(str, neutral))} here: this server samples from the "
                               f"model's distribution at the temperature (and top_p) alone", param=key)


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{key} must be a number in [{low}, {high}]", param=key)
    return value


class ChatCompletionServer(LocalHTTPServer):
    """The server around one ``LocalChatModel``; ``start()`` serves from a thread, ``url`` is its base URL.

    ``api_key``: if set, requests must carry ``Authorization: Bearer <api_key>``.
    ``received`` keeps a summary of recent requests and the usage answered (for tests and debugging; no image data).
    ``batch_window_ms``, ``max_batch``: how the engine thread gathers requests that arrive together
    (:class:`EngineLoop`; ``max_batch=1`` runs each alone).
    """

    def __init__(
        self,
        engine: LocalChatModel,
        served_model_name: str | Sequence[str] | None = None,
        port: int = 0,
        api_key: str | None = None,
        max_tokens_limit: int = 1024,
        batch_window_ms: float = 10.0,
        max_batch: int = 8,
    ) -> None:
        self.engine = engine
        # As vLLM's --served-model-name: several names answer for the base model; the first is the one listed.
        names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or ())
        self.served_model_names = tuple(names) or (os.path.basename(os.path.normpath(engine.model_path)),)
        self.served_model_name = self.served_model_names[0]
        self.api_key = api_key
        self.max_tokens_limit = max_tokens_limit
        self.received: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)
        self.counters = collections.Counter()  # what GET /metrics reports
        self._counters_lock = threading.Lock()
        self.thread_name = "chat-server"
        super().__init__(self._handler(), port=port)
        self.loop = EngineLoop(engine, batch_window_ms=batch_window_ms, max_batch=max_batch)

    def stop(self) -> None:
        super().stop()
        self.loop.stop()

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    # ------------------------------------------------------------------ protocol

    def models(self) -> dict[str, Any]:
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": "halo", "root": self.engine.model_path, "parent": None}
                for name in self.served_model_names]
        for name in self.engine.adapter_names:
            # As vLLM: an adapter's root is the folder it was loaded from.
            data.append({"id": name, "object": "model", "created": created, "owned_by": "halo",
                         "root": self.engine.adapter_paths[name], "parent": self.served_model_name})
        return {"object": "list", "data": data}

    def load_lora_adapter(self, body: Any) -> str:
        name, path = _lora_fields(body)
        if not name or not path:
            raise RequestError("Both 'lora_name' and 'lora_path' must be provided.", kind="InvalidUserInput")
        if name in self.served_model_names:
            raise RequestError(f"The lora adapter '{name}' has already been loaded.", kind="InvalidUserInput")
        try:
            self.engine.load_adapter(name, path)
        except AdapterNotFoundError as e:
            raise RequestError(str(e), status=404, kind="NotFoundError") from None
        except ModelLoadError as e:
            raise RequestError(str(e), kind="BadRequestError") from None
        except ValueError as e:  # already loaded
            raise RequestError(str(e), kind="InvalidUserInput") from None
        log.info("loaded LoRA adapter %s from %s", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_lora_adapter(self, body: Any) -> str:
        name, _ = _lora_fields(body)
        if not name:
            raise RequestError("either 'lora_name' and 'lora_int_id' needs to be provided.", kind="InvalidUserInput")
        try:
            self.engine.unload_adapter(name)
        except KeyError:
            raise RequestError(f"The lora adapter '{name}' cannot be found.", status=404, kind="NotFoundError") from None
        log.info("unloaded LoRA adapter %s", name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def chat_completion(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, Mapping):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if model in self.served_model_names:
            adapter = None
        elif model in self.engine.adapter_names:
            adapter = model
        else:
            raise RequestError(f"The model `{model}` does not exist.", status=404, kind="NotFoundError", param="model")
        if body.get("stream"):
            raise RequestError("streaming is not supported by this server", param="stream")
        images = _check_messages(body.get("messages"))
        n = int(_number(body, "n", 1, 1, MAX_N))
        temperature = float(_number(body, "temperature", 1.0, 0.0, 2.0))
        top_p = float(_number(body, "top_p", 1.0, 0.0, 1.0))
        _check_neutral(body)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = int(_number({"max_tokens": max_tokens}, "max_tokens", 256, 1, self.max_tokens_limit))
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError("seed must be an integer", param="seed")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        want_logprobs = bool(body.get("logprobs"))
        top_logprobs = int(_number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)) if want_logprobs else 0
        as_token_ids = bool(body.get("return_tokens_as_token_ids"))
        return_token_ids = bool(body.get("return_token_ids"))
        prompt_top = body.get("prompt_logprobs")
        if prompt_top is not None:
            prompt_top = int(_number(body, "prompt_logprobs", 0, 0, MAX_TOP_LOGPROBS))
        if prompt_top is not None and getattr(self.engine, "processor", None) is not None:
            raise RequestError("prompt_logprobs of a vision-language model are not supported by this server", param="prompt_logprobs")
        choices = _choices(body)
        received = {"model": model, "n": n, "temperature": temperature, "max_tokens": max_tokens, "seed": seed,
                    "logprobs": want_logprobs, "messages": len(body["messages"]), "choices": choices, **images}
        self.received.append(received)
        if choices is not None and images["images"] and getattr(self.engine, "processor", None) is not None:
            # choose() scores the text prompt alone: a vision model's choice would be drawn without its image,
            # and its logprobs would not be the trainer's, so the request is refused rather than answered wrongly.
            raise RequestError("a guided choice with image inputs is not supported by this server: send the request "
                               "without structured_outputs, or serve the model with vLLM", param="structured_outputs")
        started = time.perf_counter()
        if choices is not None:
            batch = self.loop.choose(ChoiceRequest(body["messages"], choices, n=n, temperature=temperature, seed=seed,
                                                   adapter=adapter, top_logprobs=top_logprobs))
        else:
            batch = self.loop.call(lambda: self.engine.generate(
                body["messages"], n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                seed=seed, adapter=adapter, top_logprobs=top_logprobs, stop=stop,
            ))
        seconds = time.perf_counter() - started
        received["engine_seconds"] = round(seconds, 4)
        with self._counters_lock:
            self.counters.update({"requests": 1, "guided_choice_requests": int(choices is not None),
                                  "prompt_tokens": batch.prompt_tokens})
        answer_choices = []
        for i, g in enumerate(batch.generations):
            choice = {"index": i, "message": {"role": "assistant", "content": g.text, "refusal": None},
                      "logprobs": self._logprobs(g, as_token_ids) if want_logprobs else None,
                      "finish_reason": g.finish_reason, "stop_reason": None,
                      "halo_logprobs_mode": g.logprobs_mode, "halo_draw": g.draw}
            if return_token_ids:
                choice["token_ids"] = list(g.token_ids)
            answer_choices.append(choice)
        completion_tokens = sum(len(g.token_ids) for g in batch.generations)
        received["usage"] = {"prompt_tokens": batch.prompt_tokens, "completion_tokens": completion_tokens}
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": answer_choices,
            "usage": {
                "prompt_tokens": batch.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": batch.prompt_tokens + completion_tokens,
            },
        }
        if prompt_top is not None:
            answer["prompt_logprobs"] = self._prompt_logprobs(batch.prompt_token_ids, prompt_top, adapter)
        if return_token_ids:
            answer["prompt_token_ids"] = batch.prompt_token_ids
        return answer

    def metrics(self) -> str:
        """Prometheus text, as vLLM's ``/metrics`` (under HALO's names): requests answered, the seconds the engine
        thread was busy, prompt tokens asked for, how many of those the prefix cache spared a prefill, and the
        engine's batching: its turns, the requests that shared a forward with others, the most requests one forward
        served, the forwards that advanced choice walks and the walks they advanced, the forwards that prefilled
        several prompts and those prompts."""
        cache, stats = self.engine.prompt_cache, self.loop.stats
        values = {
            "halo_chat_requests_total": self.counters["requests"],
            "halo_chat_guided_choice_requests_total": self.counters["guided_choice_requests"],
            "halo_chat_engine_seconds_total": round(self.loop.busy_seconds, 6),
            "halo_chat_prompt_tokens_total": self.counters["prompt_tokens"],
            "halo_chat_prefill_tokens_total": cache.tokens_prefilled,
            "halo_chat_prefix_cache_hit_tokens_total": cache.tokens_reused,
            "halo_chat_engine_batches_total": stats["batches"],
            "halo_chat_batched_requests_total": stats["batched_requests"],
            "halo_chat_largest_batch": stats["largest_batch"],
            "halo_chat_walk_forwards_total": stats["walk_forwards"],
            "halo_chat_walk_rows_total": stats["walk_rows"],
            "halo_chat_batched_prefills_total": cache.batched_prefills,
            "halo_chat_batched_prefill_prompts_total": cache.batched_prompts,
        }
        return "".join(f"{name} {value}\n" for name, value in values.items())

    def _token(self, token_id: int, as_token_id: bool) -> tuple[str, list[int]]:
        """A token as the answer names it (its text, or vLLM's ``token_id:N``), and its decoded text's bytes."""
        text = self.engine.tokenizer.decode([token_id])
        return (f"token_id:{token_id}" if as_token_id else text), list(text.encode("utf-8", errors="replace"))

    def _logprobs(self, generation: Any, as_token_ids: bool) -> dict[str, Any]:
        content = []
        for j, (token_id, lp) in enumerate(zip(generation.token_ids, generation.logprobs)):
            token, data = self._token(token_id, as_token_ids)
            entry = {"token": token, "logprob": max(lp, MIN_LOGPROB), "bytes": data, "top_logprobs": []}
            for other, value in (generation.top_logprobs[j] if generation.top_logprobs else []):
                name, other_data = self._token(other, as_token_ids)
                entry["top_logprobs"].append({"token": name, "logprob": max(value, MIN_LOGPROB), "bytes": other_data})
            content.append(entry)
        return {"content": content, "refusal": None}

    def _prompt_logprobs(self, prompt_ids: list[int], top: int, adapter: str | None) -> list[dict[str, Any] | None]:
        decode = self.engine.tokenizer.decode
        return [None if entry is None else
                {str(token): {"logprob": max(lp, MIN_LOGPROB), "rank": rank, "decoded_token": decode([token])}
                 for token, (lp, rank) in entry.items()}
                for entry in self.loop.call(lambda: self.engine.prompt_logprobs(prompt_ids, top, adapter))]

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self
        routes = {
            "/v1/chat/completions": self.chat_completion,
            "/chat/completions": self.chat_completion,
            "/v1/load_lora_adapter": self.load_lora_adapter,
            "/v1/unload_lora_adapter": self.unload_lora_adapter,
        }

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "HALO-ChatServer/1"
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, payload: Mapping[str, Any] | str) -> None:
                # vLLM answers the runtime LoRA routes in plain text, everything else in JSON.
                text = isinstance(payload, str)
                data = (payload if text else json.dumps(payload)).encode("utf-8")
                try:
                    reply(self, status, data, "text/plain; charset=utf-8" if text else "application/json")
                except ConnectionError:  # the client is gone (killed, timed out): what it asked for is done, unanswered
                    log.info("%s %s: the client closed the connection before the answer", self.command, self.path)
                    self.close_connection = True

            def _error(self, e: RequestError) -> None:
                self._send(e.status, {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.status}})

            def _authorised(self) -> bool:
                if not server.api_key:
                    return True
                return self.headers.get("Authorization", "") == f"Bearer {server.api_key}"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if not self._authorised():
                    return self._error(RequestError("invalid API key", 401, "authentication_error"))
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    return self._send(200, server.models())
                if self.path.rstrip("/") == "/metrics":
                    return self._send(200, server.metrics())
                if self.path.rstrip("/") in ("/health", "/v1/health"):
                    return self._send(200, {"status": "ok"})
                self._error(RequestError(f"no route {self.path}", 404, "not_found_error"))

            def do_POST(self) -> None:  # noqa: N802
                if not self._authorised():
                    return self._error(RequestError("invalid API key", 401, "authentication_error"))
                route = routes.get(self.path.rstrip("/"))
                if route is None:
                    return self._error(RequestError(f"no route {self.path}", 404, "not_found_error"))
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    return self._error(RequestError("request body too large", 413))
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except json.JSONDecodeError as e:
                    return self._error(RequestError(f"request body is not JSON: {e.msg}"))
                try:
                    self._send(200, route(body))
                except RequestError as e:
                    self._error(e)
                except Exception as e:  # a failure inside the engine is the server's fault: 500, like vLLM
                    log.exception("%s failed", self.path)
                    self._error(RequestError(f"{self.path} failed: {type(e).__name__}: {e}", 500, "internal_server_error"))

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("%s %s", self.address_string(), format % args)

        return Handler


def keep_niceness_in_session_group() -> None:
    """A server started in a session of its own (``start_new_session``) leaves its parent's scheduling group: where
    the kernel groups by session (``/proc/sys/kernel/sched_autogroup_enabled``), that group competes at full weight
    with every other, whatever the process's nice value. A niced server (``nice -n 19 halo-train ...``) carries its
    niceness into its own group, so it stays in the background it was started in."""
    niceness = os.nice(0)
    if niceness <= 0 or os.getsid(0) != os.getpid():
        return  # not niced, or in its parent's session (and group) still
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(niceness))
    except OSError:  # no autogroup in this kernel, or not allowed: nice still orders the process within its group
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m halo_agent.chat_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="local model folder (transformers) or a known model name, e.g. smollm2-135m-instruct")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="names clients use as `model` for the base model, as vLLM's (default: the folder name)")
    parser.add_argument("--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="LoRA adapters, selected by NAME")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto")
    parser.add_argument("--max-tokens-limit", type=int, default=1024)
    parser.add_argument("--choice-draw", choices=CHOICE_DRAWS, default="token",
                        help="how a guided choice is drawn: token (masked step by step, as vLLM) | sequence (in proportion "
                             "to each choice's whole-sequence probability, this server's draw before 2026-11-27)")
    parser.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="processed_logprobs",
                        help="the logprobs answered, as vLLM's flag: processed_logprobs (of the distribution each token was "
                             "drawn from: temperature, top-p, a guided choice's mask) | raw_logprobs (the model's log-softmax)")
    parser.add_argument("--score-mode", choices=SCORE_MODES, default="cached",
                        help="how a guided choice is scored: cached (the prompt prefilled once, reusing a recent prompt's "
                             "prefix, and the masked draw walking only the drawn path) | full (the whole prompt prefilled "
                             "afresh for each request; with --choice-draw sequence every choice scored after it)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch's threads for one forward (default: torch's, one per core)")
    parser.add_argument("--prompt-cache-size", type=int, default=8, metavar="N", help="prompts whose KV caches are kept")
    parser.add_argument("--max-batch", type=int, default=8, metavar="N",
                        help="guided choices in progress together at most, as vLLM's --max-num-seqs (1: each alone, "
                             "in order of arrival)")
    parser.add_argument("--batch-window-ms", type=float, default=10.0, metavar="MS",
                        help="how long the idle engine waits after a request for more to be prefilled with it (it stops "
                             "waiting once as many are queued as it last admitted together)")
    parser.add_argument("--linear-kernel", choices=LINEAR_KERNELS, default="auto",
                        help="the CPU kernel of the model's linear layers: onednn reads the weights once for every "
                             "row of a batch; torch (MKL's sgemm) once per row below 4 rows (default auto: onednn "
                             "where torch has it)")
    parser.add_argument("--walk-batch-from", type=int, default=None, metavar="N",
                        help="the fewest choice walks advanced in one padded forward; fewer run one forward each "
                             "(default: 2; 3 on a CPU with --linear-kernel torch, where a forward of 2 costs two of 1)")
    parser.add_argument("--api-key", default=None, help="require this bearer key (default: HALO_CHAT_SERVER_KEY, else none)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="stop once this process (the one that started the server) has ended, however it ended")
    args = parser.parse_args(argv)
    if args.max_batch < 1 or args.batch_window_ms < 0:
        sys.stderr.write("Error: --max-batch must be at least 1 and --batch-window-ms at least 0\n")
        return 2
    if args.walk_batch_from is not None and args.walk_batch_from < 2:
        sys.stderr.write("Error: --walk-batch-from must be at least 2\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    keep_niceness_in_session_group()
    # OpenMP threads that spin while they wait stall one another when the cores are shared (a browser, other jobs):
    # a 170-token prefill on 2 threads took 25-34 s spinning against 1.5-3.5 s waiting passively (load 25 on
    # 2 cores). Read when torch loads, so set before it does; the user's OpenMP settings are kept.
    passive_openmp()
    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    adapters = {}
    for item in args.lora_modules:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            sys.stderr.write(f"Error: --lora-modules takes NAME=PATH, got {item!r}\n")
            return 2
        adapters[name] = path

    def build() -> ChatCompletionServer:
        engine = LocalChatModel(args.model, adapters=adapters, device=args.device, choice_draw=args.choice_draw,
                                logprobs_mode=args.logprobs_mode, score_mode=args.score_mode,
                                prompt_cache_size=args.prompt_cache_size, linear_kernel=args.linear_kernel)
        if args.walk_batch_from is not None:
            engine.walk_batch_from = args.walk_batch_from
        import torch

        log.info("scoring guided choices %s; linear layers on %s; %d torch threads, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s",
                 args.score_mode, engine.linear_kernel, torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"),
                 os.environ.get("GOMP_SPINCOUNT"))
        return ChatCompletionServer(
            engine, args.served_model_name, port=args.port,
            api_key=args.api_key or os.environ.get("HALO_CHAT_SERVER_KEY"), max_tokens_limit=args.max_tokens_limit,
            batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
        )

    return serve_until_interrupted(
        build, (ModelLoadError, OSError), lambda server: f"Serving {server.served_model_name} at {server.url} (HALO_VLLM_URL={server.url})",
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":
    sys.exit(main())
