"""Ask a model again with a stored (possibly edited) prompt, through an OpenAI-compatible endpoint.

The endpoint is ``HALO_VLLM_URL`` (a vLLM server, e.g. ``http://localhost:8000/v1``) or
else ``OPENAI_BASE_URL``; the key is ``HALO_VLLM_API_KEY`` or ``OPENAI_API_KEY``
(vLLM accepts any key when started without one). The key is sent to the endpoint
and never shown.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Callable

from halo_data import prompts

log = logging.getLogger(__name__)


class ReaskError(Exception):
    """The prompt could not be sent or the endpoint refused it; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str = dataclasses.field(repr=False)
    default_model: str | None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Endpoint | None":
        env = os.environ if environ is None else environ
        base_url = env.get("HALO_VLLM_URL") or env.get("OPENAI_BASE_URL")
        if not base_url:
            return None
        key = env.get("HALO_VLLM_API_KEY") or env.get("OPENAI_API_KEY") or "EMPTY"
        model = env.get("HALO_VLLM_MODEL") or env.get("OPENAI_MODEL")
        return cls(base_url=base_url, api_key=key, default_model=model)


def parse_messages(text: str) -> list[dict[str, Any]]:
    """Chat messages from the edited prompt text (a JSON list of {role, content})."""
    try:
        messages = json.loads(text)
    except ValueError as e:
        raise ReaskError(f"the prompt is not valid JSON ({e}): keep it a list of {{\"role\", \"content\"}} messages") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ReaskError("the prompt must be a JSON list of {\"role\": ..., \"content\": ...} messages")
    return messages


def ask(
    endpoint: Endpoint,
    messages: list[dict[str, Any]],
    model: str,
    load_image: Callable[[str], tuple[bytes, str]],
    temperature: float = 0.0,
    max_tokens: int = 512,
    text_only: bool = False,
    timeout: float = 60.0,
) -> str:
    """The model's new output for ``messages`` (image references resolved from the lake)."""
    import openai

    if not model:
        raise ReaskError("no model name: type the served model's name (vLLM: the --served-model-name or a LoRA module)")
    chat = prompts.text_only(messages) if text_only else prompts.resolve_images(messages, load_image)
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, timeout=timeout, max_retries=0)
    try:
        response = client.chat.completions.create(model=model, messages=chat, temperature=temperature, max_tokens=max_tokens)
    except openai.APIStatusError as e:
        raise ReaskError(f"the endpoint {endpoint.base_url} answered {e.status_code}: {_one_line(e.message)}") from None
    except openai.APIError as e:
        raise ReaskError(f"could not reach {endpoint.base_url}: {_one_line(str(e))}") from None
    if not response.choices:
        raise ReaskError(f"the endpoint {endpoint.base_url} returned no choices")
    return response.choices[0].message.content or ""


def _one_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else "no message"
