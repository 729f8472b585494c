"""The versioned prompt renderer.

Rollouts store the exact chat messages a policy saw (even a random policy's
steps get the prompt a model would have seen), and training reads them back
unchanged, so an adapter is trained on the prompts it will be served with. Images
are stored as references to their screenshot hash (``{"type": "image_ref",
"hash": ...}``), never as base64; ``resolve_images`` turns them into OpenAI
``image_url`` parts at request time.

Change the rendering only together with ``PROMPT_VERSION``.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Sequence

PROMPT_VERSION = "halo-prompt-v1"

MAX_OBSERVATION_CHARS = 6000
HISTORY_LENGTH = 3

SYSTEM_PROMPT = (
    "You are a web agent. You see a web page as an accessibility tree whose elements carry ids in "
    "square brackets, and you complete the user's goal one action at a time.\n"
    "Answer with exactly one action, nothing else:\n"
    "  click('ID')\n"
    "  fill('ID', 'text')\n"
    "  select_option('ID', 'option')\n"
    "  press('ID', 'Enter')\n"
    "  scroll(0, 200)\n"
    "  send_msg_to_user('answer')\n"
    "  noop()"
)

SYSTEM_PROMPT_SCREENSHOT = SYSTEM_PROMPT + (
    "\nWith a screenshot you may also act on pixel coordinates:\n"
    "  mouse_click(X, Y)\n"
    "  keyboard_type('text')"
)


def render_messages(
    goal: str,
    url: str,
    observation: str,
    history: Sequence[str] = (),
    screenshot_hash: str | None = None,
    use_screenshot: bool = False,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
    history_length: int = HISTORY_LENGTH,
) -> list[dict[str, Any]]:
    """Chat messages for one step (version ``PROMPT_VERSION``)."""
    obs = observation or ""
    if len(obs) > max_observation_chars:
        obs = obs[:max_observation_chars] + "\n[... truncated]"
    recent = list(history)[-history_length:] if history_length > 0 else []
    hist = "\n".join(f"- {a}" for a in recent) if recent else "(none)"
    text = (
        f"Goal: {goal}\n"
        f"URL: {url}\n"
        f"Previous actions:\n{hist}\n"
        f"Page:\n{obs}\n"
        "Next action:"
    )
    if use_screenshot and screenshot_hash:
        content: Any = [{"type": "image_ref", "hash": screenshot_hash}, {"type": "text", "text": text}]
        system = SYSTEM_PROMPT_SCREENSHOT
    else:
        content = text
        system = SYSTEM_PROMPT
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


def dumps(messages: list[dict[str, Any]]) -> str:
    """The canonical JSON of a prompt (stable key order, so equal prompts hash equal)."""
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def loads(prompt: str) -> list[dict[str, Any]]:
    return json.loads(prompt)


def resolve_images(
    messages: list[dict[str, Any]], load_image: Callable[[str], tuple[bytes, str]]
) -> list[dict[str, Any]]:
    """Replace ``image_ref`` parts by OpenAI ``image_url`` parts with base64 data URLs.

    ``load_image(hash) -> (bytes, format)``.
    """
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image_ref":
                    data, fmt = load_image(p["hash"])
                    b64 = base64.b64encode(data).decode("ascii")
                    parts.append({"type": "image_url", "image_url": {"url": f"data:image/{fmt};base64,{b64}"}})
                else:
                    parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


def text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with image parts dropped and text parts joined (for text-only models)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append({"role": m["role"], "content": content})
    return out
