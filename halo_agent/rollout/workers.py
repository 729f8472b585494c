"""Where episodes run: in this process, or in a pool of spawned worker processes, each with its own browser.

Workers are spawned, never forked (delta-rs and Playwright do not survive a fork),
so everything sent to them (the config, episode specs) and back (``EpisodeResult``)
is pickled, and ``_worker_main`` is importable from this module. Finished episodes
come back to the parent, whose one writer commits them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
from typing import Any, Callable, Sequence

from halo_agent.envs import environment_class
from halo_agent.policies import make_policy
from halo_agent.rewards import RewardConfig
from halo_agent.rollout.config import EpisodeResult, EpisodeSpec, RolloutConfig
from halo_agent.rollout.episode import EpisodeRunner, first_line
from halo_agent.types import Policy

log = logging.getLogger(__name__)


def env_for(config: RolloutConfig):
    cls = environment_class(config.env)
    options = dict(config.env_options)
    options.setdefault("headless", config.headless)
    if config.task_version is not None:
        options.setdefault("task_version", config.task_version)
    if config.env == "real" and config.task_registry:
        # Workers must run the snapshot's own task JSONs and eval scripts, not the live SDK's.
        options.setdefault("task_registry", config.task_registry)
    return cls(**options)


def policy_for(config: RolloutConfig) -> Policy:
    options = dict(config.policy_options)
    if config.candidates_per_state:
        options.setdefault("n", config.candidates_per_state)  # the candidates come from one call
    return make_policy(
        config.policy,
        model=config.model,
        adapter=config.adapter,
        temperature=config.temperature,
        seed=config.seed,
        **options,
    )


def pin_to_cpu(worker_idx: int) -> int | None:
    """Keep this process, and every process it starts from now on (Playwright's driver, Chromium), on one CPU.

    A browser worker is a chain of processes (Python, Playwright's driver, Chromium's browser,
    renderer and GPU processes) that hand each step to one another; with every worker's chain
    on its own CPU they stop preempting each other. Measured on 2 cores with 2 workers:
    1.55-1.7x the throughput of one worker, against 1.45-1.55x unpinned (``bench/rollout.py``).
    Returns the CPU, or None where affinity cannot be set.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[worker_idx % len(cpus)]
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError) as e:  # not Linux, or not permitted
        log.debug("could not pin worker %d: %s", worker_idx, e)
        return None


def _worker_main(config: RolloutConfig, run_id: str, worker_idx: int, inbox: "mp.Queue", results: "mp.Queue") -> None:
    """A spawned worker: its own browser and policy; episodes in, finished records out."""
    # Ctrl-C is the parent's to handle: it writes what finished and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=os.environ.get("HALO_LOG_LEVEL", "WARNING"))
    from halo_agent.browser import ensure_environment

    ensure_environment()
    if config.pin_workers:
        pin_to_cpu(worker_idx)
    parent = mp.parent_process()
    env = policy = None
    try:
        env = env_for(config)
        policy = policy_for(config)
        runner = EpisodeRunner(config, run_id, env, policy, RewardConfig.load(config.reward_config))
        results.put(("ready", worker_idx, None))
        while True:
            if parent is not None and not parent.is_alive():
                return  # the parent is gone (killed): nothing would write our episodes
            try:
                spec = inbox.get(timeout=1.0)
            except queue.Empty:
                continue
            if spec is None:
                return
            results.put(("episode", worker_idx, runner.run(spec)))
    except BaseException as e:  # report why this worker stopped; the parent decides
        results.put(("fatal", worker_idx, first_line(e)))
    finally:
        close_quietly(policy, env)
        results.put(("exit", worker_idx, None))


class TaskStickyDispatch:
    """Hands out episodes so that a worker runs the attempts of one task back to back.

    The next attempt of the task a worker's page holds is the cheapest episode it can run
    (MiniWoB restarts it in place); a worker that has finished its task's attempts takes the
    next task no other worker holds, and only when none is left joins the task with the most
    attempts remaining.
    """

    def __init__(self, todo: Sequence[EpisodeSpec]):
        self.pending: dict[str, list[EpisodeSpec]] = {}
        for spec in todo:
            self.pending.setdefault(spec.task.task_id, []).append(spec)
        for specs in self.pending.values():
            specs.reverse()  # pop() from the end gives plan order
        self.holds: dict[int, str] = {}
        self.assigned: dict[int, dict[str, EpisodeSpec]] = {}  # worker -> episodes sent, not yet back

    def done(self, worker_idx: int, episode_id: str) -> None:
        self.assigned.get(worker_idx, {}).pop(episode_id, None)

    def give_back(self, worker_idx: int) -> None:
        """A worker stopped: the episodes it was sent and did not finish go to the others."""
        for spec in self.assigned.pop(worker_idx, {}).values():
            self.pending.setdefault(spec.task.task_id, []).append(spec)
        self.holds.pop(worker_idx, None)

    def next_for(self, worker_idx: int) -> EpisodeSpec | None:
        spec = self._pick(worker_idx)
        if spec is not None:
            self.assigned.setdefault(worker_idx, {})[spec.episode_id] = spec
        return spec

    def _pick(self, worker_idx: int) -> EpisodeSpec | None:
        task_id = self.holds.get(worker_idx)
        if not self.pending.get(task_id or ""):
            held = set(self.holds.values())
            free = [t for t, specs in self.pending.items() if specs and t not in held]
            if free:
                task_id = free[0]
            else:
                busy = [t for t, specs in self.pending.items() if specs]
                if not busy:
                    return None
                task_id = max(busy, key=lambda t: len(self.pending[t]))
        self.holds[worker_idx] = task_id
        return self.pending[task_id].pop()


