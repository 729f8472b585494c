"""MiniWoB++ inside agisdk's vendored BrowserGym, fully offline.

``MiniWoBTask`` is a BrowserGym task (``AbstractBrowserTask``): its setup opens the
task's HTML file from the ``miniwob`` package over ``file://``, seeds it the way
BrowserGym does (``Math.seedrandom``), starts the episode and returns the goal;
its validate reads MiniWoB's own ``WOB_*`` globals, so MiniWoB's reward logic is
the only judge. Importing this module registers every task with agisdk
(``browsergym/miniwob.<name>``, usable through agisdk's ``BrowserEnv`` and
``EnvArgs``) and adds a ``miniwob`` entry to agisdk's ``task_config.VERSION_DIRS``.

``MiniWoBEnv`` drives the same task class from a lean loop: one Chromium per
worker reused across episodes (see ``ISOLATION_LEVELS`` for how episodes are kept
apart), no fixed sleeps, BrowserGym's observation extraction and action code.
agisdk's ``BrowserEnv`` instead sleeps 0.5 s per step and relaunches Chromium and a
chat window on every reset.
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
    SUBSETS_WITH_COORDINATES,
    action_set,
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
#   episode:  as document, except that the next episode of the same task starts in the document
#             that holds it, the way MiniWoB++'s own environment resets (``core.startEpisodeReal``
#             with a new seed, no reload), for the tasks verified to restart into exactly the
#             page a fresh load gives (``restartable_tasks``). Loading a task's page costs
#             ~130 ms of CPU across Chromium's processes; a restart costs a few ms.
ISOLATION_LEVELS = ("context", "document", "episode")
DEFAULT_ISOLATION = "episode"
RESTART_FILE = Path(__file__).resolve().parent.parent / "configs" / "miniwob_restart.json"
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
_SEED_AND_START = """
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  return WOB_TASK_READY;"""
_START_EPISODE_JS = "([seed, maxTime]) => {" + _SEED_AND_START + "\n}"

# MiniWoB++'s own reset in a document that already holds the task: drop BrowserGym's marks
# (so element ids are handed out from 0 again, as on a fresh load), blur, then seed and start
# exactly as a fresh load does.
_RESTART_EPISODE_JS = r"""([attr, seed, maxTime]) => {
  for (const el of document.querySelectorAll('*')) {
    el.removeAttribute(attr);
    el.removeAttribute('browsergym_visibility_ratio');
    el.removeAttribute('browsergym_set_of_marks');
  }
  delete window.browsergym_elem_counter;
  delete window.browsergym_frame_id_generator;
  if (document.activeElement && document.activeElement !== document.body) document.activeElement.blur();""" + _SEED_AND_START + "\n}"

# Wait until the page's animations have finished: jQuery's effects (the accordions, slides and fades of MiniWoB's
# widgets) and the document's CSS and Web Animations of finite length, polled every 10 ms, for at most capMs.
# Answers the milliseconds waited, or -1 where something still ran at the cap.
_SETTLE_JS = r"""async (capMs) => {
  const start = performance.now();
  const running = () =>
    (window.jQuery && jQuery.timers && jQuery.timers.length > 0) ||
    document.getAnimations().some(a => a.playState === 'running' && a.effect
                                       && Number.isFinite(a.effect.getComputedTiming().endTime));
  while (running()) {
    if (performance.now() - start >= capMs) return -1;
    await new Promise(resolve => setTimeout(resolve, 10));
  }
  return performance.now() - start;
}"""
# The longest wait for a page to settle after an action: MiniWoB's effects run 200-600 ms (jQuery's "fast" to "slow").
DEFAULT_SETTLE_MS = 1000
# What counts as a success, from MiniWoB's raw reward in [-1, 1]. positive: above 0, BrowserGym's rule and the
# default. full: 1, every part of the answer right. They differ where MiniWoB gives partial credit: the checkbox
# tasks score +1 per box right and -1 per box wrong, over the boxes, so under "positive" an answer with most boxes
# right succeeds, and clicking Submit before any box does whenever fewer than half of them are asked for.
SUCCESS_RULES = ("positive", "full")


def check_success_rule(success: str) -> str:
    if success not in SUCCESS_RULES:
        raise ValueError(f"success must be positive (raw reward above 0) or full (raw reward 1), got {success!r}")
    return success

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


def page_folder(pages: str | Path, into: str | Path) -> str:
    """A folder under ``into`` holding the MiniWoB-style pages (``*.html``) of ``pages`` beside MiniWoB's own
    ``core`` scripts, which the pages load as ``../core/core.js``: pass it as ``MiniWoBEnv(base_dir=...)``."""
    import os
    import shutil

    root = Path(into)
    (root / "miniwob").mkdir(parents=True, exist_ok=True)
    if not (root / "core").exists():
        os.symlink(html_dir().parent / "core", root / "core")
    for page in Path(pages).glob("*.html"):
        shutil.copy(page, root / "miniwob" / page.name)
    return str(root / "miniwob")


@lru_cache(maxsize=8)
def task_names(base_dir: str | None = None) -> tuple[str, ...]:
    """The tasks of MiniWoB's own pages, or of a folder of MiniWoB-style pages (``base_dir``) beside its ``core``."""
    return tuple(sorted(p.stem for p in (Path(base_dir) if base_dir else html_dir()).glob("*.html")))


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
        success: str = "positive",
    ) -> None:
        super().__init__(seed)
        if subdomain not in task_names(base_dir):
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
        self.success = check_success_rule(success)
        self.page = None

    def setup(self, page) -> tuple[str, dict]:
        self.page = page
        page.goto(self.url)
        if self.remove_human_display:
            page.evaluate(_HIDE_HUMAN_DISPLAY_JS)
        # BrowserGym's seeding: the task's RandomState picks the seedrandom seed.
        ready = page.evaluate(_START_EPISODE_JS, [int(self.random.randint(0, 1000000)), self.episode_max_time])
        return self._started(ready)

    def restart(self, page) -> tuple[str, dict]:
        """A new episode in the document that already holds this task (MiniWoB++'s own reset).

        The same seed gives the same instance as ``setup`` only for tasks whose problem
        generator rebuilds all of their state: see ``restartable_tasks``.
        """
        from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE

        self.page = page
        page.mouse.move(0, 0)  # no hover left on the previous episode's last target
        ready = page.evaluate(
            _RESTART_EPISODE_JS, [BROWSERGYM_ID_ATTRIBUTE, int(self.random.randint(0, 1000000)), self.episode_max_time]
        )
        return self._started(ready)

    def _started(self, ready: bool) -> tuple[str, dict]:
        if not ready:  # a few tasks build their problem asynchronously
            self.page.wait_for_function("() => WOB_TASK_READY", polling=10)
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
        # BrowserGym's MiniWoB reward: 1 when MiniWoB's raw reward is positive; under "full", only when it is 1.
        raw = info.get("raw_reward") or 0
        reward = float(raw >= 1.0 if self.success == "full" else raw > 0)
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


