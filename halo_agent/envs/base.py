"""The environment interface every HALO environment implements, and BrowserGym page helpers they share.

An environment is driven by the episode loop (``halo_agent.rollout``) one episode at a time::

    env = MiniWoBEnv(headless=True)          # one browser per worker, reused across episodes
    page = env.reset(task, task_seed=7)      # PageState: goal, url, AXTree, elements, screenshot
    outcome = env.step("click('12')")        # StepOutcome: the page after, reward, done flags, action error
    env.close()

Environments raise ``EnvError`` for failures of the environment itself (browser
crash, page that will not load); the episode loop ends that episode with the error
recorded and goes on. A failing *action* (no such element, timeout) is not an
environment failure: it comes back as ``StepOutcome.action_error``.

Observations and actions use BrowserGym's formats, from agisdk's vendored copy:
the AXTree flattened with element ids (``flatten_axtree_to_str``) and the
high-level action strings (``click('12')``, ``fill('7', 'text')``) executed by
BrowserGym's own action code.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import weakref
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from halo_agent.private_api import UPGRADE_ERRORS, warn_fallback
from halo_agent.types import Element

log = logging.getLogger(__name__)


class _DropAriaNoise(logging.Filter):
    """BrowserGym warns for every aria-description it cannot parse (page text, not its own data)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to extract BrowserGym data from ARIA string")


logging.getLogger("agisdk.REAL.browsergym.core.observation").addFilter(_DropAriaNoise())


class EnvError(RuntimeError):
    """The environment failed (browser crash, page error): the episode ends with this error recorded."""


