"""Macros: named multi-step skills, each a small action program with a precondition on the observation.

    plan = MACROS["log_in"].plan(obs)        # MacroPlan(name, actions) or MacroRefused("why not")
    plan.actions                             # ("fill('16', 'juan')", "fill('19', 'Jc')", "click('20')")

A precondition reads the page as the policy sees it (``Observation.elements`` and
the AXTree) and the goal's fields (quoted values, ``label: value`` pairs, e-mail
addresses); a macro that does not fit the page refuses with a reason instead of
acting. The orchestrator records each expanded step with ``action_source =
'macro'`` and the macro's name.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

from halo_agent.types import Element, Observation

_QUOTED = re.compile(r"([A-Za-z][\w ]{0,40}?)?\s*(?:is|:|=|as|of)?\s*[\"“]([^\"”]+)[\"”]")
_PAIR = re.compile(r"\b([A-Za-z][\w]{1,30})\s*:\s*([^,;\n\"“]+?)\s*(?=[,;\n]|\.\s|$)")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_LINE = re.compile(r"^\s*\[([^\]]+)\]\s*([\w ]+?)\s*'(.*?)'")
_TEXT_LINE = re.compile(r"^\s*(?:\[[^\]]+\]\s*)?(?:StaticText|LabelText)\s*'(.+?)'")

USER_LABEL = re.compile(r"user|e-?mail|login", re.IGNORECASE)
PASSWORD_LABEL = re.compile(r"pass", re.IGNORECASE)
LOGIN_BUTTON = re.compile(r"log\s*in|sign\s*in|submit", re.IGNORECASE)
SEARCH_LABEL = re.compile(r"search", re.IGNORECASE)
SUBMIT_BUTTON = re.compile(r"^(submit|send|save|ok|done|continue|next|apply)\b", re.IGNORECASE)
CART_BUTTON = re.compile(r"add\s+to\s+(cart|bag|basket)", re.IGNORECASE)
DIALOG_LINE = re.compile(r"\]\s*(dialog|alertdialog)\b|cookie|consent", re.IGNORECASE)
CLOSE_BUTTON = re.compile(r"^\s*(close|dismiss|accept( all)?|got it|no,? thanks|ok|x|×|✕)\s*$", re.IGNORECASE)


class MacroRefused(ValueError):
    """The macro's precondition does not hold on this page; the message says which part."""


@dataclasses.dataclass(frozen=True)
class MacroPlan:
    name: str
    actions: tuple[str, ...]


def goal_fields(goal: str) -> dict[str, str]:
    """Field label (lower case, its last word) -> value, from the goal's quoted values, ``label: value`` pairs and e-mails."""
    fields: dict[str, str] = {}
    for m in _PAIR.finditer(goal or ""):
        fields.setdefault(m.group(1).lower(), m.group(2).strip())
    for m in _QUOTED.finditer(goal or ""):
        label = (m.group(1) or "").split()
        fields.setdefault(label[-1].lower() if label else "text", m.group(2))
    emails = _EMAIL.findall(goal or "")
    if emails:
        fields.setdefault("email", emails[0])
        fields.setdefault("to", emails[0])
    return fields


def field_labels(obs: Observation) -> dict[str, str]:
    """Element id -> label of each fillable element: its own name, else the text just before it in the AXTree."""
    fillable = {e.bid: e for e in obs.elements if e.kind == "fill"}
    labels: dict[str, str] = {}
    last_text = ""
    for line in (obs.axtree or "").splitlines():
        text = _TEXT_LINE.match(line)
        if text and text.group(1).strip():
            last_text = text.group(1).strip()
            continue
        m = _LINE.match(line)
        if m and m.group(1) in fillable:
            labels[m.group(1)] = fillable[m.group(1)].name.strip() or last_text
            last_text = ""
    for bid, element in fillable.items():
        labels.setdefault(bid, element.name.strip())
    return labels


def _button(obs: Observation, pattern: re.Pattern) -> Element | None:
    return next((e for e in obs.elements if e.kind == "click" and pattern.search(e.name or "")), None)


def _value_for(label: str, fields: dict[str, str]) -> str | None:
    words = [w for w in re.split(r"\W+", label.lower()) if w]
    for word in reversed(words):
        if word in fields:
            return fields[word]
    return None


def _fill(bid: str, value: str) -> str:
    return f"fill({bid!r}, {value!r})"


