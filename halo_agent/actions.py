"""Turn a model's text into one BrowserGym action string, with validation and repair.

Models answer in many shapes: a bare call (``click('12')``), the same inside a
code fence or after ``Action:``, a JSON object (``{"action": "click", "bid":
"12"}``), WebArena-style brackets (``click [12]``), with an int where a string
id belongs or curly quotes from a chat UI. ``parse_action`` accepts all of
them and returns the canonical BrowserGym call (``click('12')``) that agisdk's
``HighLevelActionSet`` executes, or ``None`` with a one-line reason. The reason
is stored as the step's ``parse_error``; the episode goes on.

Arguments are read with :mod:`ast` (never evaluated), so model text can never
run as code here.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import re
import warnings
from typing import Any, Iterable, Iterator, Sequence

from halo_agent.types import Element

# Argument kinds of the actions HALO lets a policy take.
BID = "bid"  # a BrowserGym element id (string)
TEXT = "text"  # free text
KEY = "key"  # a key or key combination for Playwright ("Enter", "Control+a")
NUMBER = "number"
BUTTON = "button"  # left | middle | right
OPTIONS = "options"  # a string or a list of strings

# name -> (required argument kinds, optional argument kinds, keyword names in order)
ACTION_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "click": ((BID,), (BUTTON,), ("bid", "button")),
    "dblclick": ((BID,), (BUTTON,), ("bid", "button")),
    "hover": ((BID,), (), ("bid",)),
    "focus": ((BID,), (), ("bid",)),
    "clear": ((BID,), (), ("bid",)),
    "fill": ((BID, TEXT), (), ("bid", "value")),
    "select_option": ((BID, OPTIONS), (), ("bid", "options")),
    "press": ((BID, KEY), (), ("bid", "key_comb")),
    "drag_and_drop": ((BID, BID), (), ("from_bid", "to_bid")),
    "scroll": ((NUMBER, NUMBER), (), ("delta_x", "delta_y")),
    "send_msg_to_user": ((TEXT,), (), ("text",)),
    "report_infeasible": ((TEXT,), (), ("reason",)),
    "noop": ((), (NUMBER,), ("wait_ms",)),
    "goto": ((TEXT,), (), ("url",)),
    "go_back": ((), (), ()),
    "go_forward": ((), (), ()),
    "new_tab": ((), (), ()),
    "tab_close": ((), (), ()),
    "tab_focus": ((NUMBER,), (), ("index",)),
    "mouse_click": ((NUMBER, NUMBER), (BUTTON,), ("x", "y", "button")),
    "mouse_dblclick": ((NUMBER, NUMBER), (BUTTON,), ("x", "y", "button")),
    "mouse_move": ((NUMBER, NUMBER), (), ("x", "y")),
    "mouse_down": ((NUMBER, NUMBER), (BUTTON,), ("x", "y", "button")),
    "mouse_up": ((NUMBER, NUMBER), (BUTTON,), ("x", "y", "button")),
    "mouse_drag_and_drop": ((NUMBER, NUMBER, NUMBER, NUMBER), (), ("from_x", "from_y", "to_x", "to_y")),
    "keyboard_type": ((TEXT,), (), ("text",)),
    "keyboard_insert_text": ((TEXT,), (), ("text",)),
    "keyboard_press": ((KEY,), (), ("key",)),
    "keyboard_down": ((KEY,), (), ("key",)),
    "keyboard_up": ((KEY,), (), ("key",)),
}

# Actions on pixel coordinates: only valid where the environment was built with
# BrowserGym's "coord" action subset (screenshot mode).
COORDINATE_ACTIONS = frozenset(
    {"mouse_click", "mouse_dblclick", "mouse_move", "mouse_down", "mouse_up", "mouse_drag_and_drop"}
)

# Names models use for the same actions (other agent frameworks, tool-calling habits).
ACTION_ALIASES: dict[str, str] = {
    "click_element": "click",
    "left_click": "click",
    "double_click": "dblclick",
    "input": "fill",
    "input_text": "fill",
    "type_text": "fill",
    "select": "select_option",
    "select_dropdown_option": "select_option",
    "key_press": "press",
    "answer": "send_msg_to_user",
    "send_msg": "send_msg_to_user",
    "send_message": "send_msg_to_user",
    "send_message_to_user": "send_msg_to_user",
    "respond": "send_msg_to_user",
    "reply": "send_msg_to_user",
    "stop": "send_msg_to_user",
    "finish": "send_msg_to_user",
    "infeasible": "report_infeasible",
    "wait": "noop",
    "no_op": "noop",
    "none": "noop",
    "navigate": "goto",
    "open_url": "goto",
    "back": "go_back",
    "forward": "go_forward",
    "hotkey": "keyboard_press",
    "key": "keyboard_press",
    "type": "fill",  # "type" without an element id becomes keyboard_type (see _normalise_call)
}

# Qwen3-VL's computer-use clicks on a coordinate: (BrowserGym action, mouse button).
COMPUTER_USE_CLICKS: dict[str, tuple[str, str | None]] = {
    "left_click": ("mouse_click", None),
    "right_click": ("mouse_click", "right"),
    "middle_click": ("mouse_click", "middle"),
    "double_click": ("mouse_dblclick", None),
}
# Tool names Qwen-VL models wrap computer-use actions in: {"name": "computer_use", "arguments": {"action": ...}}.
COMPUTER_USE_TOOLS = ("computer_use", "computer")

_SCROLL_DIRECTIONS = {"down": (0, 300), "up": (0, -300), "right": (300, 0), "left": (-300, 0)}
_BUTTONS = ("left", "middle", "right")
_QUOTE_TRANSLATION = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.DOTALL)
_ACTION_LABEL = re.compile(r"(?im)^\s*(?:final\s+)?(?:next\s+)?action\s*[:=]\s*")
_BRACKET_BID = re.compile(r"^\s*\[?\s*(?:bid\s*=\s*)?['\"]?([A-Za-z]*\d+[A-Za-z0-9_-]*)['\"]?\s*\]?\s*$")
_AXTREE_BID = re.compile(r"\[([A-Za-z]*\d+[A-Za-z0-9_-]*)\]")
# A whole-line Python comment (a labelled choice's label, a markdown heading): not where the action is.
_COMMENT_LINE = re.compile(r"(?m)^[ \t]*#[^\n]*(?:\n|$)")
_WEBARENA = re.compile(r"^\s*(click|hover|type|press|scroll|stop|goto|go_back|go_forward)\s*\[", re.IGNORECASE)


class ActionParseError(ValueError):
    """The model output holds no valid action; the message is stored as the step's parse_error."""


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    action: str  # canonical BrowserGym call, e.g. "fill('5', 'hello')"
    name: str
    args: tuple[Any, ...]
    repairs: tuple[str, ...] = ()  # what was fixed on the way, for debugging prompts


