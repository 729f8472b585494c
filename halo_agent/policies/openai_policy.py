"""A policy served by any OpenAI-compatible chat endpoint: OpenAI models, or vLLM with LoRA adapters.

Where it points (first set wins): ``base_url=``, ``HALO_VLLM_URL``,
``OPENAI_BASE_URL``, else api.openai.com. The key: ``api_key=``, else
``OPENAI_API_KEY`` (a local endpoint needs none). The key never leaves this
object: it is not in ``config()``, and error texts are scrubbed of it before
they reach a ``PolicyOutput``.

``model`` is the name the endpoint serves; with vLLM that may be a LoRA adapter
served through ``--lora-modules NAME=PATH`` (``model="NAME"``). Pass
``adapter=NAME`` with ``model=BASE`` to record both: requests then name the adapter.

Text mode sends the goal and AXTree prompt (``Observation.messages``, images
dropped); screenshot mode resolves the prompt's image references to base64 PNG
``image_url`` parts and accepts coordinate actions (``mouse_click(x, y)``;
``coordinate_scale=1000`` for models such as Qwen3-VL that answer on a 0..1000 grid).

``constrain_actions=True`` (text mode) constrains decoding to the page's actions
(``halo_agent.actions.page_actions``: a click per clickable element, one
``select_option`` per option) through vLLM's structured outputs
(``structured_outputs: {"choice": [...]}``), which HALO's chat server answers too:
every answer parses, so what is left to learn is which element to act on.
``choice_labels=True`` (with ``constrain_actions``) puts a comment line naming the element before each
choice, ``# 'Tab #2'\nclick('21')``: the answer (``model_output``) carries the label, the step's action is the
canonical call (``click('21')``), and a choice's sequence log-probability includes the label's words.

``cover_choices=True`` (with ``constrain_actions``) makes ``last_samples`` a group of distinct actions
instead of ``n`` draws: the sampled action first, then the page's other choices, each forced through a
one-choice request (the first ``n - 1`` of them, in the page's order, when the page offers more); each keeps the
tokens the engine spelled it with and no logprobs, since a one-choice request's say nothing of the page's draw
(a trainer scores them on-policy). Scored from the same state, every offered action is then compared with every
other, instead of the few the policy happened to draw again and again.

Token-exact steps. With ``logprobs`` (the default) each request asks for the sampled tokens' logprobs and, as
vLLM's ``return_tokens_as_token_ids: true``, for each token as ``"token_id:N"``: a sample then carries the
engine's token ids (``completion_token_ids``, EOS included where the engine returned it) beside one logprob per
token. Which distribution those logprobs are of (``logprobs_mode``) and how the answer was drawn (``draw``) come
from the response where the endpoint says so (HALO's chat server: ``halo_logprobs_mode`` and ``halo_draw`` on
each choice); otherwise the mode is the ``logprobs_mode`` option (``processed_logprobs`` by default, what HALO's
chat server and ``halo-train serve``'s vLLM report; set ``raw_logprobs`` for a vLLM started without
``--logprobs-mode processed_logprobs``) and the draw follows from the request: ``masked_choice`` for a guided
choice drawn at a temperature, ``greedy`` at temperature 0 (with the choices stored, a guided one), else ``sample``. An endpoint that refuses the token-id field
(OpenAI's) is asked again without it, and its samples carry no token ids.

Each call asks for ``n`` samples: the first is the action, all of them are in
``last_samples`` (for the ``candidates`` table). 429s, 5xx, timeouts and
connection failures are retried with exponential backoff; what still fails comes
back as ``PolicyOutput.api_error`` — apart from a wrong answer (a parsed action the
environment scores) and an unparseable one (``parse_error``; the episode goes on).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import re
import threading
import time
import urllib.parse
from typing import Any, Callable

from halo_agent.actions import page_actions, parse_for_observation, png_size, rescale_coordinates
from halo_agent.costs import estimate_cost
from halo_agent.types import Observation, PolicyOutput

log = logging.getLogger(__name__)

BASE_URL_ENV_VARS = ("HALO_VLLM_URL", "OPENAI_BASE_URL")
API_KEY_ENV_VAR = "OPENAI_API_KEY"
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# Request parameters some endpoints refuse (reasoning models: logprobs, max_tokens; some servers: seed, n).
_OPTIONAL_PARAMS = ("logprobs", "seed", "max_tokens")
# vLLM's request field for tokens as "token_id:N" (sent in the body; OpenAI refuses it as unrecognised).
TOKEN_IDS_PARAM = "return_tokens_as_token_ids"
TOKEN_ID_PREFIX = "token_id:"
# vLLM's sampling fields, sent with every token-exact request at their neutral values: a ``vllm serve`` that takes
# the model's generation_config.json as default sampling parameters (``--generation-config auto``: Qwen2.5's
# repetition_penalty 1.05, top_k 20, top_p 0.8) then still samples from, and reports the logprobs of, the
# distribution the step stores (its temperature alone). ``top_p`` 1 goes with them unless the policy sets it. An endpoint that refuses them (OpenAI's) is asked again
# without them and without token ids: its samples carry no token ids, so no trainer takes a ratio on them.
NEUTRAL_SAMPLING = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                    "presence_penalty": 0.0, "min_tokens": 0}

_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


class PolicyConfigError(ValueError):
    """The policy cannot be set up as asked; the message says what to do."""


class PolicyAPIError(RuntimeError):
    """The endpoint failed after the retries allowed (already scrubbed of secrets)."""


def _concurrency_slot(base_url: str, limit: int) -> threading.BoundedSemaphore:
    """One cap per endpoint per process, shared by every policy object that talks to it."""
    with _SEMAPHORES_LOCK:
        key = (base_url, limit)
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(limit)
        return _SEMAPHORES[key]


def public_url(url: str) -> str:
    """A URL safe to record: no user:password, no query string (where tokens hide)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