# ------------------------------------------------------------------------------------- the macros
def log_in(obs: Observation) -> tuple[str, ...]:
    labels = field_labels(obs)
    user = next((b for b, label in labels.items() if USER_LABEL.search(label)), None)
    password = next((b for b, label in labels.items() if PASSWORD_LABEL.search(label)), None)
    button = _button(obs, LOGIN_BUTTON)
    if user is None or password is None or button is None:
        raise MacroRefused("log_in needs a user name field, a password field and a log-in button")
    fields = goal_fields(obs.goal)
    name = fields.get("username") or fields.get("user") or fields.get("email")
    secret = fields.get("password")
    if not name or not secret:
        raise MacroRefused("log_in needs a user name and a password in the goal")
    return _fill(user, name), _fill(password, secret), f"click({button.bid!r})"


def search(obs: Observation) -> tuple[str, ...]:
    labels = field_labels(obs)
    box = next((b for b, label in labels.items() if SEARCH_LABEL.search(label)), None)
    button = _button(obs, SEARCH_LABEL)
    if box is None and button is not None and len(labels) == 1:
        box = next(iter(labels))  # one text field beside a Search button is the search box
    if box is None:
        raise MacroRefused("search needs a search box")
    fields = goal_fields(obs.goal)
    query = fields.get("search") or fields.get("for") or fields.get("query") or fields.get("enter") or fields.get("text")
    if not query:
        raise MacroRefused("search needs a quoted query in the goal")
    press = f"click({button.bid!r})" if button is not None else f"press({box!r}, 'Enter')"
    return _fill(box, query), press


def fill_form(obs: Observation) -> tuple[str, ...]:
    fields = goal_fields(obs.goal)
    labels = field_labels(obs)
    fills = [(bid, value) for bid, label in labels.items() if label and (value := _value_for(label, fields))]
    quoted = [v for k, v in fields.items() if k not in ("email", "to")]
    if not fills and len(labels) == 1 and len(quoted) == 1:
        fills = [(next(iter(labels)), quoted[0])]  # one field, one value: "Enter "X" into the text field"
    if not fills:
        raise MacroRefused("fill_form needs labelled fields whose labels the goal gives values for")
    button = _button(obs, SUBMIT_BUTTON)
    if button is None:
        raise MacroRefused("fill_form needs a submit button")
    return (*(_fill(bid, value) for bid, value in fills), f"click({button.bid!r})")


def add_to_cart(obs: Observation) -> tuple[str, ...]:
    button = _button(obs, CART_BUTTON)
    if button is None:
        raise MacroRefused("add_to_cart needs an 'Add to cart' button")
    return (f"click({button.bid!r})",)


def close_modal(obs: Observation) -> tuple[str, ...]:
    if not any(DIALOG_LINE.search(line) for line in (obs.axtree or "").splitlines()):
        raise MacroRefused("close_modal needs a dialog, modal or cookie banner on the page")
    button = _button(obs, CLOSE_BUTTON)
    if button is None:
        raise MacroRefused("close_modal needs a close, dismiss or accept button")
    return (f"click({button.bid!r})",)


@dataclasses.dataclass(frozen=True)
class Macro:
    name: str
    description: str
    program: Callable[[Observation], Sequence[str]]
    goal: re.Pattern  # the orchestrator runs the macro unasked only for goals this matches

    def plan(self, obs: Observation) -> MacroPlan:
        """The macro's actions on this page; ``MacroRefused`` when its precondition does not hold."""
        return MacroPlan(self.name, tuple(self.program(obs)))


MACROS: dict[str, Macro] = {m.name: m for m in (
    Macro("log_in", "fill the user name and password from the goal, then log in", log_in,
          re.compile(r"log\s*in|sign\s*in|username|password", re.IGNORECASE)),
    Macro("search", "type the goal's query into the search box and search", search, re.compile(r"search", re.IGNORECASE)),
    Macro("fill_form", "fill the form's fields from the goal's values, then submit", fill_form,
          re.compile(r"\b(enter|fill|form|type)\b", re.IGNORECASE)),
    Macro("add_to_cart", "add the product on the page to the cart", add_to_cart, re.compile(r"cart|buy|purchase|order", re.IGNORECASE)),
    Macro("close_modal", "close the dialog, modal or cookie banner in the way", close_modal, re.compile(r".")),
)}
