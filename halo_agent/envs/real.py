"""REAL tasks through agisdk 0.3.5: its BrowserGym environment, task registry and evaluators.

Each episode runs agisdk's own ``BrowserEnv`` on its ``AbstractWebCloneTask``:
setup opens ``<site>/config?run_id=..&task_id=..`` in a background page, the
agent acts on ``<site>/``, and when the agent sends its answer
(``send_msg_to_user``) the task reads the state difference from ``<site>/finish``
and scores it with agisdk's evaluator (JMESPath queries or, for v2, the task's
Python eval script). HALO adds the step record around it: the flattened AXTree
and the elements it offers, a PNG screenshot, no HTML.

Defaults follow agisdk's score mode: task version v2, a 1280x720 browser, 70 steps,
BrowserGym's action set (with coordinate actions for screenshot policies). A
browser or site failure raises ``EnvError``; an action the browser refused is
``StepOutcome.action_error`` and the episode goes on. The episode ends when the
agent answers (scored), reports the task infeasible, or runs out of steps.

Task-aware progress: where the task has expectations (``halo_agent.task_progress``), the
environment reads ``<site>/finish`` after every action and reports the share of them the state
satisfies in ``StepOutcome.info["task_progress"]`` (``share``, the ``satisfied`` flags, and
``poll_ms``, what reading it cost), and at reset in ``PageState.extra["task_progress"]``. The
read goes through agisdk's own background page of the episode's browser context (the one its
setup and evaluator use), so the agent's page, its history and the site's state are left as they
were; the answer step reuses the state agisdk's evaluator read. A task without expectations is
never polled. ``task_progress=False`` turns it off.

``site_urls`` (or ``HALO_REAL_SITE_URLS="gomail=http://127.0.0.1:8377,..."``)
sends the tasks of a site to another address: a self-hosted clone, or the local
clones in ``halo_agent.sites`` that the tests use.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import tempfile
import threading
import time
from typing import Any, Mapping

from halo_agent.envs.base import (EnvError, PageState, StepOutcome, TaskSpec, UnknownTaskError, action_set,
                                  elements_from_axtree, markup_names)

log = logging.getLogger(__name__)

DEFAULT_TASK_VERSION = "v2"
DEFAULT_MAX_STEPS = 70
DEFAULT_VIEWPORT = (1280, 720)
SITE_URLS_ENV = "HALO_REAL_SITE_URLS"
# A site whose /finish cannot be read twice in a row is not read again in that episode (each try may wait finish_timeout_ms).
MAX_FINISH_FAILURES = 2
# Text and element ids (bid), pixel coordinates for screenshot policies, tabs and navigation.
ACTION_SUBSETS = ("chat", "infeas", "bid", "coord", "nav", "tab")

_MARKUP = re.compile(r"\[/?[a-z _#0-9]+\]")


def parse_site_urls(value: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"gomail=http://127.0.0.1:8377,omnizon=http://..."`` (or a mapping) -> {site: base url}."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = []
        for part in str(value).split(","):
            if not part.strip():
                continue
            site, sep, url = part.partition("=")
            if not sep or not site.strip() or not url.strip():
                raise ValueError(f"site url {part!r} must look like SITE=URL, e.g. gomail=http://127.0.0.1:8377")
            items.append((site, url))
    out = {}
    for site, url in items:
        url = str(url).strip().rstrip("/")
        if not re.match(r"^https?://", url):
            raise ValueError(f"site url for {site!r} must start with http:// or https://, got {url!r}")
        out[str(site).strip()] = url
    return out


def route_agisdk_console_to_logging() -> None:
    """agisdk prints progress, goals and whole state diffs to the terminal through a rich console;
    under a rollout's progress bar that is noise, so its console goes to ``logging`` (DEBUG)."""
    from agisdk.REAL.logging import logger as rich_logger

    if getattr(rich_logger, "_halo_routed", False):
        return
    sdk_log = logging.getLogger("agisdk")

    def to_logging(message: Any = "", *args: Any, **kwargs: Any) -> None:
        if sdk_log.isEnabledFor(logging.DEBUG):
            sdk_log.debug("%s", _MARKUP.sub("", str(message)))

    rich_logger.print = to_logging
    rich_logger._halo_routed = True