def parse_action(
    text: str | None,
    elements: Sequence[Element] | None = None,
    valid_bids: Iterable[str] | None = None,
    allow_coordinates: bool = False,
    viewport: tuple[int, int] | None = None,
) -> tuple[str | None, str | None]:
    """Parse model output into ``(action, parse_error)``; exactly one of the two is None.

    ``elements`` / ``valid_bids``: when given, element ids must exist on the page
    (the union of both is accepted). ``allow_coordinates``: accept mouse actions
    on pixel coordinates (screenshot mode). ``viewport`` (width, height): reject
    coordinates outside it.
    """
    try:
        parsed = parse_action_detailed(text, elements, valid_bids, allow_coordinates, viewport)
    except ActionParseError as e:
        return None, str(e)
    return parsed.action, None


def parse_action_detailed(
    text: str | None,
    elements: Sequence[Element] | None = None,
    valid_bids: Iterable[str] | None = None,
    allow_coordinates: bool = False,
    viewport: tuple[int, int] | None = None,
) -> ParsedAction:
    """Like :func:`parse_action` but returns the parsed call and its repairs, or raises ActionParseError."""
    if text is None or not str(text).strip():
        raise ActionParseError("empty model output")
    repairs: list[str] = []
    call = _extract_call(str(text), repairs)
    name, args = _normalise_call(call[0], call[1], call[2], repairs)
    known_bids = _known_bids(elements, valid_bids)
    args = _validate(name, args, known_bids, elements, allow_coordinates, viewport, repairs)
    return ParsedAction(action=format_action(name, args), name=name, args=tuple(args), repairs=tuple(repairs))