_TOKEN_PATTERNS = (
    re.compile(r"sk-[A-Za-z0-9_\-*]{4,}"),  # OpenAI keys, also as echoed masked ("sk-abc*****xyz")
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._\-~+/=*]{8,}"),
)


class SecretScrubber:
    """Removes a key (whole or as the first/last characters endpoints echo) from text."""

    def __init__(self, secrets: list[str]):
        self._secrets = [s for s in secrets if s and len(s) >= 6]

    def __call__(self, text: str | None) -> str | None:
        if text is None:
            return None
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
            # Endpoints echo masked keys: the first and last few characters around stars.
            head, tail = re.escape(secret[:6]), re.escape(secret[-4:])
            text = re.sub(head + r"\S*" + tail, "[redacted]", text)
        for pattern in _TOKEN_PATTERNS:
            text = pattern.sub("[redacted]", text)
        return text


class OpenAIPolicy:
    name = "openai"

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        top_p: float | None = None,
        n: int = 1,
        max_tokens: int = 256,
        use_screenshot: bool = False,
        coordinate_scale: float | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_concurrent: int = 8,
        logprobs: bool = True,
        policy_version: str | None = None,
        image_loader: Callable[[str], tuple[bytes, str]] | None = None,
        seed: int | None = None,
        constrain_actions: bool = False,
        choice_labels: bool = False,
        cover_choices: bool = False,
        logprobs_mode: str = "processed_logprobs",
        **_ignored: Any,
    ) -> None:
        import openai

        if not model:
            raise PolicyConfigError("the openai policy needs --model: the model (or LoRA adapter) name the endpoint serves")
        if n < 1 or n > 128:
            raise PolicyConfigError("n must be between 1 and 128")
        if not 0.0 <= temperature <= 2.0:
            raise PolicyConfigError("temperature must be between 0 and 2")
        if max_tokens < 1:
            raise PolicyConfigError("max_tokens must be at least 1")
        if max_concurrent < 1:
            raise PolicyConfigError("max_concurrent must be at least 1")
        self.model = model
        self.adapter = adapter
        self.request_model = adapter or model
        self.base_url = (base_url or next((os.environ[v] for v in BASE_URL_ENV_VARS if os.environ.get(v)), None) or OPENAI_DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get(API_KEY_ENV_VAR)
        if not key:
            if self.base_url == OPENAI_DEFAULT_URL:
                raise PolicyConfigError(
                    "no API key: set OPENAI_API_KEY, or point HALO_VLLM_URL at an OpenAI-compatible server"
                )
            key = "EMPTY"  # vLLM and local servers accept any key unless started with one
        self._scrub = SecretScrubber([key] if key != "EMPTY" else [])
        self.temperature = float(temperature)
        if top_p is not None and not 0 < float(top_p) <= 1:
            raise PolicyConfigError(f"top_p must be in (0, 1], got {top_p}")
        if top_p is not None and float(top_p) < 1 and logprobs:
            raise PolicyConfigError(f"top_p {top_p} cuts the distribution the stored logprobs are of, and the step does not "
                                    "store the cut, so no trainer could rebuild it: use top_p 1 (or logprobs=False)")
        self.top_p = top_p
        self.n = int(n)
        self.max_tokens = int(max_tokens)
        self.uses_screenshot = bool(use_screenshot)
        self.coordinate_scale = float(coordinate_scale) if coordinate_scale else None
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_concurrent = int(max_concurrent)
        self.want_logprobs = bool(logprobs)
        self.policy_version = policy_version or f"openai:{self.request_model}"
        self.image_loader = image_loader
        self._seed = seed
        if not isinstance(constrain_actions, bool):
            raise PolicyConfigError(f"constrain_actions must be true or false, got {constrain_actions!r}")
        self.constrain_actions = constrain_actions
        if not isinstance(choice_labels, bool):
            raise PolicyConfigError(f"choice_labels must be true or false, got {choice_labels!r}")
        if choice_labels and not constrain_actions:
            raise PolicyConfigError("choice_labels labels the choices of constrained decoding: set constrain_actions too")
        self.choice_labels = choice_labels
        if not isinstance(cover_choices, bool):
            raise PolicyConfigError(f"cover_choices must be true or false, got {cover_choices!r}")
        if cover_choices and not constrain_actions:
            raise PolicyConfigError("cover_choices covers the choices of constrained decoding: set constrain_actions too")
        self.cover_choices = cover_choices
        from halo_data.schema import LOGPROBS_MODES

        if logprobs_mode not in LOGPROBS_MODES:
            raise PolicyConfigError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)} (the engine's "
                                    f"--logprobs-mode), got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self._dropped_params: set[str] = set()
        self._slot = _concurrency_slot(self.base_url, self.max_concurrent)
        # Retries are ours (counted, with our backoff), so the client's own are off.
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=key,
            timeout=openai.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            max_retries=0,
        )
        self.last_samples: list[PolicyOutput] = []
        # Retries of the last act() or chat(), over all its requests (a covered step's forced ones included).
        self.last_retries = 0
        self._retries_lock = threading.Lock()

    # ------------------------------------------------------------------ the run record

    def config(self) -> dict[str, Any]:
        """The policy's settings for the run record: never the key."""
        return {
            "policy": self.name,
            "model": self.model,
            "adapter": self.adapter,
            "request_model": self.request_model,
            "policy_version": self.policy_version,
            "base_url": public_url(self.base_url),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
            "max_tokens": self.max_tokens,
            "use_screenshot": self.uses_screenshot,
            "coordinate_scale": self.coordinate_scale,
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "max_concurrent": self.max_concurrent,
            "constrain_actions": self.constrain_actions,
            "choice_labels": self.choice_labels,
            "cover_choices": self.cover_choices,
            "logprobs_mode": self.logprobs_mode,
        }

    # ------------------------------------------------------------------ policy protocol

    def reset(self, seed: int) -> None:
        self._seed = int(seed)

    def act(self, obs: Observation) -> PolicyOutput:
        started = time.perf_counter()
        try:
            messages = self.request_messages(obs)
        except (KeyError, OSError, ValueError) as e:
            return PolicyOutput(model_output=None, action=None, api_error=self._scrub(f"cannot build the request: {e}"),
                                latency_ms=_ms(started))
        choices = page_actions(obs.elements, labels=self.choice_labels) if self.constrain_actions else None
        self.last_retries = 0
        covering = self.cover_choices and self.n > 1 and choices is not None
        try:
            response = self._complete(messages, obs.step_idx, choices, n=1 if covering else self.n)
        except PolicyAPIError as e:
            self.last_samples = []
            return PolicyOutput(model_output=None, action=None, api_error=str(e), latency_ms=_ms(started))
        samples = self._samples(response, obs, _ms(started), choices)
        if not samples:
            self.last_samples = []
            return PolicyOutput(model_output=None, action=None, api_error="the endpoint returned no choices", latency_ms=_ms(started))
        if covering:
            try:
                samples = self._cover(messages, obs, choices, samples[0], started)
            except PolicyAPIError as e:  # the action was drawn; only its group is lost
                log.warning("cannot score the other choices of step %d: %s", obs.step_idx, e)
                samples = samples[:1]
        self.last_samples = samples
        return samples[0]

    def _samples(self, response: Any, obs: Observation, latency: float, choices: list[str] | None = None) -> list[PolicyOutput]:
        """One PolicyOutput per choice of ``response``, with its tokens where the endpoint gave them; the call's cost
        on the first. ``choices``: the guided choice's answers the request was constrained to."""
        usage = getattr(response, "usage", None)
        prompt_tokens, completion_tokens = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        cost = estimate_cost(self.request_model, prompt_tokens, completion_tokens)
        viewport = self._viewport(obs)
        samples = []
        for choice in response.choices or []:
            text = _choice_text(choice)
            action, error = self.parse(text, obs, viewport)
            token_logprobs, token_ids = _choice_logprobs(choice)
            samples.append(
                PolicyOutput(
                    model_output=self._scrub(text),
                    action=action,
                    action_source="model",
                    parse_error=self._scrub(error),
                    latency_ms=latency,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    call_model=self.request_model,
                    cost_usd=cost if not samples else 0.0,  # one call, whatever its n: its cost on the first sample
                    logprobs=token_logprobs,
                    logprob_sum=float(sum(token_logprobs)) if token_logprobs else None,
                    completion_token_ids=token_ids,
                    logprobs_mode=(_extra(choice, "halo_logprobs_mode") or self.logprobs_mode) if token_logprobs else None,
                    draw=_extra(choice, "halo_draw") or self._draw(choices),
                    choices=list(choices) if choices is not None else None,
                )
            )
        return samples

    def _cover(self, messages: list[dict[str, Any]], obs: Observation, choices: list[str], action: PolicyOutput,
               started: float) -> list[PolicyOutput]:
        """``action`` and the page's other choices, each forced by a one-choice request (in parallel, within
        ``max_concurrent``), in the page's order, ``n`` in all. The action's sample carries every call's cost
        and the whole latency.

        A forced choice is stored as a choice of the page's draw (``choices`` the page's, ``draw`` the action's),
        which is the distribution a trainer scores it under. Its own request's logprobs are those of a one-choice
        mask (the share of the way the engine spelled it among the ways of spelling it, under either logprobs
        mode: vLLM masks the logits before computing raw logprobs too) and say nothing of that draw: it keeps its
        token ids and no logprobs, and a trainer scores it on-policy (``grpo --choice-softmax``)."""
        from concurrent.futures import ThreadPoolExecutor

        others = [c for c in choices if c != action.model_output]
        if not others:  # a page with one action: nothing to compare it with
            return [action]

        def forced(choice: str) -> PolicyOutput:
            response = self._complete(messages, obs.step_idx, [choice], n=1)
            got = self._samples(response, obs, 0.0, [choice])
            if not got:
                raise PolicyAPIError("the endpoint returned no choices")
            return dataclasses.replace(got[0], choices=list(choices), draw=action.draw, logprobs=None, logprob_sum=None)

        with ThreadPoolExecutor(max_workers=min(self.max_concurrent, len(others))) as pool:
            scored = list(pool.map(forced, others))
        ranked = scored[: self.n - 1]
        cost = sum(s.cost_usd or 0.0 for s in [action, *scored]) if action.cost_usd is not None else None
        first = dataclasses.replace(action, latency_ms=_ms(started), cost_usd=cost)
        return [first, *(dataclasses.replace(s, cost_usd=0.0, latency_ms=0.0) for s in ranked)]

    def _draw(self, choices: list[str] | None) -> str:
        """How the endpoint drew an answer, from the request, where it does not say (vLLM)."""
        if self.temperature == 0:
            return "greedy"  # a guided choice's too: its choices say it was masked
        return "masked_choice" if choices is not None else "sample"  # vLLM's guided choice masks each decoding step

    def chat(self, messages: list[dict[str, Any]], step_idx: int = 0) -> ChatAnswer:
        """One completion of ``messages`` (text only) with this policy's endpoint, retries and settings.

        Raises ``PolicyAPIError`` when the endpoint fails; the answer carries the ``usage`` the endpoint reported.
        """
        from halo_data.prompts import text_only

        started = time.perf_counter()
        self.last_retries = 0
        response = self._complete(text_only(messages), step_idx)
        usage = getattr(response, "usage", None)
        prompt_tokens, completion_tokens = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        text = _choice_text(response.choices[0]) if response.choices else None
        return ChatAnswer(self._scrub(text), prompt_tokens, completion_tokens, _ms(started),
                          estimate_cost(self.request_model, prompt_tokens, completion_tokens))

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ request

    def request_messages(self, obs: Observation) -> list[dict[str, Any]]:
        """The chat messages sent for ``obs``: its stored prompt, with images resolved (screenshot mode) or dropped."""
        from halo_data.prompts import resolve_images, text_only

        if not self.uses_screenshot:
            return text_only(obs.messages)

        def load_image(image_hash: str) -> tuple[bytes, str]:
            if obs.screenshot is not None and image_hash == obs.screenshot_hash:
                return obs.screenshot, "png"
            if self.image_loader is not None:
                return self.image_loader(image_hash)
            raise KeyError(f"screenshot {image_hash[:12]} is neither the current one nor loadable (pass image_loader)")

        return resolve_images(obs.messages, load_image)

    def _viewport(self, obs: Observation) -> tuple[int, int] | None:
        viewport = obs.extra.get("viewport") if obs.extra else None
        if viewport:
            return int(viewport[0]), int(viewport[1])
        return png_size(obs.screenshot)

    def parse(self, text: str | None, obs: Observation, viewport: tuple[int, int] | None) -> tuple[str | None, str | None]:
        if not self.uses_screenshot:
            return parse_for_observation(text, obs)
        if self.coordinate_scale and viewport:
            grid = (int(self.coordinate_scale), int(self.coordinate_scale))
            action, error = parse_for_observation(text, obs, allow_coordinates=True, viewport=grid)
            if action is not None:
                action = rescale_coordinates(action, self.coordinate_scale, viewport)
            return action, error
        return parse_for_observation(text, obs, allow_coordinates=True, viewport=viewport)

    def _params(self, messages: list[dict[str, Any]], step_idx: int, choices: list[str] | None = None, n: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.request_model, "messages": messages, "temperature": self.temperature}
        if choices is not None:
            # vLLM's structured outputs (HALO's chat server too): the answer is one of the page's actions.
            params["extra_body"] = {"structured_outputs": {"choice": choices}}
        n = self.n if n is None else n
        if n > 1:
            params["n"] = n
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if "max_tokens" in self._dropped_params:
            params["max_completion_tokens"] = self.max_tokens
        else:
            params["max_tokens"] = self.max_tokens
        if self.want_logprobs and "logprobs" not in self._dropped_params:
            params["logprobs"] = True
            if TOKEN_IDS_PARAM not in self._dropped_params:
                neutral = NEUTRAL_SAMPLING if self.top_p is not None else {**NEUTRAL_SAMPLING, "top_p": 1.0}
                params["extra_body"] = {**params.get("extra_body", {}), TOKEN_IDS_PARAM: True, **neutral}
        if self._seed is not None and "seed" not in self._dropped_params:
            # A per-step seed: the same episode seed replays the same samples where the endpoint honours seeds.
            digest = hashlib.sha256(f"{self._seed}\x1f{step_idx}".encode()).digest()
            params["seed"] = int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
        return params

    def _complete(self, messages: list[dict[str, Any]], step_idx: int, choices: list[str] | None = None, n: int | None = None):
        import openai

        attempt = 0
        while True:
            params = self._params(messages, step_idx, choices, n)
            try:
                with self._slot:
                    return self._client.chat.completions.create(**params)
            except openai.BadRequestError as e:
                dropped = self._unsupported_param(e, params)
                if dropped:
                    log.info("endpoint refuses %s; retrying without it", dropped)
                    self._dropped_params.add(dropped)
                    continue
                raise PolicyAPIError(self._describe(e)) from None
            except openai.APIStatusError as e:
                if e.status_code not in RETRY_STATUSES or attempt >= self.max_retries:
                    raise PolicyAPIError(self._describe(e, attempt)) from None
                delay = self._backoff(attempt, e.response.headers.get("retry-after") if e.response is not None else None)
                log.warning("endpoint answered %s; retry %d/%d in %.2fs", e.status_code, attempt + 1, self.max_retries, delay)
            except (openai.APITimeoutError, openai.APIConnectionError) as e:
                if attempt >= self.max_retries:
                    raise PolicyAPIError(self._describe(e, attempt)) from None
                delay = self._backoff(attempt, None)
                log.warning("endpoint unreachable (%s); retry %d/%d in %.2fs", type(e).__name__, attempt + 1, self.max_retries, delay)
            except openai.OpenAIError as e:  # malformed responses and the like: not worth retrying
                raise PolicyAPIError(self._describe(e, attempt)) from None
            attempt += 1
            with self._retries_lock:  # covered steps send their forced requests from several threads
                self.last_retries += 1
            time.sleep(delay)

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        delay = self.backoff_s * (2 ** attempt)
        delay *= 1.0 + 0.25 * random.random()  # jitter, so parallel workers do not retry in lockstep
        if retry_after:
            try:
                delay = max(delay, float(retry_after))
            except ValueError:
                pass
        return min(delay, self.max_backoff_s)

    def _unsupported_param(self, error: Exception, params: dict[str, Any]) -> str | None:
        message = str(getattr(error, "message", error)).lower()
        group = (TOKEN_IDS_PARAM, *NEUTRAL_SAMPLING, "top_p")  # sent together with token ids, dropped together
        if TOKEN_IDS_PARAM in params.get("extra_body", {}) and any(f in message for f in group):
            return TOKEN_IDS_PARAM  # OpenAI: "Unrecognized request argument supplied: return_tokens_as_token_ids"
        for name in _OPTIONAL_PARAMS:
            if name in params and name not in self._dropped_params and name in message and (
                "unsupported" in message or "not supported" in message or "does not support" in message
            ):
                return name
        return None

    def _describe(self, error: Exception, retries: int = 0) -> str:
        import openai

        status = getattr(error, "status_code", None)
        body = getattr(error, "message", None) or str(error)
        if isinstance(error, openai.APITimeoutError):
            text = f"timeout after {self.timeout_s:g}s"
        elif isinstance(error, openai.APIConnectionError):
            text = f"cannot connect to {public_url(self.base_url)}"
        else:
            text = f"{type(error).__name__}" + (f" (HTTP {status})" if status else "") + f": {body}"
        if retries:
            text += f" [after {retries} retries]"
        return self._scrub(" ".join(text.split()))[:500]