class ChatLog:
    """A headless episode's chat as a list of messages, without agisdk's chat window.

    BrowserGym's ``Chat`` launches a second Chromium for every episode only to show the conversation in a page.
    Headless, nobody sees it, and it is half of what a reset launches. The messages are kept as agisdk keeps them
    (the roles it records, with their time): its evaluator scores the agent's answer from them, and the
    observation's ``chat_messages`` shows them.
    """

    RECORDED = ("user", "user_image", "assistant", "infeasible")
    recording_start_time = None

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def add_message(self, role: str, msg: str) -> None:
        if role not in (*self.RECORDED, "info"):
            raise ValueError(f"Invalid role: {role}")
        if role in self.RECORDED:
            self.messages.append({"role": role, "timestamp": time.time(), "message": msg})

    def wait_for_user_message(self) -> None:
        raise EnvError("a headless episode has no chat window to wait for a user's message in")

    def close(self) -> None:
        pass


def use_chat_log_when_headless() -> None:
    """Make agisdk's environment keep a headless episode's chat as a ``ChatLog`` (a headed one keeps its window)."""
    from agisdk.REAL.browsergym.core import env as agisdk_env

    if getattr(agisdk_env.Chat, "_halo_chat", False):
        return
    window = agisdk_env.Chat

    def chat(headless: bool, *args: Any, **kwargs: Any):
        return ChatLog() if headless else window(headless, *args, **kwargs)

    chat._halo_chat = True
    agisdk_env.Chat = chat


def _png(screenshot: Any) -> bytes | None:
    """BrowserGym hands the screenshot as an RGB array; the lake stores PNG bytes."""
    if screenshot is None:
        return None
    from PIL import Image

    buffer = io.BytesIO()
    # Level 1 is ~4x faster than the default and only slightly larger on UI screenshots.
    Image.fromarray(screenshot).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _task_class():
    from agisdk.REAL.browsergym.webclones.base import AbstractWebCloneTask

    class HaloWebCloneTask(AbstractWebCloneTask):
        """agisdk's web-clone task, with the site address, browser size and timing set by HALO."""

        def __init__(
            self,
            seed: int,
            task_name: str,
            task_version: str,
            site_url: str | None = None,
            viewport: dict | None = None,
            slow_mo: int | None = None,
            timeout: int | None = None,
            run_id: str = "0",
            finish_timeout_ms: int = 5000,
        ) -> None:
            super().__init__(seed, task_name=task_name, task_version=task_version, run_id=run_id)
            if site_url:
                self.url = site_url
            if viewport:
                self.viewport = viewport
            if slow_mo is not None:
                self.slow_mo = slow_mo
            if timeout is not None:
                self.timeout = timeout
            self.finish_timeout_ms = finish_timeout_ms

        def validate(self, page, chat_messages, timeout: int = 1000, verbose: bool = True):
            # agisdk allows 1 s to load /finish, which a busy machine can miss (the answer is then an error, not a
            # score); and it writes the state for a v2 eval script into the shared temp folder, where a script that
            # reads the files beside its own (eval_omnizon_28.py) would see other episodes' states. The evaluation
            # gets HALO's /finish timeout and a temp folder of its own.
            with _private_tempdir():
                return super().validate(page, chat_messages, timeout=max(timeout, self.finish_timeout_ms), verbose=verbose)

    return HaloWebCloneTask


_TEMPDIR_LOCK = threading.Lock()


@contextlib.contextmanager
def _private_tempdir():
    """``tempfile``'s default folder is a fresh one of its own while the block runs (one block at a time per process)."""
    with _TEMPDIR_LOCK, tempfile.TemporaryDirectory(prefix="halo-eval-") as folder:
        before, tempfile.tempdir = tempfile.tempdir, folder
        try:
            yield folder
        finally:
            tempfile.tempdir = before