class UnknownTaskError(ValueError):
    """A task id the environment does not know."""


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task an environment offers (also the row format of a task registry snapshot)."""

    task_id: str  # e.g. miniwob.click-button, v2.gomail-1
    env: str  # miniwob | real
    site: str  # miniwob, gomail, omnizon, ...
    task_version: str | None = None
    goal: str | None = None  # None where the goal depends on the seed (MiniWoB)
    split: str = "all"  # train | eval | all
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TaskSpec":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass
class PageState:
    """What the environment shows after a reset or a step."""

    goal: str
    url: str
    axtree: str  # BrowserGym's flattened AXTree text, with element ids in brackets
    elements: Sequence[Element]  # actions the page offers (for the random policy and validation)
    screenshot: bytes | None  # PNG
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepOutcome:
    page: PageState  # the page after the action
    reward: float  # the environment's reward for this step (BrowserGym: 0/1 at the end)
    terminated: bool  # the task ended (success or failure)
    truncated: bool = False  # the environment stopped the episode (time limit)
    action_error: str | None = None  # the browser refused the action (element missing, timeout)
    raw_reward: float | None = None  # the environment's own raw reward (MiniWoB raw_reward)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """What the episode loop needs from an environment (``miniwob``, ``real``).

    Implementations are classes constructed with keyword options (``headless``,
    ``task_version``, ...) inside the worker process that uses them, and
    registered by name in ``halo_agent.envs.ENVIRONMENTS``.
    """

    name: str

    @classmethod
    def list_tasks(cls, **options: Any) -> list[TaskSpec]:
        """Every task this environment offers."""

    def reset(self, task: TaskSpec, task_seed: int) -> PageState:
        """Start an episode of ``task``; the same ``task_seed`` gives the same instance."""

    def step(self, action: str) -> StepOutcome:
        """Execute one BrowserGym action string."""

    def close(self) -> None:
        ...


# ---------------------------------------------------------------------------------------------
# BrowserGym page helpers (agisdk's vendored BrowserGym), shared by the MiniWoB and REAL envs.

# Roles a policy can click even when the DOM snapshot does not flag the element clickable.
CLICK_ROLES = frozenset(
    {"button", "link", "checkbox", "radio", "tab", "menuitem", "menuitemcheckbox", "menuitemradio",
     "option", "treeitem", "switch", "gridcell", "columnheader", "slider", "cell", "row", "listitem", "img"}
)
FILL_ROLES = frozenset({"textbox", "searchbox", "spinbutton"})
SELECT_ROLES = frozenset({"combobox", "listbox"})
# Container roles whose "clickable" flag is usually inherited from a handler on the page body.
_NEVER_CLICK_ROLES = frozenset({"RootWebArea", "WebArea", "generic", "none", "paragraph", "Section", "LineBreak", "StaticText", "InlineTextBox", "LabelText", "group", "main", "form", "list", "table", "rowgroup", "MenuListPopup", "document"})

MIN_VISIBILITY = 0.5


# Element ids plus pixel coordinates (mouse_click(x, y), keyboard_type), which screenshot policies answer with.
SUBSETS_WITH_COORDINATES = ("chat", "infeas", "bid", "coord", "nav", "tab")


# BrowserGym's actions give Playwright 500 ms to click, fill, check or select an element that is already on the
# page. On two busy cores (browsers, servers and trainers at once) the click itself can take longer, and the action
# then fails as if the page had refused it. HALO's action set waits up to this long instead.
ACTION_TIMEOUT_MS = 2000


def action_set(subsets: Iterable[str] = ("chat", "infeas", "bid", "nav", "tab")):
    """BrowserGym's high-level action set (``click('12')`` and friends), demo effects off, Playwright's action
    timeout ``ACTION_TIMEOUT_MS``."""
    from agisdk.REAL.browsergym.core.action.highlevel import HighLevelActionSet

    actions = HighLevelActionSet(subsets=list(subsets), strict=False, multiaction=False, demo_mode="off")
    actions.python_includes = actions.python_includes.replace("timeout=500)", f"timeout={ACTION_TIMEOUT_MS})")
    return actions


def _node_value(node: dict[str, Any], key: str) -> Any:
    v = node.get(key)
    return v.get("value") if isinstance(v, dict) else None


def elements_from_axtree(axtree: dict[str, Any], extra_properties: dict[str, Any],
                         markup: dict[str, str] | None = None) -> list[Element]:
    """The actions a page offers: visible clickable, fillable and selectable elements, in page order.

    ``markup``: what each element's markup calls it (:func:`markup_names` of the page's DOM snapshot); an element
    without an accessible name is described by it and by its text (:func:`describe_unnamed`)."""
    nodes = axtree.get("nodes", [])
    by_id = {n.get("nodeId"): n for n in nodes}
    out: list[Element] = []
    seen: set[str] = set()
    for node in nodes:
        bid = node.get("browsergym_id")
        if not bid or bid in seen or node.get("ignored"):
            continue
        props = extra_properties.get(bid, {})
        visibility = props.get("visibility")
        if visibility is not None and visibility < MIN_VISIBILITY:
            continue
        bbox = props.get("bbox")
        if bbox is not None and (bbox[2] <= 0 or bbox[3] <= 0):
            continue
        role = str(_node_value(node, "role") or "")
        name = str(_node_value(node, "name") or "")
        disabled = any(p.get("name") == "disabled" and (p.get("value") or {}).get("value") for p in node.get("properties", []))
        if disabled:
            continue
        if role in FILL_ROLES:
            out.append(Element(bid, role, name, "fill"))
        elif role in SELECT_ROLES:
            options = []
            stack = list(node.get("childIds", []))
            while stack:
                child = by_id.get(stack.pop(0))
                if child is None:
                    continue
                if _node_value(child, "role") == "option":
                    label = _node_value(child, "name")
                    if label:
                        options.append(str(label))
                stack.extend(child.get("childIds", []))
            if options:
                out.append(Element(bid, role, name, "select", tuple(options)))
            else:
                out.append(Element(bid, role, name, "click"))
        elif role in CLICK_ROLES or (props.get("clickable") and role not in _NEVER_CLICK_ROLES):
            out.append(Element(bid, role, name, "click"))
        else:
            continue
        seen.add(bid)
    parent = {child: n.get("nodeId") for n in nodes for child in n.get("childIds", [])}
    return describe_unnamed(_mark_wrappers(out, nodes, by_id, parent), nodes, by_id, parent, markup or {})


# An element without an accessible name is described by at most this many characters of what its markup calls it,
# and of the text it holds or, holding none, of the text of the nearest of its DESCRIPTION_LEVELS ancestors that has
# some: an email's trash icon by ``trash`` and its row's sender and subject.
DESCRIPTION_MARKUP_CHARS = 24
DESCRIPTION_TEXT_CHARS = 40
DESCRIPTION_LEVELS = 4
# The attributes that name an element in its markup, the first one present winning ("src": its file's stem).
MARKUP_ATTRIBUTES = ("title", "alt", "id", "class", "src")


def markup_names(dom_snapshot: dict[str, Any]) -> dict[str, str]:
    """bid -> what the element's markup calls it: its title, alt, id or first class, or its image's file name (the
    first present, at most DESCRIPTION_MARKUP_CHARS characters), from a DOMSnapshot.captureSnapshot answer."""
    from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE

    strings = dom_snapshot.get("strings") or []
    index = {s: i for i, s in enumerate(strings) if s in (BROWSERGYM_ID_ATTRIBUTE, *MARKUP_ATTRIBUTES)}
    bid_id = index.get(BROWSERGYM_ID_ATTRIBUTE)
    rank = {index[a]: r for r, a in enumerate(MARKUP_ATTRIBUTES) if a in index}
    if bid_id is None or not rank:
        return {}
    names: dict[str, str] = {}
    for document in dom_snapshot.get("documents") or []:
        for attributes in document.get("nodes", {}).get("attributes") or []:
            bid, best = None, None
            for i in range(0, len(attributes) - 1, 2):
                key, value = attributes[i], attributes[i + 1]
                if key == bid_id and value >= 0:
                    bid = strings[value]
                elif key in rank and value >= 0 and strings[value].strip() and (best is None or rank[key] < best[0]):
                    best = (rank[key], strings[value])
            if bid and best is not None:
                name = best[1]
                if MARKUP_ATTRIBUTES[best[0]] == "class":  # its first class: ``expandable lastExpandable``
                    name = name.split()[0]
                elif MARKUP_ATTRIBUTES[best[0]] == "src":
                    name = name.split("?")[0].split("#")[0].rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
                name = " ".join(name.split())[:DESCRIPTION_MARKUP_CHARS]
                if name:
                    names[bid] = name
    return names


def describe_unnamed(elements: list[Element], nodes: list[dict[str, Any]], by_id: dict[Any, dict[str, Any]],
                     parent: dict[Any, Any], markup: dict[str, str]) -> list[Element]:
    """Each element without an accessible name, described (``Element.description``) by what its markup calls it
    and by its text: ``expandable; 'Kasi Leonie'`` for the text it holds, ``trash; in 'Hazel Nibh nisl.'`` for the
    text of the nearest ancestor (at most DESCRIPTION_LEVELS up) that has some. The climb stops below an ancestor
    that holds a named element (a form's Submit button): the text around is that element's, not this one's. Text
    inside other listed elements is never used. Elements with a name are as they were."""
    unnamed = [e for e in elements if not e.name]
    if not unnamed:
        return elements
    node_of = {n.get("browsergym_id"): n.get("nodeId") for n in nodes if n.get("browsergym_id")}
    listed = {node_of[e.bid] for e in elements if e.bid in node_of}
    holds_named: set[Any] = set()  # the nodes with a named listed element under them: their text is its
    for element in elements:
        ancestor = parent.get(node_of.get(element.bid)) if element.name else None
        while ancestor is not None and ancestor not in holds_named:
            holds_named.add(ancestor)
            ancestor = parent.get(ancestor)
    texts: dict[Any, str] = {}

    def text(node_id: Any) -> str:
        """The rendered text under a node, in page order, cut at DESCRIPTION_TEXT_CHARS: none of it from inside
        another listed element (a Submit button beside a select is not the select's text). Each node's once."""
        stack, open_nodes = [(node_id, False)], set()
        while stack:  # post-order without recursion: a deep page cannot exhaust Python's stack
            current, expanded = stack.pop()
            if current in texts:
                continue
            node = by_id.get(current) or {}
            role = _node_value(node, "role")
            if role in ("StaticText", "InlineTextBox"):  # a text box repeats its StaticText; hidden text is ignored
                shown = role == "StaticText" and not node.get("ignored")
                texts[current] = " ".join(str(_node_value(node, "name") or "").split()) if shown else ""
            elif not expanded:
                open_nodes.add(current)  # a malformed tree's cycle back to it is cut, not walked forever
                stack.append((current, True))
                stack.extend((c, False) for c in reversed(node.get("childIds", []))
                             if c not in texts and c not in listed and c not in open_nodes)
            else:
                joined = ""
                for child in node.get("childIds", []):
                    part = texts.get(child, "") if child not in listed else ""
                    joined = f"{joined} {part}" if joined and part else joined or part
                    if len(joined) >= DESCRIPTION_TEXT_CHARS:
                        break
                texts[current] = joined[:DESCRIPTION_TEXT_CHARS]
        return texts[node_id]

    described: dict[str, str] = {}
    for element in unnamed:
        node_id = node_of.get(element.bid)
        own, around = (text(node_id) if node_id is not None else ""), ""
        ancestor = parent.get(node_id)
        for _ in range(DESCRIPTION_LEVELS if not own else 0):
            if ancestor is None or ancestor in holds_named:
                break
            around = text(ancestor)
            if around:
                break
            ancestor = parent.get(ancestor)
        words = [w for w in (markup.get(element.bid, ""), f"'{own}'" if own else f"in '{around}'" if around else "") if w]
        if words:
            described[element.bid] = "; ".join(words)
    return [dataclasses.replace(e, description=described[e.bid]) if e.bid in described else e for e in elements]


def _mark_wrappers(elements: list[Element], nodes: list[dict[str, Any]], by_id: dict[Any, dict[str, Any]],
                   parent: dict[Any, Any]) -> list[Element]:
    """Mark each element that contains another listed element of the same non-empty name (``wraps`` = the inner bid).

    One walk up from each named element to its nearest same-named listed ancestor: the tree's depth per
    element, not an ancestor's whole subtree."""
    listed = {e.bid: e for e in elements}
    node_of = {n.get("browsergym_id"): n.get("nodeId") for n in nodes if n.get("browsergym_id") in listed}
    wraps: dict[str, str] = {}
    for element in elements:
        if not element.name:
            continue
        node_id = parent.get(node_of[element.bid])
        for _ in range(len(nodes)):  # bounded: a malformed tree's cycle cannot hang an observation
            if node_id is None:
                break
            outer = listed.get((by_id.get(node_id) or {}).get("browsergym_id"))
            if outer is not None and outer.bid != element.bid and outer.name == element.name:
                wraps.setdefault(outer.bid, element.bid)
                break
            node_id = parent.get(node_id)
    return [dataclasses.replace(e, wraps=wraps[e.bid]) if e.bid in wraps else e for e in elements]


# Playwright's internals behind _PageDevTools' fast path; cleared, for the whole process, the
# first time an upgrade of Playwright turns out to have changed them.
_PRIVATE_SEND = "Playwright's CDPSession._impl_obj.send / _sync"
_private_send_works = True


class _PageDevTools:
    """One Chrome DevTools session per page, kept for the page's lifetime.

    Opening and detaching a session costs more than the DOM snapshot it serves (~3 ms of
    wall time and ~7 ms of CPU across Chromium and Playwright), and BrowserGym's observation
    functions open four per observation. They are handed this object as their ``page``:
    ``page.context.new_cdp_session(page)`` returns it and its ``detach()`` keeps the session,
    which is all those functions use of a page.

    Requests go through the session's underlying asynchronous call (Playwright's
    ``_impl_obj``, run by the sync wrapper's ``_sync``): the public sync ``send`` walks
    every value of an answer looking for Playwright objects to wrap, and a DOM snapshot or
    AXTree is tens of thousands of plain JSON values (~10% of a MiniWoB step). The same
    access lets ``send_ahead`` have several requests in flight at once. Where a Playwright
    upgrade changed that access, the public ``send`` is used (``halo_agent.private_api``).
    """

    def __init__(self, page) -> None:
        self.page = page
        self.context = self
        self._session = None
        self._ahead: dict[str, Any] = {}  # answers of requests sent ahead, by request
        self.main_frame_id: str | None = None  # from the last Page.getFrameTree

    def new_cdp_session(self, _page) -> "_PageDevTools":
        return self

    def detach(self) -> None:
        """Kept open for the next observation (BrowserGym's functions call this when done)."""

    @staticmethod
    def _key(method: str, params: dict[str, Any] | None) -> str:
        return method + json.dumps(params or {}, sort_keys=True)

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = self._ahead.pop(self._key(method, params), None) if self._ahead else None
        if answer is None:
            answer = self._send_now(method, params)
        if method == "Page.getFrameTree":
            self.main_frame_id = answer["frameTree"]["frame"]["id"]
        return answer

    def _send_now(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        from playwright.sync_api import Error as PlaywrightError

        for attempt in (1, 2):
            if self._session is None:
                self._session = self.page.context.new_cdp_session(self.page)
            try:
                return self._send_once(method, params)
            except PlaywrightError as e:
                message = str(e).lower()
                if attempt == 2 or self.page.is_closed() or ("detached" not in message and "closed" not in message):
                    raise
                self._session = None  # the target went away under the session (e.g. a process swap)
        raise AssertionError("unreachable")

    def _send_once(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        global _private_send_works
        if not _private_send_works:
            return self._session.send(method, params)
        try:
            return self._run_private(lambda send: send(method=method, params=params, timeout=None))
        except UPGRADE_ERRORS as e:
            # An error that the public call does not share shows that Playwright changed.
            answer = self._session.send(method, params)
            _private_send_works = False
            warn_fallback(_PRIVATE_SEND, e, "the slower public CDPSession.send, one request at a time")
            return answer

    def _run_private(self, make_coroutine):
        """Run, on the sync wrapper's loop, the coroutine ``make_coroutine`` builds from the session's asynchronous send."""
        coroutine = make_coroutine(self._session._impl_obj.send)
        try:
            return self._session._sync(coroutine)
        except Exception:
            coroutine.close()  # never awaited where ``_sync`` refused it; a no-op once it ran
            raise

    def send_ahead(self, requests: Sequence[tuple[str, dict[str, Any] | None]]) -> None:
        """Send several requests at once; a later ``send`` of the same request takes its answer.

        Chromium answers them in order on one session, without a round trip to Python between
        them, and the screenshot's wait for a frame overlaps the DOM and AXTree work. A request
        that fails here is simply sent again by ``send`` (which also tells whether Playwright changed).
        """
        import asyncio

        if not _private_send_works:
            return
        if self._session is None:
            self._session = self.page.context.new_cdp_session(self.page)

        async def all_of(send):
            return await asyncio.gather(*(send(method=m, params=p, timeout=None) for m, p in requests), return_exceptions=True)

        try:
            answers = self._run_private(all_of)
        except UPGRADE_ERRORS:
            return
        for (method, params), answer in zip(requests, answers):
            if not isinstance(answer, BaseException):
                self._ahead[self._key(method, params)] = answer

    def forget_ahead(self) -> None:
        self._ahead.clear()


_DEVTOOLS: "weakref.WeakKeyDictionary[Any, _PageDevTools]" = weakref.WeakKeyDictionary()


def devtools(page) -> _PageDevTools:
    """The page's long-lived DevTools session (created on first use)."""
    tools = _DEVTOOLS.get(page)
    if tools is None:
        tools = _DEVTOOLS[page] = _PageDevTools(page)
    return tools


SCREENSHOT_REQUEST = ("Page.captureScreenshot", {"format": "png", "optimizeForSpeed": True})
DOM_SNAPSHOT_REQUEST = ("DOMSnapshot.captureSnapshot", {"computedStyles": [], "includeDOMRects": True, "includePaintOrder": False})


def capture_png(page) -> bytes:
    """A PNG screenshot of the viewport, kept as bytes (BrowserGym decodes it to an array; we store it)."""
    answer = devtools(page).send(*SCREENSHOT_REQUEST)
    return base64.b64decode(answer["data"])


@functools.lru_cache(maxsize=None)
def _browsergym_js(name: str) -> str:
    import pkgutil

    return pkgutil.get_data("agisdk.REAL.browsergym.core", f"javascript/{name}").decode("utf-8")


@functools.lru_cache(maxsize=1)
def _mark_elements_js() -> str:
    """BrowserGym's element-marking script, polling for the visibility observer every 2 ms instead of 40.

    The observer reports after the next rendering frame; BrowserGym's 40 ms polling
    interval alone made each observation ~40 ms slower. The marking is unchanged.
    """
    js = _browsergym_js("frame_mark_elements.js")
    patched = js.replace("async function until(f, timeout, interval=40)", "async function until(f, timeout, interval=2)")
    if patched == js:
        log.warning("BrowserGym's marking script changed; observations use its original polling interval")
    return patched


def _scriptable_child_frames(frame):
    """``(frame, its element)`` for each child frame BrowserGym marks: attached, shown by its own
    element (not a PDF viewer in an ``<embed>``), and allowed to run scripts."""
    for child in frame.child_frames:
        if child.is_detached():
            continue
        element = child.frame_element()
        if element.content_frame() != child:
            continue
        sandbox = element.get_attribute("sandbox")
        if sandbox is not None and "allow-scripts" not in sandbox.split():
            continue
        yield child, element


def mark_elements(page, tags_to_mark: str = "standard_html") -> None:
    """Give every element a bid and store visibility data in ARIA attributes (BrowserGym's ``_pre_extract``)."""
    from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
    from agisdk.REAL.browsergym.core.observation import MarkingError

    js = _mark_elements_js()

    def mark(frame, frame_bid: str) -> None:
        for message in frame.evaluate(js, [frame_bid, BROWSERGYM_ID_ATTRIBUTE, tags_to_mark]):
            log.debug("marking: %s", message)
        for child, element in _scriptable_child_frames(frame):
            child_bid = element.get_attribute(BROWSERGYM_ID_ATTRIBUTE)
            if child_bid is None:
                raise MarkingError("Cannot mark a child frame without a bid.")
            mark(child, child_bid)

    mark(page.main_frame, "")


def unmark_elements(page) -> None:
    """Take the marks' data back out of the page's ARIA attributes (BrowserGym's ``_post_extract``).

    Frames that detach meanwhile are skipped, as BrowserGym does.
    """
    from playwright.sync_api import Error as PlaywrightError

    js = _browsergym_js("frame_unmark_elements.js")

    def unmark(frame) -> None:
        try:
            frame.evaluate(js)
            children = list(_scriptable_child_frames(frame))
        except PlaywrightError as e:
            if "detached" not in str(e):
                raise
            return
        for child, _ in children:
            unmark(child)

    unmark(page.main_frame)


_DOM_SNAPSHOT_ARGS = {"computed_styles": "computedStyles", "include_dom_rects": "includeDOMRects", "include_paint_order": "includePaintOrder"}


def focused_bid(axtree: dict[str, Any]) -> str:
    """The bid of the focused element, from the AXTree ('' when the document itself has focus)."""
    for node in axtree.get("nodes", ()):
        if node.get("browsergym_id") and any(
            p.get("name") == "focused" and (p.get("value") or {}).get("value") for p in node.get("properties", ())
        ):
            return str(node["browsergym_id"])
    return ""


def extract_page_state(page, goal: str, tags_to_mark: str = "standard_html", screenshot: bool = True) -> PageState:
    """BrowserGym's observation of ``page``: marked DOM, merged AXTree flattened to text, elements, screenshot."""
    from agisdk.REAL.browsergym.core.observation import (
        MarkingError,
        extract_dom_extra_properties,
        extract_dom_snapshot,
        extract_merged_axtree,
    )
    from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
    from agisdk.REAL.browsergym.utils.obs import flatten_axtree_to_str
    from playwright.sync_api import Error as PlaywrightError

    tools = devtools(page)
    last_error: Exception | None = None
    for _ in range(3):
        try:
            mark_elements(page, tags_to_mark)
            # BrowserGym's requests, sent at once; its functions below take their answers.
            ahead = [DOM_SNAPSHOT_REQUEST, ("Page.getFrameTree", {})]
            if tools.main_frame_id and len(page.frames) == 1:
                ahead.append(("Accessibility.getFullAXTree", {"frameId": tools.main_frame_id}))
            if screenshot:
                ahead.append(SCREENSHOT_REQUEST)  # the page as marked looks as it does unmarked
            tools.send_ahead(ahead)
            dom = extract_dom_snapshot(tools, **{k: DOM_SNAPSHOT_REQUEST[1][v] for k, v in _DOM_SNAPSHOT_ARGS.items()})
            axtree = extract_merged_axtree(tools)
            extra_properties = extract_dom_extra_properties(dom)
            png = capture_png(page) if screenshot else None
            break
        except (PlaywrightError, MarkingError) as e:
            # Frames can detach while a page is still settling; BrowserGym retries these too.
            last_error = e
            message = str(e)
            transient = any(
                s in message
                for s in ("detached", "not found", "Execution context was destroyed", "without a bid")
            )
            try:
                unmark_elements(page)
            except PlaywrightError:
                pass
            if not transient:
                raise
            page.wait_for_timeout(100)
        finally:
            tools.forget_ahead()
    else:
        raise EnvError(f"could not read the page: {last_error}")
    unmark_elements(page)
    text = flatten_axtree_to_str(axtree)
    elements = elements_from_axtree(axtree, extra_properties, markup_names(dom))
    return PageState(
        goal=goal,
        url=page.url,
        axtree=text,
        elements=elements,
        screenshot=png,
        extra={
            "focused_element_bid": focused_bid(axtree),
            # [x, y, width, height] in CSS pixels of the elements a policy may act on, so the
            # step can record where its action landed (the dashboard draws it).
            "element_bboxes": {
                e.bid: list(extra_properties[e.bid]["bbox"])
                for e in elements
                if extra_properties.get(e.bid, {}).get("bbox") is not None
            },
        },
    )


# Where a click on a main-frame element would land, or null when Playwright's own actionability
# checks are needed: the element must exist once, be enabled, visible with a single box that has
# not moved since the page was observed (so it is stable), lie wholly inside the viewport, and be
# the element a click at its centre hits. Those are the checks Playwright's click makes; it spends
# two animation frames (~33 ms) establishing stability, which an unmoved box already shows.
_CLICK_POINT_JS = """([bid, attr, box]) => {
  const found = document.querySelectorAll(`[${attr}="${CSS.escape(bid)}"]`);
  if (found.length !== 1 || !box) return null;
  const el = found[0];
  if (el.disabled || el.closest('[aria-disabled="true"], fieldset:disabled')) return null;
  if (!el.checkVisibility({visibilityProperty: true})) return null;
  const rects = el.getClientRects();
  if (rects.length !== 1) return null;
  const r = rects[0];
  if (r.width <= 0 || r.height <= 0) return null;
  if (Math.abs(r.x - box[0]) > 0.5 || Math.abs(r.y - box[1]) > 0.5 ||
      Math.abs(r.width - box[2]) > 0.5 || Math.abs(r.height - box[3]) > 0.5) return null;
  if (r.left < 0 || r.top < 0 || r.right > window.innerWidth || r.bottom > window.innerHeight) return null;
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  const hit = document.elementFromPoint(x, y);
  if (!hit || !(hit === el || el.contains(hit))) return null;
  return [x, y];
}"""


class ActionRunner:
    """Runs BrowserGym action strings on a page with BrowserGym's own action code.

    BrowserGym executes its whole action library (function definitions and all) for every
    action; the runner executes it once and then only the action's call. ``click`` on a
    main-frame element whose box is unchanged since the observation (``observed_boxes``,
    bid -> [x, y, width, height] in CSS pixels) goes straight to the mouse at the
    element's centre once the checks in ``_CLICK_POINT_JS`` pass; any other click, and every
    other action, is BrowserGym's code unchanged (Playwright's waits, errors and timeouts).
    """

    def __init__(self, actions=None, fast_click: bool = True):
        self.actions = actions or action_set()
        self.fast_click = fast_click
        self._namespace: dict[str, Any] | None = None
        self._page = None
        self._boxes: dict[str, Sequence[float]] = {}

    def _globals(self) -> dict[str, Any]:
        if self._namespace is None:
            namespace: dict[str, Any] = {}
            exec(compile(self.actions.python_includes, "<browsergym actions>", "exec"), namespace)
            namespace["_browsergym_click"] = namespace["click"]
            if self.fast_click:
                namespace["click"] = self._click
            self._namespace = namespace
        return self._namespace

    def _click(self, bid: str, button: str = "left", modifiers: Sequence[str] = ()) -> None:
        from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE

        page = self._namespace["page"]
        if isinstance(bid, str) and bid.isdigit() and not modifiers and button in ("left", "middle", "right"):
            point = page.evaluate(_CLICK_POINT_JS, [bid, BROWSERGYM_ID_ATTRIBUTE, self._boxes.get(bid)])
            if point:
                page.mouse.click(point[0], point[1], button=button)
                return
        self._namespace["_browsergym_click"](bid, button, list(modifiers))

    def run(self, page, action: str, observed_boxes: dict[str, Sequence[float]] | None = None) -> tuple[str | None, list[tuple[str, str]]]:
        """Run one action string on ``page``.

        Returns ``(error, messages)``: the error text if the browser refused the action
        (``None`` if it ran), and the ``(role, text)`` messages the action sent
        (``send_msg_to_user`` -> ``assistant``, ``report_infeasible`` -> ``infeasible``).
        """
        messages: list[tuple[str, str]] = []
        try:
            code = self.actions.to_python_code(action)
        except Exception as e:  # BrowserGym raises ValueError/SyntaxError for a malformed action string
            return f"{type(e).__name__}: {e}", messages
        includes = self.actions.python_includes
        calls = code[len(includes) :] if code.startswith(includes) else code
        namespace = self._globals()
        namespace.update(
            page=page,
            send_message_to_user=lambda text: messages.append(("assistant", str(text))),
            report_infeasible_instructions=lambda text: messages.append(("infeasible", str(text))),
        )
        self._boxes = observed_boxes or {}
        try:
            exec(compile(calls, "<action>", "exec"), namespace)
        except Exception as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", messages
        finally:
            namespace["page"] = None
        return None, messages


def element_for_action(action: str | None, elements: Sequence[Element]) -> Element | None:
    """The element an action string targets (its first quoted argument is a bid), if any."""
    if not action:
        return None
    start = action.find("(")
    if start < 0:
        return None
    rest = action[start + 1 :].lstrip()
    if not rest or rest[0] not in "'\"":
        return None
    end = rest.find(rest[0], 1)
    bid = rest[1:end] if end > 0 else None
    for el in elements:
        if el.bid == bid:
            return el
    return None