@dataclasses.dataclass(frozen=True)
class ChatAnswer:
    text: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float
    cost_usd: float | None


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _choice_text(choice: Any) -> str | None:
    message = getattr(choice, "message", None)
    if message is None:
        return None
    content = getattr(message, "content", None)
    if content:
        return content
    # A model that answers with a tool call: its JSON is a JSON action for the parser.
    tool_calls = getattr(message, "tool_calls", None) or []
    for call in tool_calls:
        function = getattr(call, "function", None)
        if function is not None:
            return f'{{"name": "{function.name}", "arguments": {function.arguments or "{}"}}}'
    return content


def _choice_logprobs(choice: Any) -> tuple[list[float] | None, list[int] | None]:
    """A choice's per-token logprobs, and its token ids where every token came as ``"token_id:N"`` (else None)."""
    logprobs = getattr(choice, "logprobs", None)
    content = getattr(logprobs, "content", None) if logprobs is not None else None
    if not content:
        return None, None
    return [float(t.logprob) for t in content], token_ids(t.token for t in content)


def token_ids(tokens: Any) -> list[int] | None:
    """``["token_id:12", "token_id:7"]`` -> ``[12, 7]``; None if any token is not in that form (an endpoint that
    returns token text: the ids are unknown, never guessed by tokenising the text again)."""
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
            return None
        number = token[len(TOKEN_ID_PREFIX):]
        if not number.isdigit():
            return None
        ids.append(int(number))
    return ids


def _extra(choice: Any, name: str) -> Any:
    """A field the OpenAI schema does not have (HALO's ``halo_draw``), as the client keeps it."""
    value = getattr(choice, name, None)
    if value is None:
        value = (getattr(choice, "model_extra", None) or {}).get(name)
    return value
