"""MiniWoB++ inside agisdk's vendored BrowserGym, fully offline.

``MiniWoBTask`` is a BrowserGym task (``AbstractBrowserTask``): its setup opens the
task's HTML file from the ``miniwob`` package over ``file://``, seeds it the way
BrowserGym does (``Math.seedrandom``), starts the episode and returns the goal;
its validate reads MiniWoB's own ``WOB_*`` globals, so MiniWoB's reward logic is
the only judge. Importing this module registers every task with agisdk
(``browsergym/miniwob.<name>``, usable through agisdk's ``BrowserEnv`` and
``EnvArgs``) and adds a ``miniwob`` entry to agisdk's ``task_config.VERSION_DIRS``.

``MiniWoBEnv`` drives the same task class from a lean loop: one Chromium per
worker reused across episodes (a fresh context each), no fixed sleeps, BrowserGym's
observation extraction and action code. agisdk's ``BrowserEnv`` instead sleeps
0.5 s per step and relaunches Chromium and a chat window on every reset.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any, Tuple

from agisdk.REAL.browsergym.core.task import AbstractBrowserTask

from halo_agent.browser import BrowserSession
from halo_agent.envs.base import (
    EnvError,
    PageState,
    StepOutcome,
    ActionRunner,
    TaskSpec,
    UnknownTaskError,
    extract_page_state,
)

log = logging.getLogger(__name__)

ENV_NAME = "miniwob"
SITE = "miniwob"
TASK_PREFIX = "miniwob."
VIEWPORT = {"width": 500, "height": 320}  # BrowserGym's MiniWoB viewport
EPISODE_MAX_TIME_MS = 1_000_000  # as BrowserGym: no MiniWoB time limit inside an episode

# Tasks whose instance varies with wall-clock animation even for one seed (BrowserGym marks them too).
NONDETERMINISTIC_TASKS = frozenset(
    {"chase-circle", "moving-items", "simon-says", "drag-circle", "hot-cold", "click-pie", "bisect-angle"}
)

# How episodes are kept apart in a worker's browser:
#   context:  a fresh browser context (and renderer process) per episode: nothing carries over;
#   document: one page per worker, a fresh document per episode (the task's HTML loaded again).
#             MiniWoB's file:// tasks keep no cookies or storage, so only the tab's history
#             carries over; measured several times faster per reset on a loaded 2-core machine.
ISOLATION_LEVELS = ("context", "document")
# With document isolation, a fresh context now and then bounds what a long run accumulates.
CONTEXT_RECYCLE_EPISODES = 100

# Small tasks a random policy solves often: quick end-to-end checks.
SMOKE_TASKS = ("click-test", "click-button", "click-link", "click-dialog", "enter-text", "focus-text", "click-checkboxes", "choose-list")

# Hide MiniWoB's human display (timer, last reward, episode counter) so it is not part of the
# observation, and keep the utterance readable through core.getUtterance.
_HIDE_HUMAN_DISPLAY_JS = r"""() => {
  const ids = ['reward-display', 'click-canvas', 'sync-task-cover'];
  const stored = {};
  let queryCopy = null;
  const hide = () => {
    core.clearTimer();
    document.body.removeEventListener('click', core.canvasDrawClick);
    const query = document.getElementById('query');
    queryCopy = query.cloneNode(true);
    query.innerHTML = '';
    for (const id of ids) {
      const el = document.getElementById(id);
      if (el) { el.remove(); stored[id] = el; }
    }
  };
  const show = () => {
    document.getElementById('query').innerHTML = queryCopy.innerHTML;
    for (const id in stored) document.body.appendChild(stored[id]);
    core.createDisplay();
  };
  const wrap = (name) => {
    const original = core[name];
    core[name] = function (...args) { show(); const out = original.apply(this, args); hide(); return out; };
  };
  wrap('getUtterance');
  wrap('endEpisode');
  wrap('startEpisodeReal');
  hide();
}"""

# BrowserGym's seeding, then the episode's start; answers whether the task is ready at once.
_START_EPISODE_JS = r"""([seed, maxTime]) => {
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  return WOB_TASK_READY;
}"""

_READ_GLOBALS_JS = r"""() => ({
  reward: WOB_REWARD_GLOBAL,
  raw_reward: WOB_RAW_REWARD_GLOBAL,
  reason: WOB_REWARD_REASON,
  done: WOB_DONE_GLOBAL,
  episode_id: WOB_EPISODE_ID,
  ready: WOB_TASK_READY,
})"""

def html_dir() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


@lru_cache(maxsize=1)
def task_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in html_dir().glob("*.html")))


class MiniWoBTask(AbstractBrowserTask):
    """A MiniWoB++ task as a BrowserGym task, scored by MiniWoB's own reward globals."""

    subdomain = ""

    @classmethod
    def get_task_id(cls) -> str:
        return f"{TASK_PREFIX}{cls.subdomain}"

    def __init__(
        self,
        seed: int,
        subdomain: str,
        base_dir: str | None = None,
        episode_max_time: int = EPISODE_MAX_TIME_MS,
        remove_human_display: bool = True,
    ) -> None:
        super().__init__(seed)
        if subdomain not in task_names():
            raise UnknownTaskError(f"unknown MiniWoB task {subdomain!r}")
        self.subdomain = subdomain
        self.task_id = f"{TASK_PREFIX}{subdomain}"
        self.viewport = dict(VIEWPORT)
        # MiniWoB pages update synchronously; HALO's loop waits for a frame instead of a fixed slow-down.
        self.slow_mo = 0
        self.timeout = 5000
        self.url = (Path(base_dir) if base_dir else html_dir()).joinpath(f"{subdomain}.html").resolve().as_uri()
        self.episode_max_time = int(episode_max_time)
        self.remove_human_display = remove_human_display
        self.page = None

    def setup(self, page) -> tuple[str, dict]:
        self.page = page
        page.goto(self.url)
        if self.remove_human_display:
            page.evaluate(_HIDE_HUMAN_DISPLAY_JS)
        # BrowserGym's seeding: the task's RandomState picks the seedrandom seed.
        ready = page.evaluate(_START_EPISODE_JS, [int(self.random.randint(0, 1000000)), self.episode_max_time])
        if not ready:  # a few tasks build their problem asynchronously
            page.wait_for_function("() => WOB_TASK_READY", polling=10)
        return self._goal(), self._info()

    def teardown(self) -> None:
        pass

    def _goal(self) -> str:
        utterance = self.page.evaluate("() => core.getUtterance()")
        return utterance["utterance"] if isinstance(utterance, dict) else str(utterance)

    def _info(self) -> dict[str, Any]:
        return dict(self.page.evaluate(_READ_GLOBALS_JS))

    def validate(self, page, chat_messages) -> Tuple[float, bool, str, dict]:
        if page != self.page:
            return 0.0, True, "", {"error": "the task's page is no longer active"}
        if page.url != self.url:
            return 0.0, True, "", {"error": f"left the task page for {page.url}"}
        info = self._info()
        # BrowserGym's MiniWoB reward: 1 when MiniWoB's raw reward is positive.
        reward = float((info.get("raw_reward") or 0) > 0)
        return reward, bool(info.get("done")), "", info