def format_action(name: str, args: Sequence[Any]) -> str:
    """The canonical BrowserGym call text; BrowserGym's own parser reads Python literals."""
    return f"{name}({', '.join(_literal(a) for a in args)})"


def compact_elements(elements: Sequence[Element]) -> list[Element]:
    """The elements without those that wrap a same-named element (a tab and its link are one thing to act on):
    what the elements observation lists and what constrained decoding offers."""
    return [e for e in elements if not e.wraps]


def page_actions(elements: Sequence[Element], labels: bool = False) -> list[str]:
    """The actions a page offers as a closed list (for decoding constrained to them), in page order.

    A click on every clickable or fillable element (a fill's text cannot be listed) and one
    ``select_option`` per option of a select; ``noop()`` on a page that offers nothing. An element that
    wraps a same-named one (``Element.wraps``) is offered once, as the inner element.

    ``labels``: each action comes after a comment line naming its element as the page shows it,
    ``# 'Tab #2'\nclick('21')`` (see :func:`labelled_choice`). The label comes first, so a model
    scoring the choice says which element it means (words it can copy from the goal) before the id.
    """
    actions: list[str] = []
    for element in compact_elements(elements):
        if element.kind == "select" and element.options:
            calls = [format_action("select_option", [element.bid, option]) for option in element.options]
        else:
            calls = [format_action("click", [element.bid])]
        actions.extend(labelled_choice(call, choice_label(element)) if labels else call for call in calls)
    return list(dict.fromkeys(actions)) or ["noop()"]


CHOICE_LABEL_CHARS = 40  # the most characters of an element's name a labelled choice carries


def choice_label(element: Element) -> str:
    """How a labelled choice names its element: its accessible name quoted as the page lines show it
    (``'Tab #2'``), else its role and description (``image (trash; in 'Hazel')``, ``textbox``); one line, at most
    CHOICE_LABEL_CHARS characters of the name or the description."""
    name = " ".join(str(element.name or "").split())[:CHOICE_LABEL_CHARS]
    if name:
        return f"'{name}'"
    role = " ".join(str(element.role or "").split()) or "element"
    description = " ".join(str(element.description or "").split())[:CHOICE_LABEL_CHARS]
    return f"{role} ({description})" if description else role


def labelled_choice(action: str, label: str) -> str:
    """``# LABEL`` then the action on the next line: valid Python, so valid BrowserGym code as it stands;
    :func:`parse_action` reads the action and drops the comment (the canonical action is what runs)."""
    return f"# {' '.join(label.split())}\n{action}"


# An elements observation's line: ``[bid] role 'name'``, and ``(description)`` after an empty name.
_ELEMENT_LINE = re.compile(r"^\s*\[([^\]]+)\] (\S+) '(.*)'(?: \((.*)\))?\s*$")


