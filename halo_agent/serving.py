"""One client for the OpenAI-compatible engines a policy is served by: vLLM on a GPU, HALO's chat server on CPU.

    engine = EngineClient("http://127.0.0.1:8000/v1")
    engine.wait_ready(timeout=120)
    swap = engine.swap_adapter("policy-3", "out/online/policy-3", retire="policy-2")
    if not swap.loaded:
        log.warning(swap.message)        # still serving policy-2

Chat completions go through ``halo_agent.policies.openai_policy``; this client
covers what a training loop needs beside them: health, the served models, and
vLLM's runtime LoRA API (``POST /v1/load_lora_adapter`` ``{lora_name, lora_path}``,
``POST /v1/unload_lora_adapter`` ``{lora_name}``; vLLM serves them when started with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``). HALO's chat server
answers the same routes the same way, so the same loop runs on both.

Each policy version is loaded under a new name: vLLM caches adapters by name,
and reloading changed weights under a name it has seen can serve the old ones.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger(__name__)

# What a retry can cure: the engine busy, restarting or briefly unreachable.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class EngineError(RuntimeError):
    """The engine refused a request or could not be reached; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class SwapResult:
    """What ``swap_adapter`` did: which adapter now serves, how long loading took, what went wrong if anything."""

    serving: str | None
    loaded: bool
    seconds: float
    message: str


class EngineClient:
    """Admin calls to an OpenAI-compatible engine at ``base_url`` (ending in ``/v1``).

    ``retries``/``backoff``: how often and how patiently a refused or dropped request is tried again.
    ``api_key`` goes into the ``Authorization`` header only; it is never logged or kept in results.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0, retries: int = 3, backoff: float = 0.5):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.timeout = float(timeout)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def close(self) -> None:
        """Nothing is held between requests; kept so the client can be used as a context manager."""

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ requests
    def _send(self, method: str, url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {**self._headers, **({"Content-Type": "application/json"} if data is not None else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")

    def _request(self, method: str, route: str, body: dict[str, Any] | None = None) -> str:
        """One request's answer text, retried on connection failures and on the statuses a retry can cure."""
        url = f"{self.base_url}/{route}"
        last: EngineError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, text = self._send(method, url, body, self.timeout)
            except (OSError, urllib.error.URLError) as e:
                reason = getattr(e, "reason", e)
                last = EngineError(f"{method} {url}: {type(reason).__name__}: {reason}")
                continue
            if status < 400:
                return text
            last = EngineError(f"{method} {url}: {status} {_error_message(text)}", status)
            if status not in RETRY_STATUSES:
                break
        assert last is not None
        raise last

    def ready(self) -> bool:
        try:
            return self._send("GET", f"{self.base_url}/models", None, timeout=5.0)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout: float = 300.0, interval: float = 0.5) -> None:
        """Block until the engine lists its models; ``EngineError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise EngineError(f"no engine answered at {self.base_url} within {timeout:.0f} s: start one or check --engine-url")
            time.sleep(interval)

    def chat(self, model: str, messages: list[dict[str, Any]], **params: Any) -> str:
        """The text of the first choice of one chat completion (``params``: temperature, max_tokens, seed, ...)."""
        answer = json.loads(self._request("POST", "chat/completions", {"model": model, "messages": messages, **params}))
        try:
            return answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"POST {self.base_url}/chat/completions: an answer without choices") from None

    def models(self) -> dict[str, dict[str, Any]]:
        """``{id: model card}`` of what the engine serves: the base model and its adapters (cards with a ``parent``)."""
        data = json.loads(self._request("GET", "models")).get("data", [])
        return {card["id"]: card for card in data}

    # ------------------------------------------------------------------ runtime LoRA
    def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter folder ``path`` under ``name``. A retried load the engine had already done counts as done."""
        try:
            self._request("POST", "load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        except EngineError as e:
            # A load whose answer was lost and then retried is refused as "already loaded": it did happen.
            if e.status == 400 and "already been loaded" in str(e) and self.models().get(name, {}).get("root") == str(path):
                return
            raise

    def unload_adapter(self, name: str) -> None:
        try:
            self._request("POST", "unload_lora_adapter", {"lora_name": name})
        except EngineError as e:
            # Retried after a lost answer: gone is what was asked for.
            if e.status == 404 and name not in self.models():
                return
            raise

    def swap_adapter(self, name: str, path: str, retire: str | None = None) -> SwapResult:
        """Serve ``path`` as ``name``, then unload ``retire``; if loading fails, ``retire`` keeps serving.

        Never raises for a refused or dropped load: the result says which adapter serves and why. An adapter
        already loaded under ``name`` from another folder (an earlier run's version, left loaded in an engine that
        outlives runs) is unloaded first, so that ``name`` serves ``path``.
        """
        t0 = time.perf_counter()
        try:
            self._replace_other(name, path, retire)
            self.load_adapter(name, path)
        except EngineError as e:
            seconds = time.perf_counter() - t0
            keep = f"still serving {retire}" if retire else "still serving the base model"
            return SwapResult(retire, False, seconds, f"could not load {name} from {path}: {e}; {keep}")
        seconds = time.perf_counter() - t0
        message = f"serving {name} (loaded in {seconds:.2f} s)"
        if retire and retire != name:
            try:
                self.unload_adapter(retire)
            except EngineError as e:
                message += f"; {retire} stays loaded: {e}"
        return SwapResult(name, True, seconds, message)

    def _replace_other(self, name: str, path: str, retire: str | None) -> None:
        """Unload what ``name`` serves if it was loaded from another folder than ``path``."""
        try:
            root = self.models().get(name, {}).get("root")
        except EngineError:  # the engine does not list its models now: the load itself will say what is wrong
            return
        if root is not None and root != str(path) and name != retire:
            log.warning("%s is loaded from %s: unloading it to serve %s under that name", name, root, path)
            self.unload_adapter(name)


def _error_message(text: str) -> str:
    """The message of a vLLM/OpenAI error body (``{"error": {...}}`` or vLLM's older flat form), else the raw text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return text.strip()[:300]