def register_tasks() -> None:
    """Register every MiniWoB task with agisdk's BrowserGym (idempotent)."""
    from agisdk.REAL.browsergym.core.registration import register_task
    from agisdk.REAL.browsergym.webclones import task_config

    task_config.VERSION_DIRS.setdefault(ENV_NAME, str(html_dir()))
    import gymnasium as gym

    for name in task_names():
        env_id = f"browsergym/{TASK_PREFIX}{name}"
        if env_id in gym.registry:
            continue
        register_task(
            f"{TASK_PREFIX}{name}",
            MiniWoBTask,
            task_kwargs={"subdomain": name},
            nondeterministic=name in NONDETERMINISTIC_TASKS,
        )


register_tasks()


def subdomain_of(task_id: str) -> str:
    name = task_id[len(TASK_PREFIX) :] if task_id.startswith(TASK_PREFIX) else task_id
    if name not in task_names():
        raise UnknownTaskError(
            f"unknown MiniWoB task {task_id!r}: list them with `halo-agent tasks --env miniwob`"
        )
    return name


class MiniWoBEnv:
    """MiniWoB++ episodes in one reused headless Chromium (implements ``halo_agent.envs.base.Environment``)."""

    name = ENV_NAME

    def __init__(
        self,
        headless: bool = True,
        screenshots: bool = True,
        base_dir: str | None = None,
        isolation: str = "document",
        **_: Any,
    ):
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}")
        self.session = BrowserSession(headless=headless)
        self.screenshots = screenshots
        self.base_dir = base_dir
        self.isolation = isolation
        self.actions = ActionRunner()
        self.task: MiniWoBTask | None = None
        self.page = None
        self.goal = ""
        self.state: PageState | None = None  # the latest observation
        self._broken = False
        self._episodes_in_context = 0

    @classmethod
    def list_tasks(cls, **_: Any) -> list[TaskSpec]:
        return [
            TaskSpec(
                task_id=f"{TASK_PREFIX}{name}",
                env=ENV_NAME,
                site=SITE,
                extra={"nondeterministic": name in NONDETERMINISTIC_TASKS},
            )
            for name in task_names()
        ]

    @classmethod
    def subsets(cls) -> dict[str, list[str]]:
        """Named task subsets for ``--subset``."""
        names = task_names()
        return {
            "all": [f"{TASK_PREFIX}{n}" for n in names],
            "smoke": [f"{TASK_PREFIX}{n}" for n in SMOKE_TASKS if n in names],
            "deterministic": [f"{TASK_PREFIX}{n}" for n in names if n not in NONDETERMINISTIC_TASKS],
            "click": [f"{TASK_PREFIX}{n}" for n in names if n.startswith("click-")],
            "form": [f"{TASK_PREFIX}{n}" for n in names if n.startswith(("enter-", "login-", "form-", "focus-", "use-autocomplete"))],
            "email": [f"{TASK_PREFIX}{n}" for n in names if n.startswith("email-inbox")],
        }

    @classmethod
    def task_spec(cls, task_id: str) -> TaskSpec:
        name = subdomain_of(task_id)
        return TaskSpec(task_id=f"{TASK_PREFIX}{name}", env=ENV_NAME, site=SITE)

    def reset(self, task: TaskSpec, task_seed: int) -> PageState:
        from playwright.sync_api import Error as PlaywrightError

        subdomain = subdomain_of(task.task_id)
        try:
            fresh_context = (
                self.isolation == "context"
                or self.page is None
                or self.page.is_closed()
                or self._broken
                or self._episodes_in_context >= CONTEXT_RECYCLE_EPISODES
            )
            if fresh_context:
                self.page = self.session.new_page(VIEWPORT, timeout_ms=5000)
                self._broken = False
                self._episodes_in_context = 0
            self._episodes_in_context += 1
            self.state = None
            self.task = MiniWoBTask(seed=int(task_seed), subdomain=subdomain, base_dir=self.base_dir)
            self.goal, _ = self.task.setup(self.page)
            return self._observe()
        except (PlaywrightError, EnvError) as e:
            self._broken = True
            raise EnvError(f"reset of {task.task_id} failed: {_first_line(e)}") from e

    def _observe(self) -> PageState:
        self.state = extract_page_state(self.page, self.goal, screenshot=self.screenshots)
        return self.state

    def step(self, action: str) -> StepOutcome:
        from playwright.sync_api import Error as PlaywrightError

        if self.task is None or self.page is None:
            raise EnvError("step() before reset()")
        boxes = self.state.extra.get("element_bboxes") if self.state is not None else None
        action_error, messages = self.actions.run(self.page, action, boxes)
        if action_error and ("crash" in action_error.lower() or "closed" in action_error.lower()):
            self._broken = True
            raise EnvError(f"the browser failed during {action!r}: {action_error}")
        try:
            reward, done, _, info = self.task.validate(self.page, [])
            page_state = self._observe()
        except (PlaywrightError, EnvError) as e:
            self._broken = True
            raise EnvError(f"the page failed after {action!r}: {_first_line(e)}") from e
        infeasible = any(role == "infeasible" for role, _ in messages)
        if messages:
            info = {**info, "messages": messages}
        return StepOutcome(
            page=page_state,
            reward=float(reward),
            terminated=bool(done) or infeasible,
            truncated=False,
            action_error=action_error,
            raw_reward=float(info.get("raw_reward") or 0.0),
            info=info,
        )

    def close(self) -> None:
        self.session.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