@lru_cache(maxsize=1)
def restartable_tasks() -> frozenset[str]:
    """Tasks whose in-document restart was verified to give exactly a fresh load's page.

    Read from ``configs/miniwob_restart.json``, written by
    ``python -m halo_agent.envs.miniwob verify-restart --write`` for one version of the
    ``miniwob`` package; under any other version no task restarts in place.
    """
    import importlib.metadata
    import json

    try:
        data = json.loads(RESTART_FILE.read_text())
    except (OSError, ValueError) as e:
        log.warning("no verified MiniWoB restart list (%s): every episode loads its page", e)
        return frozenset()
    installed = importlib.metadata.version("miniwob")
    if data.get("miniwob_version") != installed:
        log.warning(
            "the MiniWoB restart list was verified with miniwob %s, not %s: every episode loads its page "
            "(re-verify with `python -m halo_agent.envs.miniwob verify-restart --write`)",
            data.get("miniwob_version"), installed,
        )
        return frozenset()
    return frozenset(data.get("tasks", ()))


def subdomain_of(task_id: str, base_dir: str | None = None) -> str:
    name = task_id[len(TASK_PREFIX) :] if task_id.startswith(TASK_PREFIX) else task_id
    if name not in task_names(base_dir):
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
        isolation: str = DEFAULT_ISOLATION,
        settle_ms: int = DEFAULT_SETTLE_MS,
        success: str = "positive",
        **_: Any,
    ):
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}")
        if not isinstance(settle_ms, int) or isinstance(settle_ms, bool) or settle_ms < 0:
            raise ValueError(f"settle_ms must be a whole number of milliseconds, 0 (observe at once) or more, got {settle_ms!r}")
        self.success = check_success_rule(success)
        self.session = BrowserSession(headless=headless)
        self.screenshots = screenshots
        self.base_dir = base_dir
        self.isolation = isolation
        # After each action and reset, wait (up to this long) for the page's animations to end before the reward is
        # read and the page observed: a click on an accordion header mid-animation does what the policy's speed
        # decides, so without the wait one action sequence can succeed or fail with the machine's load.
        self.settle_ms = settle_ms
        self.actions = ActionRunner(action_set(SUBSETS_WITH_COORDINATES))
        self.task: MiniWoBTask | None = None
        self.page = None
        self.goal = ""
        self.state: PageState | None = None  # the latest observation
        self._broken = False
        self._episodes_in_context = 0
        self.restarts = 0  # episodes started in place (isolation=episode)

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

        subdomain = subdomain_of(task.task_id, self.base_dir)
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
            restart = (
                self.isolation == "episode"
                and not fresh_context
                and self.task is not None
                and self.task.subdomain == subdomain
                and subdomain in restartable_tasks()
                and self.page.url == self.task.url
            )
            self._start(subdomain, int(task_seed), restart)
            self._settle()
            return self._observe()
        except (PlaywrightError, EnvError) as e:
            self._broken = True
            raise EnvError(f"reset of {task.task_id} failed: {_first_line(e)}") from e

    def _start(self, subdomain: str, task_seed: int, restart: bool) -> None:
        self._episodes_in_context += 1
        self.state = None
        self.task = MiniWoBTask(seed=task_seed, subdomain=subdomain, base_dir=self.base_dir, success=self.success)
        if restart:
            self.goal, _ = self.task.restart(self.page)
            self.restarts += 1
        else:
            self.goal, _ = self.task.setup(self.page)

    def _settle(self) -> bool:
        """Wait for the page's animations to end (up to ``settle_ms``); False where they still ran at the cap."""
        if not self.settle_ms:
            return True
        waited = self.page.evaluate(_SETTLE_JS, self.settle_ms)
        if waited < 0:
            log.debug("%s: animations still running after %d ms", self.task.task_id if self.task else "page", self.settle_ms)
        return waited >= 0

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
            settled = self._settle()
            reward, done, _, info = self.task.validate(self.page, [])
            if not settled:
                info = {**info, "unsettled_ms": self.settle_ms}
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