def labelled_answer(answer: str, page: str) -> str | None:
    """The labelled-choice form of a stored answer (``click('21')`` -> ``# 'Tab #2'\nclick('21')``), naming its
    element as the page the step saw shows it (``[21] link 'Tab #2'`` lines); None where the answer is no
    element action or its element is not on that page. Turns steps stored without labels (the random
    policy's) into examples of the labelled answer format."""
    try:
        parsed = parse_action_detailed(answer)
    except ActionParseError:
        return None
    if not parsed.args or ACTION_SIGNATURES[parsed.name][0][:1] != (BID,):
        return None
    for element in element_lines(page):
        if element.bid == parsed.args[0]:
            return labelled_choice(parsed.action, choice_label(element))
    return None


def element_lines(page: str) -> list[Element]:
    """The elements an elements observation's page text lists (``[bid] role 'name'`` lines, with a description
    after an empty name), in order; other lines are skipped. Their kind is not in the text: each is a click."""
    out = []
    for line in (page or "").splitlines():
        m = _ELEMENT_LINE.match(line)
        if m:
            out.append(Element(m.group(1), m.group(2), m.group(3), "click", description=m.group(4) or ""))
    return out


def bids_in_axtree(axtree: str) -> set[str]:
    """Element ids shown in an AXTree text (``[12] button 'Send'``)."""
    return set(_AXTREE_BID.findall(axtree or ""))


# ---------------------------------------------------------------- extraction


def _extract_call(text: str, repairs: list[str]) -> tuple[str, list[Any], dict[str, Any]]:
    """Find the one action in ``text``: (name, positional args, keyword args)."""
    cleaned = text.translate(_QUOTE_TRANSLATION)
    if cleaned != text:
        repairs.append("replaced typographic quotes")
    cleaned = re.sub(r"<think>.*?</think>", "", cleaned, flags=re.DOTALL | re.IGNORECASE)
    uncommented = _COMMENT_LINE.sub("", cleaned)
    if uncommented.strip() and uncommented != cleaned:
        repairs.append("dropped comment lines")
        cleaned = uncommented

    candidates: list[str] = []
    for lang, body in _FENCE.findall(cleaned):
        candidates.append(body.strip())
    # An unterminated fence (the model hit max_tokens) still holds the action.
    if not candidates and "```" in cleaned:
        candidates.append(cleaned.split("```", 1)[1].split("\n", 1)[-1].strip())
    labelled = _ACTION_LABEL.split(cleaned)
    if len(labelled) > 1:
        candidates.append(labelled[-1].strip())
    candidates.append(cleaned.strip())

    errors: list[str] = []
    for candidate in candidates:
        if not candidate:
            continue
        for finder in (_from_json, _from_python_call, _from_webarena):
            try:
                found = finder(candidate, repairs)
            except ActionParseError as e:
                errors.append(str(e))
                continue
            if found is not None:
                return found
    if errors:
        raise ActionParseError(errors[0])
    unknown = re.search(r"(?m)^\s*([A-Za-z_]\w*)\s*\(", "\n".join(candidates))
    if unknown:
        raise ActionParseError(f"unknown action {unknown.group(1)!r}")
    snippet = " ".join(text.split())[:80]
    raise ActionParseError(f"no action found in model output: {snippet!r}")