class RealEnv:
    """REAL web-clone tasks, one agisdk ``BrowserEnv`` per episode.

    ``slow_mo_ms``: Playwright's delay per input action; agisdk's tasks default to
    1000 ms, meant for watching a headful browser. HALO uses 0 unless asked:
    the environment still waits for the DOM and for JS events after every action.
    """

    name = "real"

    def __init__(
        self,
        headless: bool = True,
        task_version: str = DEFAULT_TASK_VERSION,
        task_registry: str | os.PathLike[str] | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        viewport: tuple[int, int] = DEFAULT_VIEWPORT,
        site_urls: str | Mapping[str, str] | None = None,
        slow_mo_ms: int | None = 0,
        action_timeout_ms: int | None = None,
        screenshot: bool = True,
        terminate_on_infeasible: bool = True,
        task_progress: bool = True,
        finish_timeout_ms: int = 5000,
        **_ignored: Any,
    ) -> None:
        from halo_agent.browser import ensure_environment

        ensure_environment()
        from halo_agent import registry

        route_agisdk_console_to_logging()
        self.headless = headless
        self.task_version = task_version
        self.max_steps = int(max_steps) if max_steps else DEFAULT_MAX_STEPS
        self.viewport = {"width": int(viewport[0]), "height": int(viewport[1])}
        env_urls = parse_site_urls(os.environ.get(SITE_URLS_ENV))
        self.site_urls = {**env_urls, **parse_site_urls(site_urls)}
        self.slow_mo_ms = slow_mo_ms
        self.action_timeout_ms = action_timeout_ms
        self.screenshot = screenshot
        self.terminate_on_infeasible = terminate_on_infeasible
        self.task_registry = str(task_registry) if task_registry else None
        self.task_progress = bool(task_progress)
        self.finish_timeout_ms = int(finish_timeout_ms)
        if self.task_progress:
            from halo_agent import task_progress as expectations

            expectations.load_all()  # a malformed expectations file fails here, before any episode
        self._expectations = None
        self._agent_page = None  # the agent's page when /finish was last read
        self._finish_failures = 0  # reads of /finish that failed in a row (the episode stops reading at MAX_FINISH_FAILURES)
        registry.register_local_tasks()
        if self.task_registry:
            self._tasks = {t.task_id: t for t in registry.use_snapshot(self.task_registry)}
        else:
            self._tasks = None
        self._actions = action_set(ACTION_SUBSETS)
        self._env = None
        self._task: TaskSpec | None = None
        self._steps = 0
        self._goal = ""

    # ------------------------------------------------------------------ registry

    @classmethod
    def list_tasks(
        cls, task_version: str = DEFAULT_TASK_VERSION, task_registry: str | os.PathLike[str] | None = None, **_: Any
    ) -> list[TaskSpec]:
        """The tasks of ``task_version`` (live registry), or of a snapshot file."""
        from halo_agent import registry

        if task_registry:
            return registry.snapshot_tasks(registry.load_snapshot(task_registry))
        return registry.list_real_tasks(task_version)

    def _resolve(self, task: TaskSpec | str) -> TaskSpec:
        from halo_agent import registry

        task_id = task if isinstance(task, str) else task.task_id
        if self._tasks is not None:
            return registry.resolve_tasks([task_id], list(self._tasks.values()))[0]
        if isinstance(task, TaskSpec) and "." in task.task_id:
            return task
        if "." not in task_id:
            task_id = f"{self.task_version}.{task_id}"
        version = task_id.split(".", 1)[0]
        return registry.resolve_tasks([task_id], registry.list_real_tasks(version))[0]

    # ------------------------------------------------------------------ episodes

    def reset(self, task: TaskSpec | str, task_seed: int) -> PageState:
        from agisdk.REAL.browsergym.core.env import BrowserEnv

        spec = self._resolve(task)
        version, name = spec.task_id.split(".", 1)
        self._close_env()
        use_chat_log_when_headless()
        site_url = self.site_urls.get(spec.site)
        task_kwargs = {
            "task_name": name,
            "task_version": version,
            "site_url": site_url,
            "viewport": self.viewport,
            "slow_mo": self.slow_mo_ms,
            "timeout": self.action_timeout_ms,
            "finish_timeout_ms": self.finish_timeout_ms,
        }
        self._env = BrowserEnv(
            task_entrypoint=_task_class(),
            task_kwargs=task_kwargs,
            headless=self.headless,
            wait_for_user_message=False,
            terminate_on_infeasible=self.terminate_on_infeasible,
            action_mapping=self._actions.to_python_code,
        )
        self._task = spec
        self._steps = 0
        try:
            obs, _info = self._env.reset(seed=int(task_seed))
        except UnknownTaskError:
            raise
        except Exception as e:  # Playwright, network and agisdk errors all end the episode alike
            self._close_env()
            raise EnvError(f"REAL reset of {spec.task_id} failed: {type(e).__name__}: {_first_line(e)}") from e
        self._goal = obs.get("goal") or spec.goal or ""
        page = self._page_state(obs)
        self._expectations = None
        self._agent_page = None
        self._finish_failures = 0
        if self.task_progress:
            from halo_agent.task_progress import expectations_for

            self._expectations = expectations_for(spec)
        if self._expectations is not None:
            page.extra["task_progress"] = self._measure(None)
        return page

    def step(self, action: str) -> StepOutcome:
        if self._env is None:
            raise EnvError("step() before reset(): start an episode first")
        self._keep_agent_page()
        started = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = self._env.step(action)
        except Exception as e:
            raise EnvError(f"REAL step failed: {type(e).__name__}: {_first_line(e)}") from e
        self._steps += 1
        if self._steps >= self.max_steps and not terminated:
            truncated = True
        task_info = info.get("task_info") or {}
        action_error = obs.get("last_action_error") or None
        extra_info: dict[str, Any] = {}
        if self._expectations is not None:
            # The answer step: agisdk's evaluator has just read /finish; score what it scored.
            final = task_info.get("env_state") if terminated else None
            extra_info["task_progress"] = self._measure(final if isinstance(final, dict) else None)
        return StepOutcome(
            page=self._page_state(obs),
            reward=float(reward or 0.0),
            terminated=bool(terminated),
            truncated=bool(truncated),
            action_error=action_error,
            raw_reward=float(task_info.get("local_reward", reward) or 0.0),
            info={
                "task_info": task_info,
                "env_state": task_info.get("env_state"),
                "step_seconds": time.perf_counter() - started,
                **extra_info,
            },
        )

    # ------------------------------------------------------------------ task-aware progress

    def _keep_agent_page(self) -> None:
        """An activation callback of a /finish read that ran late made the background page the active one: undo it."""
        agent_page = self._agent_page
        background = getattr(getattr(self._env, "task", None), "background_page", None)
        if agent_page is not None and background is not None and self._env.page is background and not agent_page.is_closed():
            self._env.page = agent_page

    def _measure(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """The share of the task's expectations that ``state`` (else the site's /finish state, read now) satisfies."""
        poll_ms = 0.0
        error = None
        if state is None and self._finish_failures >= MAX_FINISH_FAILURES:
            error = f"not read: /finish failed {self._finish_failures} times in a row in this episode"
        elif state is None:
            t0 = time.perf_counter()
            try:
                state = self.read_finish_state()
                self._finish_failures = 0
            except Exception as e:  # a failed read leaves the share unknown for this step; the episode goes on
                self._finish_failures += 1
                error = f"{type(e).__name__}: {_first_line(e)}"
                log.warning("reading /finish of %s failed: %s", self._task.task_id if self._task else "?", error)
            poll_ms = (time.perf_counter() - t0) * 1000.0
        out: dict[str, Any] = {"poll_ms": round(poll_ms, 3)}
        if state is None:
            out.update(share=None, error=error)
        else:
            flags = self._expectations.satisfied(state)
            out.update(share=sum(flags) / len(flags), satisfied=flags)
        return out

    def read_finish_state(self) -> dict[str, Any]:
        """The site's ``/finish`` state difference for this episode, read now without disturbing the agent.

        It loads ``/finish`` in agisdk's background page of the episode's browser context, as the
        task's evaluator does. BrowserGym makes any page whose document loads the active one, so
        the agent's page and its history are put back afterwards, as agisdk's ``_task_validate``
        does after the evaluator's read.
        """
        if self._env is None or getattr(self._env, "task", None) is None:
            raise EnvError("no episode: reset() first")
        env, task = self._env, self._env.task
        page = getattr(task, "background_page", None)
        if page is None or page.is_closed():
            raise EnvError("the task's background page is closed")
        active, history = env.page, env.page_history.copy()
        self._agent_page = active
        try:
            page.goto(task.url + "/finish", wait_until="load", timeout=self.finish_timeout_ms)
            text = page.locator("pre").first.inner_text(timeout=self.finish_timeout_ms)
            env.context.cookies()  # a round trip: the page-activation callbacks the load queued run now
        finally:
            env.page, env.page_history = active, history
        state = json.loads(text)
        if not isinstance(state, dict):
            raise ValueError(f"/finish holds a {type(state).__name__}, not an object")
        return state

    def _page_state(self, obs: dict[str, Any]) -> PageState:
        from agisdk.REAL.browsergym.utils.obs import flatten_axtree_to_str

        axtree = obs.get("axtree_object") or {}
        extra_properties = obs.get("extra_element_properties") or {}
        return PageState(
            goal=self._goal or obs.get("goal") or "",
            url=obs.get("url") or "",
            axtree=flatten_axtree_to_str(axtree),
            elements=elements_from_axtree(axtree, extra_properties, markup_names(obs.get("dom_object") or {})),
            screenshot=_png(obs.get("screenshot")) if self.screenshot else None,
            extra={
                "focused_element_bid": obs.get("focused_element_bid"),
                "open_pages_urls": list(obs.get("open_pages_urls") or []),
                "last_action_error": obs.get("last_action_error") or None,
                "chat_messages": list(obs.get("chat_messages") or []),
                "viewport": (self.viewport["width"], self.viewport["height"]),
                "site": self._task.site if self._task else None,
                "finish_action": "send_msg_to_user",  # the answer ends the episode and runs the task's evaluator
                "task_version": self._task.task_version if self._task else None,
            },
        )

    def _close_env(self) -> None:
        if self._env is None:
            return
        try:
            self._env.close()
        except Exception as e:  # a crashed browser cannot close cleanly; the next reset starts fresh
            log.debug("closing the REAL environment failed: %s", e)
        self._env = None

    def close(self) -> None:
        self._close_env()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