def run_in_workers(config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], write: Callable[[EpisodeResult], None]) -> None:
    """Runs ``todo`` in ``config.workers`` spawned processes, handing each finished episode to ``write``."""
    pool = _WorkerPool(config, run_id, todo, write)
    try:
        pool.run()
    finally:
        pool.stop()


class _WorkerPool:
    """The parent's side of the workers: sends episodes, receives results, notices workers that stop."""

    def __init__(self, config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], write: Callable[[EpisodeResult], None]):
        ctx = mp.get_context("spawn")  # never fork: delta-rs and Playwright do not survive it
        n_workers = min(int(config.workers), len(todo))
        self.results: mp.Queue = ctx.Queue()
        self.inboxes: list[mp.Queue] = [ctx.Queue() for _ in range(n_workers)]
        self.dispatch = TaskStickyDispatch(todo)
        self.write = write
        self.remaining = len(todo)
        self.alive = n_workers
        self.fatal: list[str] = []
        self.procs = [
            ctx.Process(target=_worker_main, args=(config, run_id, i, self.inboxes[i], self.results), name=f"halo-worker-{i}", daemon=True)
            for i in range(n_workers)
        ]
        for p in self.procs:
            p.start()

    def run(self) -> None:
        while self.remaining > 0 and self.alive > 0:
            try:
                message = self.results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in self.procs):
                    break
                continue
            self._handle(*message)
        if self.remaining > 0:
            # drain episodes that arrived while the last workers exited
            while True:
                try:
                    message = self.results.get(timeout=0.5)
                except queue.Empty:
                    break
                self._handle(*message)
        if self.remaining > 0:
            reason = "; ".join(self.fatal) or "workers exited early"
            raise RuntimeError(f"{self.remaining} episode(s) were not run ({reason}); re-run with --resume to complete them")

    def _send_next(self, worker_idx: int) -> None:
        self.inboxes[worker_idx].put(self.dispatch.next_for(worker_idx))  # None: no more work, the worker exits

    def _handle(self, kind: str, worker_idx: int, payload: Any) -> None:
        if kind == "ready":
            # two episodes queued per worker, so it never waits for this process's lake writes
            self._send_next(worker_idx)
            self._send_next(worker_idx)
        elif kind == "episode":
            self.dispatch.done(worker_idx, payload.episode.episode_id)
            self._send_next(worker_idx)
            self.write(payload)
            self.remaining -= 1
        elif kind == "fatal":
            self.fatal.append(f"worker {worker_idx}: {payload}")
            log.error("worker %d stopped: %s", worker_idx, payload)
            self.dispatch.give_back(worker_idx)
        elif kind == "exit":
            self.alive -= 1
            self.dispatch.give_back(worker_idx)

    def stop(self) -> None:
        for p in self.procs:
            p.join(timeout=5 if self.remaining == 0 else 0.5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        # Undelivered episode specs (after an interrupt) must not keep this process alive at exit.
        for q in (*self.inboxes, self.results):
            q.cancel_join_thread()
            q.close()


def run_in_process(config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], write: Callable[[EpisodeResult], None], policy: Policy | None = None) -> None:
    """Runs ``todo`` one after another in this process, with ``policy`` if given (its caller closes it)."""
    own_policy = policy_for(config) if policy is None else None
    env = None
    try:
        env = env_for(config)
        runner = EpisodeRunner(config, run_id, env, policy if policy is not None else own_policy, RewardConfig.load(config.reward_config))
        for spec in todo:
            write(runner.run(spec))
    finally:
        close_quietly(own_policy, env)


def close_quietly(*things: Any) -> None:
    """Closes each policy or environment given; one that fails to close does not stop the others."""
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception as e:
            log.debug("closing %s failed: %s", thing, e)
