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
from typing import Any, Callable, Iterable, Sequence

PROMPT_VERSION = "halo-prompt-v1"
# What the "Page:" section shows: the whole AXTree (default), or only the elements a policy may act on (elements-v2:
# as learning-v2 saw them, unnamed elements without their descriptions).
OBSERVATION_FORMATS = ("axtree", "elements", "elements-v2")
# v2-elements: an element wrapping a same-named one (a tab and its link) is listed once, as the inner one, and
# the goal comes after the page and a local file's URL is its file name (render_messages' goal_last).
# v3-elements: an element without an accessible name carries a description (elements_text), so an email's trash
# icon is told from its star and from another email's.
GOAL_LAST = {"axtree": False, "elements": True, "elements-v2": True}
PROMPT_VERSIONS = {"axtree": PROMPT_VERSION, "elements": "halo-prompt-v3-elements", "elements-v2": "halo-prompt-v2-elements"}

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
    plan: str | None = None,
    goal_last: bool = False,
) -> list[dict[str, Any]]:
    """Chat messages for one step (version ``PROMPT_VERSION``); ``plan`` is a manager's plan or sub-goal.

    ``goal_last`` (the elements format, ``PROMPT_VERSIONS['elements']``): the goal comes after the page, right
    before the answer, where a small model reads it last instead of across the whole page; a local file's URL
    is shown as its file name (see :func:`compact_url`).
    """
    obs = observation or ""
    if len(obs) > max_observation_chars:
        obs = obs[:max_observation_chars] + "\n[... truncated]"
    recent = list(history)[-history_length:] if history_length > 0 else []
    hist = "\n".join(f"- {a}" for a in recent) if recent else "(none)"
    goal_line = f"Goal: {goal}\n" + (f"Plan: {plan}\n" if plan else "")
    text = (
        ("" if goal_last else goal_line)
        + f"URL: {compact_url(url) if goal_last else url}\n"
        f"Previous actions:\n{hist}\n"
        f"Page:\n{obs}\n"
        + (goal_line if goal_last else "")
        + "Next action:"
    )
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    return with_screenshot(messages, screenshot_hash) if use_screenshot and screenshot_hash else messages


def compact_url(url: str) -> str:
    """A ``file://`` URL as its file name: where a task's page is installed says nothing about the page, and its
    path's digits (``python3.11``) would read like the page's; other URLs as they are."""
    if url.startswith("file://"):
        return url.rstrip("/").rsplit("/", 1)[-1]
    return url


def with_screenshot(messages: list[dict[str, Any]], screenshot_hash: str) -> list[dict[str, Any]]:
    """A text prompt as screenshot mode renders it: the screenshot system prompt, and the image
    (by hash) before the text of the last user message, where the serving engine shows it.

    A prompt that already carries an image is returned as it is. This is how a step collected by
    a text or random policy becomes a VLM training row without collecting again.
    """
    if has_image(messages):
        return messages
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and out[0].get("content") == SYSTEM_PROMPT:
        out[0]["content"] = SYSTEM_PROMPT_SCREENSHOT
    last_user = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last_user is None:
        raise ValueError("a prompt without a user message has nowhere to show a screenshot")
    text = out[last_user].get("content") or ""
    out[last_user]["content"] = [{"type": "image_ref", "hash": screenshot_hash}, {"type": "text", "text": text}]
    return out


def has_image(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image_ref" for p in m["content"]) for m in messages)


def image_hashes(messages: list[dict[str, Any]]) -> list[str]:
    """The screenshot hashes a prompt refers to, in order."""
    return [p["hash"] for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p.get("type") == "image_ref"]


MANAGER_SYSTEM_PROMPT = (
    "You are the manager of a web agent. A worker acts on the page one action at a time; you give it "
    "direction. Read the goal, the page and what happened so far, and answer in exactly this form:\n"
    "PLAN: <one or two sentences: how to reach the goal from here>\n"
    "SUBGOAL: <the worker's next sub-goal, one short sentence>\n"
    "Optionally a third line MACRO: <name> to run one of these skills now: {macros}."
)


def render_manager_messages(
    goal: str,
    url: str,
    observation: str,
    history: Sequence[str] = (),
    reason: str = "start",
    macros: Sequence[str] = (),
    question: str | None = None,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
) -> list[dict[str, Any]]:
    """Chat messages for a manager call (version ``PROMPT_VERSION``): why it is called, and the page."""
    obs = observation or ""
    if len(obs) > max_observation_chars:
        obs = obs[:max_observation_chars] + "\n[... truncated]"
    hist = "\n".join(f"- {a}" for a in history) if history else "(none)"
    text = (
        f"Goal: {goal}\n"
        f"Called because: {reason}\n"
        + (f"The worker asks: {question}\n" if question else "")
        + f"URL: {url}\n"
        f"Actions so far:\n{hist}\n"
        f"Page:\n{obs}\n"
        "Your answer:"
    )
    system = MANAGER_SYSTEM_PROMPT.format(macros=", ".join(macros) if macros else "(none)")
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def elements_text(elements: Iterable[tuple[str, ...]]) -> str:
    """The page as the elements a policy may act on, one ``[bid] role 'name'`` line each (AXTree lines, nothing else).

    ``elements``: (bid, role, accessible name) or (bid, role, accessible name, description) in page order. A
    description, given to an element without a name, follows in parentheses: ``[26] image '' (trash; in 'Hazel
    Nibh nisl.')``, what its markup calls it and the text it holds or sits in. A small model reads ~10 tokens an
    element instead of the whole tree's text, URLs and inline boxes.
    """
    lines = []
    for bid, role, name, *description in elements:
        lines.append(f"[{bid}] {role} '{name}'" + (f" ({description[0]})" if description and description[0] else ""))
    return "\n".join(lines)


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


def text_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The one rendering of a prompt for a text-only model, the same in HALO's chat server and in the trainers:
    ``{"role", "content"}`` with image parts (``image_ref``, ``image_url``, ...) dropped, text parts joined by a
    line break and no content as ``""``. A server that showed an image as a placeholder the trainer does not
    see would sample from a prompt the trainer never scores."""
    return [{"role": m.get("role", "user"), "content": m["content"] or ""} for m in text_only(list(messages))]


def text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with image parts dropped and text parts joined (for text-only models)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append({"role": m.get("role", "user"), "content": content})
    return out