# ------------------------------------------------------------------ verifying in-document restarts


# Chromium's AXTree of a restarted page can depend on what the page showed before (text in
# <label>s, seen for some seeds only), so a task passes only if every one of these seeds does.
VERIFY_SEEDS = (3, 7, 11, 17, 23, 42, 99, 123)


def _difference(fresh: PageState, again: PageState) -> str | None:
    """What differs between two observations of what should be the same instance, or None."""
    if fresh.goal != again.goal:
        return "goal"
    if fresh.axtree != again.axtree:
        import difflib

        changed = [line for line in difflib.unified_diff(fresh.axtree.splitlines(), again.axtree.splitlines(), lineterm="", n=0)
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        return "AXTree: " + " | ".join(s.strip() for s in changed[:4])
    if fresh.screenshot != again.screenshot:
        return "pixels"
    return None


def verify_restart(names: list[str], seeds: tuple[int, ...] = VERIFY_SEEDS, steps: int = 6, policy_seed: int = 0) -> dict[str, str | None]:
    """Whether restarting each task in place gives exactly the page a fresh load gives.

    For each seed, in a new page: load the task with that seed and observe it; take up to ``steps``
    random actions (the random policy's choices) and restart in place with the same seed;
    then restart with another seed, take random actions again, and restart with the first
    seed. A task passes when both restarts show exactly the freshly loaded page: the same
    goal, AXTree text and screenshot bytes, for every seed. Returns task -> None (passes)
    or what differed.
    """
    import random

    from halo_agent.policies.random_policy import action_for

    rng = random.Random(policy_seed)
    env = MiniWoBEnv(isolation="document")

    def play() -> None:
        page = env._observe()
        for _ in range(steps):
            if not page.elements:
                return
            outcome = env.step(action_for(rng.choice(list(page.elements)), rng))
            if outcome.terminated:
                return
            page = outcome.page

    results: dict[str, str | None] = {}
    try:
        for name in names:
            spec = MiniWoBEnv.task_spec(name)
            why = None
            for seed in seeds:
                try:
                    # a new page each time: how a page serialises can depend on what it showed before
                    env._broken = True
                    fresh = env.reset(spec, seed)
                    for other in (seed, seed + 7919):
                        if other != seed:
                            env._start(name, other, restart=True)
                        play()
                        env._start(name, seed, restart=True)
                        why = _difference(fresh, env._observe())
                        if why:
                            why = f"seed {seed}, after an episode of seed {other}: {why}"
                            break
                except Exception as e:  # a task that cannot restart cleanly does not pass
                    why = f"seed {seed}: {type(e).__name__}: {_first_line(e)}"
                    env._broken = True
                if why:
                    break
            results[name] = why
            log.info("%s: %s", name, why or "restarts exactly")
    finally:
        env.close()
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m halo_agent.envs.miniwob verify-restart [--write] [--tasks a,b] [--seeds 3,17] [--steps 6]``"""
    import argparse
    import importlib.metadata
    import json

    parser = argparse.ArgumentParser(prog="python -m halo_agent.envs.miniwob")
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify-restart", help="check which tasks restart in place into exactly a fresh load's page")
    verify.add_argument("--tasks", help="comma-separated task names (default: every deterministic task)")
    verify.add_argument("--seeds", default=",".join(map(str, VERIFY_SEEDS)), help="task seeds to compare (default: %(default)s)")
    verify.add_argument("--steps", type=int, default=6, help="random actions taken between restarts (default: 6)")
    verify.add_argument("--write", action="store_true", help=f"write the passing tasks to {RESTART_FILE.name}")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = [subdomain_of(t.strip()) for t in args.tasks.split(",")] if args.tasks else [
        n for n in task_names() if n not in NONDETERMINISTIC_TASKS
    ]
    seeds = tuple(int(s) for s in args.seeds.split(","))
    results = verify_restart(names, seeds=seeds, steps=args.steps)
    passing = sorted(n for n, why in results.items() if why is None)
    print(f"{len(passing)}/{len(results)} tasks restart in place exactly")
    for name, why in sorted(results.items()):
        if why:
            print(f"  {name}: {why}")
    if args.write:
        RESTART_FILE.write_text(json.dumps({
            "miniwob_version": importlib.metadata.version("miniwob"),
            "seeds": list(seeds),
            "steps": args.steps,
            "tasks": passing,
        }, indent=1) + "\n")
        print(f"wrote {RESTART_FILE}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