def _from_json(candidate: str, repairs: list[str]) -> tuple[str, list[Any], dict[str, Any]] | None:
    start = candidate.find("{")
    if start < 0:
        return None
    obj = None
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", candidate[start:]):
        try:
            obj, _ = decoder.raw_decode(candidate[start + match.start():])
            break
        except json.JSONDecodeError:
            continue
    if obj is None:
        try:  # single-quoted pseudo-JSON: {'action': 'click', 'bid': '12'}
            end = candidate.rfind("}")
            obj = _quiet_literal(candidate[start:end + 1]) if end > start else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            obj = None
    if not isinstance(obj, dict):
        return None
    # Wrappers: {"action": {...}}, {"function": {"name":..., "arguments":...}}, tool calls.
    for wrapper in ("function", "tool_call", "function_call"):
        if isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    if isinstance(obj.get("action"), dict):
        obj = obj["action"]
    if obj.get("name") in COMPUTER_USE_TOOLS and isinstance(obj.get("arguments"), (dict, str)):
        arguments = obj["arguments"]
        obj = json.loads(arguments) if isinstance(arguments, str) else arguments
        repairs.append("read a computer-use tool call")
    name = obj.get("action") or obj.get("name") or obj.get("action_type") or obj.get("type") or obj.get("function")
    if not isinstance(name, str) or not name.strip():
        raise ActionParseError("JSON action without an 'action' name")
    name = name.strip()
    # {"action": "click('12')"}: the value is itself a call.
    if "(" in name:
        return _from_python_call(name, repairs)
    fields = obj.get("arguments", obj.get("args", obj.get("parameters", obj.get("params"))))
    if isinstance(fields, str):
        try:
            fields = json.loads(fields)
        except json.JSONDecodeError:
            raise ActionParseError(f"JSON action {name!r} has unreadable arguments") from None
    if isinstance(fields, list):
        repairs.append("read a JSON action")
        return name, list(fields), {}
    merged = dict(obj)
    if isinstance(fields, dict):
        merged.update(fields)
    repairs.append("read a JSON action")
    return name, [], _json_keywords(merged)


def _json_keywords(fields: dict[str, Any]) -> dict[str, Any]:
    """Map the field names JSON actions use onto BrowserGym's keyword names."""
    synonyms = {
        "bid": ("bid", "element_id", "element", "id", "target", "ref", "index"),
        "value": ("value", "text", "content", "input", "keys"),
        "text": ("text", "message", "answer", "content", "value", "response"),
        "reason": ("reason", "text", "message"),
        "options": ("options", "option", "value", "values", "label"),
        "key_comb": ("key_comb", "key", "keys", "combination"),
        "key": ("key", "keys", "key_comb"),
        "url": ("url", "href", "link"),
        "x": ("x",),
        "y": ("y",),
        "delta_x": ("delta_x", "dx"),
        "delta_y": ("delta_y", "dy"),
        "direction": ("direction",),
        "amount": ("amount", "pixels"),
        "button": ("button",),
        "index": ("index", "tab"),
        "coordinate": ("coordinate", "coordinates", "point", "position"),
    }
    out: dict[str, Any] = {}
    for canonical, names in synonyms.items():
        for n in names:
            if n in fields and fields[n] is not None:
                out[canonical] = fields[n]
                break
    return out


def _from_python_call(candidate: str, repairs: list[str]) -> tuple[str, list[Any], dict[str, Any]] | None:
    names = sorted(set(ACTION_SIGNATURES) | set(ACTION_ALIASES), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")\s*\(", re.IGNORECASE)
    first_error: ActionParseError | None = None
    for match in pattern.finditer(candidate):
        name = match.group(1)
        open_at = match.end() - 1
        inner, closed = _balanced(candidate, open_at)
        if not closed:
            repairs.append("closed an unterminated call")
        try:
            args, kwargs = _read_arguments(name, inner, repairs)
        except ActionParseError as e:
            first_error = first_error or e
            continue
        return name, args, kwargs
    if first_error is not None:
        raise first_error
    return None


def _balanced(text: str, open_at: int) -> tuple[str, bool]:
    """The text between the parenthesis at ``open_at`` and its match, skipping quoted strings."""
    depth, quote, escaped = 0, None, False
    for i in range(open_at, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i], True
    return text[open_at + 1:].rstrip().rstrip(";"), False


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Parsing a model's text: its stray backslashes ("\\(") are not HALO's warnings to raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _quiet_literal(text: str) -> Any:
    with _quiet():
        return ast.literal_eval(text)


def _read_arguments(name: str, inner: str, repairs: list[str]) -> tuple[list[Any], dict[str, Any]]:
    try:
        with _quiet():
            node = ast.parse(f"f({inner})", mode="eval").body
        assert isinstance(node, ast.Call)
        args = [_literal_value(a) for a in node.args]
        kwargs = {k.arg: _literal_value(k.value) for k in node.keywords if k.arg}
        return args, kwargs
    except (SyntaxError, ValueError, AssertionError, RecursionError, MemoryError):
        pass
    # The usual failure: an unescaped quote inside the text, fill('5', 'it's here').
    text_action = ACTION_ALIASES.get(name.lower(), name.lower())
    sig = ACTION_SIGNATURES.get(text_action)
    if sig and sig[0] and sig[0][-1] == TEXT:
        inner = inner.rstrip()
        inner = inner[:-1] if inner.endswith(")") else inner
        m = re.match(r"""^\s*(?:(?:bid\s*=\s*)?['"]?([\w-]+)['"]?\s*,\s*)?(?:\w+\s*=\s*)?(['"])(.*)\2\s*$""", inner, re.DOTALL)
        if m and (m.group(1) is not None or len(sig[0]) == 1):
            repairs.append("repaired quotes inside a text argument")
            args = [m.group(1)] if m.group(1) is not None else []
            return args + [m.group(3)], {}
    raise ActionParseError(f"could not read the arguments of {name}({inner[:60]})")


def _literal_value(node: ast.AST) -> Any:
    # Bare names are how models sometimes write ids or keys: click(a12), press(Enter).
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal_value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        # "Control" + "a" style key combos
        return f"{_literal_value(node.left)}+{_literal_value(node.right)}"
    return ast.literal_eval(node)


def _from_webarena(candidate: str, repairs: list[str]) -> tuple[str, list[Any], dict[str, Any]] | None:
    m = _WEBARENA.match(candidate)
    if not m:
        return None
    name = m.group(1).lower()
    parts = re.findall(r"\[(.*?)\]", candidate[m.end() - 1:].split("\n", 1)[0])
    repairs.append("read a WebArena-style action")
    if name == "scroll":
        return "scroll", [], {"direction": parts[0].strip().lower() if parts else "down"}
    if name == "type":
        args: list[Any] = parts[:2]
        return "fill", args, {}
    if name == "press":
        return "keyboard_press", parts[:1], {}
    if name == "stop":
        return "send_msg_to_user", parts[:1] or [""], {}
    return name, parts[:1] if name in ("click", "hover", "goto") else [], {}


# ---------------------------------------------------------------- normalisation


def _normalise_call(
    raw_name: str, args: list[Any], kwargs: dict[str, Any], repairs: list[str]
) -> tuple[str, list[Any]]:
    name = raw_name.strip().lower()
    if name in COMPUTER_USE_CLICKS and ("coordinate" in kwargs or "x" in kwargs):
        name, button = COMPUTER_USE_CLICKS[name]
        if button is not None:
            kwargs["button"] = button
    for key in ("key", "key_comb"):
        if isinstance(kwargs.get(key), list):  # computer-use "keys": ["Control", "a"] is one combination
            kwargs[key] = "+".join(str(k) for k in kwargs[key])
    if name == "scroll" and "amount" in kwargs and "direction" not in kwargs and not args:
        # computer-use "pixels": positive scrolls up, negative down; BrowserGym's delta_y grows downwards
        args = [0, -int(kwargs.pop("amount"))]
        kwargs.pop("coordinate", None)
    if name in ACTION_ALIASES:
        alias = ACTION_ALIASES[name]
        if name == "type" and not _has_bid(args, kwargs, 2):
            alias = "keyboard_type"
        if name in ("click", "left_click") and ("x" in kwargs or "coordinate" in kwargs):
            alias = "mouse_click"
        repairs.append(f"renamed {name} to {alias}")
        name = alias
    if name == "click" and ("x" in kwargs or "coordinate" in kwargs) and "bid" not in kwargs:
        name = "mouse_click"
    if name == "press" and not _has_bid(args, kwargs, 2):
        name = "keyboard_press"
        repairs.append("press without an element id became keyboard_press")
    if name == "scroll" and ("direction" in kwargs or (len(args) == 1 and isinstance(args[0], str))):
        direction = str(kwargs.pop("direction", args[0] if args else "down")).strip().lower()
        if direction not in _SCROLL_DIRECTIONS:
            raise ActionParseError(f"unknown scroll direction {direction!r}")
        dx, dy = _SCROLL_DIRECTIONS[direction]
        amount = kwargs.pop("amount", None)
        if isinstance(amount, (int, float)) and amount > 0:
            dx, dy = (int(amount) if dx > 0 else -int(amount) if dx < 0 else 0,
                      int(amount) if dy > 0 else -int(amount) if dy < 0 else 0)
        args, kwargs = [dx, dy], {}
        repairs.append("turned a scroll direction into pixel deltas")
    if "coordinate" in kwargs:
        coordinate = kwargs.pop("coordinate")
        if isinstance(coordinate, (list, tuple)) and len(coordinate) == 2:
            kwargs["x"], kwargs["y"] = coordinate
    if name not in ACTION_SIGNATURES:
        raise ActionParseError(f"unknown action {raw_name!r}")

    required, optional, keywords = ACTION_SIGNATURES[name]
    kinds = required + optional
    values = list(args)
    if len(values) > len(kinds):
        raise ActionParseError(f"{name} takes at most {len(kinds)} arguments, got {len(values)}")
    for i in range(len(values), len(kinds)):
        key = keywords[i]
        if key in kwargs:
            values.append(kwargs.pop(key))
        elif key in ("from_bid", "to_bid") and "bid" in kwargs and i == 0:
            values.append(kwargs.pop("bid"))
        else:
            break
    if len(values) < len(required):
        missing = ", ".join(keywords[len(values):len(required)])
        raise ActionParseError(f"{name} is missing {missing}")
    return name, values


def _has_bid(args: list[Any], kwargs: dict[str, Any], n_with_bid: int) -> bool:
    return "bid" in kwargs or len(args) >= n_with_bid


# ---------------------------------------------------------------- validation


def _known_bids(elements: Sequence[Element] | None, valid_bids: Iterable[str] | None) -> set[str] | None:
    if elements is None and valid_bids is None:
        return None
    known = {str(b) for b in (valid_bids or ())}
    known.update(e.bid for e in (elements or ()))
    return known


def _validate(
    name: str,
    args: list[Any],
    known_bids: set[str] | None,
    elements: Sequence[Element] | None,
    allow_coordinates: bool,
    viewport: tuple[int, int] | None,
    repairs: list[str],
) -> list[Any]:
    required, optional, keywords = ACTION_SIGNATURES[name]
    kinds = required + optional
    if name in COORDINATE_ACTIONS and not allow_coordinates:
        raise ActionParseError(f"{name} acts on pixel coordinates, which need screenshot mode; use an element id")
    out: list[Any] = []
    for value, kind, key in zip(args, kinds, keywords):
        if kind == BID:
            value = _clean_bid(value, repairs)
            if known_bids is not None and value not in known_bids:
                raise ActionParseError(f"{name}: element id {value!r} is not on the page")
        elif kind in (TEXT, KEY):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
                repairs.append(f"turned the number in {key} into text")
            if not isinstance(value, str):
                raise ActionParseError(f"{name}: {key} must be text, got {type(value).__name__}")
            if kind == KEY and not value.strip():
                raise ActionParseError(f"{name}: empty key")
        elif kind == NUMBER:
            value = _number(name, key, value)
        elif kind == BUTTON:
            value = str(value).lower()
            if value not in _BUTTONS:
                raise ActionParseError(f"{name}: button must be one of {', '.join(_BUTTONS)}")
        elif kind == OPTIONS:
            value = _options(name, value, out[0] if out else None, elements, repairs)
        out.append(value)
    if name in COORDINATE_ACTIONS and viewport is not None:
        width, height = viewport
        points = list(zip(out[0::2], out[1::2]))[:2 if name == "mouse_drag_and_drop" else 1]
        for x, y in points:
            if not (0 <= x <= width and 0 <= y <= height):
                raise ActionParseError(f"{name}: ({x}, {y}) lies outside the {width}x{height} viewport")
    # Optional arguments equal to BrowserGym's defaults are dropped so equal actions compare equal.
    while len(out) > len(required) and out[-1] in ("left",):
        out.pop()
    if name == "noop" and out and out[0] == 1000:
        out.pop()
    return out


def _clean_bid(value: Any, repairs: list[str]) -> str:
    if isinstance(value, bool) or value is None:
        raise ActionParseError(f"invalid element id {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        repairs.append("quoted a numeric element id")
        return str(value)
    if not isinstance(value, str):
        raise ActionParseError(f"invalid element id {value!r}")
    m = _BRACKET_BID.match(value)
    if not m:
        raise ActionParseError(f"invalid element id {value!r}")
    if m.group(1) != value:
        repairs.append("stripped brackets from an element id")
    return m.group(1)


def _number(name: str, key: str, value: Any) -> int | float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ActionParseError(f"{name}: {key} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ActionParseError(f"{name}: {key} must be a number, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _options(name: str, value: Any, bid: str | None, elements: Sequence[Element] | None, repairs: list[str]) -> Any:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values):
        raise ActionParseError(f"{name}: options must be text or a list of text")
    values = [str(v) for v in values]
    element = next((e for e in elements or () if e.bid == bid), None)
    if element is not None and element.options:
        fixed = []
        for v in values:
            if v in element.options:
                fixed.append(v)
                continue
            match = [o for o in element.options if o.strip().lower() == v.strip().lower()]
            if not match:
                raise ActionParseError(
                    f"{name}: {v!r} is not an option of element {bid!r} ({', '.join(map(repr, element.options[:8]))})"
                )
            repairs.append("matched an option ignoring case")
            fixed.append(match[0])
        values = fixed
    return values if isinstance(value, list) else values[0]


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def parse_for_observation(
    text: str | None, obs: Any, allow_coordinates: bool = False, viewport: tuple[int, int] | None = None
) -> tuple[str | None, str | None]:
    """Parse model output for the page of ``obs`` (a ``halo_agent.types.Observation``).

    Element ids are checked against the elements the environment listed and every
    id shown in the AXTree the model saw. An environment whose actions are shell commands
    (``obs.extra["action_format"] == "bash"``, the os environment) parses its own format.
    """
    if (getattr(obs, "extra", None) or {}).get("action_format") == "bash":
        from halo_agent.envs.os_env import parse_os_action

        return parse_os_action(text)
    return parse_action(
        text,
        elements=list(obs.elements or ()),
        valid_bids=bids_in_axtree(obs.axtree),
        allow_coordinates=allow_coordinates,
        viewport=viewport,
    )


def png_size(png: bytes | None) -> tuple[int, int] | None:
    """(width, height) from a PNG header, without decoding the image."""
    if not png or len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def rescale_coordinates(action: str, scale: float, viewport: tuple[int, int]) -> str:
    """Map a coordinate action from a model's relative grid (Qwen3-VL answers on 0..1000) to viewport pixels."""
    parsed = parse_action_detailed(action, allow_coordinates=True)
    if parsed.name not in COORDINATE_ACTIONS:
        return parsed.action
    width, height = viewport
    args = list(parsed.args)
    n_numbers = 4 if parsed.name == "mouse_drag_and_drop" else 2
    for i in range(n_numbers):
        factor = (width if i % 2 == 0 else height) / scale
        args[i] = int(round(float(args[i]) * factor))
    return format_action(parsed.name, args)
