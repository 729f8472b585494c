"""The chat server's engine thread: continuous batching of guided choices, as vLLM's scheduler batches requests.

One thread owns the model. HTTP handler threads ``submit`` work and wait for its answer. The engine thread keeps
the guided choices in progress (at most ``max_batch``) and, turn after turn, admits what has arrived (its prompts
prefilled as one batch per adapter, :meth:`LocalChatModel.start_choices`) and advances every request's choice walk
one forward, the walks of one adapter in one padded forward (:meth:`LocalChatModel.step_choices`): a request that
arrives while others are being drawn joins them at the next forward, and one that is answered leaves. Anything
else (plain sampling, prompt logprobs, loading an adapter) runs alone, in order of arrival, once the requests
before it are answered: nothing changes the weights under a walk.

When the engine is idle it waits up to ``batch_window_ms`` after a request arrives for more, until as many are
queued as it last admitted together (at least two), so requests sent a few milliseconds apart share their prefill.
``max_batch=1`` runs every request alone, in order of arrival, as the server did with a lock.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

from halo_agent.policies.hf_policy import ChoiceJob, ChoiceRequest, LocalChatModel

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Work:
    choice: ChoiceRequest | None  # a guided choice (batched with others), or
    call: Callable[[], Any] | None  # anything else, run alone
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)


class EngineLoop:
    """Runs ``engine``'s work on one thread, the guided choices continuously batched; ``stop()`` ends it.

    ``stats``: ``batches`` (engine turns), ``requests``, ``batched_requests`` (those that shared a forward with
    another request), ``largest_batch`` (the most requests one forward served), ``walk_forwards`` and
    ``walk_rows`` (forwards that advanced choice walks, and the walks they advanced); ``busy_seconds``.
    """

    def __init__(self, engine: LocalChatModel, batch_window_ms: float = 10.0, max_batch: int = 8) -> None:
        if max_batch < 1 or batch_window_ms < 0:
            raise ValueError("max_batch must be at least 1 and batch_window_ms at least 0")
        self.engine = engine
        self.batch_window = batch_window_ms / 1000.0
        self.max_batch = max_batch
        self.stats = collections.Counter({"batches": 0, "requests": 0, "batched_requests": 0, "largest_batch": 0,
                                          "walk_forwards": 0, "walk_rows": 0})
        self.busy_seconds = 0.0
        self._queue: collections.deque[_Work] = collections.deque()
        self._ready = threading.Condition()
        self._last_size = 1
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="chat-engine", daemon=True)
        self._thread.start()

    def choose(self, request: ChoiceRequest) -> Any:
        """A guided choice's ``GenerationBatch`` (raises what the engine raised for it)."""
        return self._submit(_Work(request, None))

    def call(self, function: Callable[[], Any]) -> Any:
        """``function()``, run on the engine thread once the requests before it are answered."""
        return self._submit(_Work(None, function))

    @property
    def queued(self) -> int:
        """Requests waiting to be admitted."""
        with self._ready:
            return len(self._queue)

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
        self._thread.join(timeout=30)

    def _submit(self, work: _Work) -> Any:
        with self._ready:
            if self._stopped:
                raise RuntimeError("the engine has stopped")
            self._queue.append(work)
            self._ready.notify_all()
        return work.future.result()

    def _take(self, active: int) -> list[_Work] | None:
        """What to admit this turn: the guided choices at the head of the queue, while fewer than ``max_batch``
        are in progress; or, with none in progress, one call at the head. Idle, it waits for work, then the window."""
        with self._ready:
            if not active:
                while not self._queue and not self._stopped:
                    self._ready.wait()
                if not self._stopped and self.max_batch > 1:
                    deadline = time.monotonic() + self.batch_window
                    want = min(self.max_batch, max(2, self._last_size))
                    while len(self._queue) < want and not self._stopped:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._ready.wait(left)
            if self._stopped:
                return None
            if not active and self._queue and self._queue[0].call is not None:
                return [self._queue.popleft()]
            taken = []
            while self._queue and self._queue[0].choice is not None and active + len(taken) < self.max_batch:
                taken.append(self._queue.popleft())
            if taken:
                self._last_size = len(taken)
            return taken

    def _run(self) -> None:
        active: list[tuple[_Work, ChoiceJob]] = []
        while (taken := self._take(len(active))) is not None:
            started = time.perf_counter()
            counts: collections.Counter = collections.Counter()
            if taken and taken[0].call is not None:
                work = taken[0]
                try:
                    work.future.set_result(work.call())
                except Exception as e:  # noqa: BLE001 (the request's own failure, answered to it)
                    work.future.set_exception(e)
                counts.update(requests=1)
            else:
                if taken:
                    try:
                        jobs = self.engine.start_choices([w.choice for w in taken])
                    except Exception as e:  # noqa: BLE001 (the engine itself failed: each request admitted fails with it)
                        log.exception("the engine failed to admit %d requests", len(taken))
                        jobs = [ChoiceJob(w.choice) for w in taken]
                        for job in jobs:
                            job.fail(e)
                    active += zip(taken, jobs)
                    counts.update(requests=len(taken))
                    together = collections.Counter(job.adapter for job in jobs if job.batched)  # prefilled as one batch
                    self.stats["largest_batch"] = max([self.stats["largest_batch"], 1, *together.values()])
                stepping = [job for _, job in active if not job.done]
                if stepping:
                    try:
                        sizes = self.engine.step_choices(stepping)
                    except Exception as e:  # noqa: BLE001 (the engine itself failed: each request in progress fails with it)
                        log.exception("the engine failed a step of %d requests", len(stepping))
                        sizes = []
                        for job in stepping:
                            job.fail(e)
                    counts.update(walk_forwards=len(sizes), walk_rows=sum(sizes))
                    self.stats["largest_batch"] = max([self.stats["largest_batch"], *sizes])
                still = []
                for work, job in active:
                    if job.done:
                        counts.update(batched_requests=int(job.batched))
                        _settle(work.future, job.answer)
                    else:
                        still.append((work, job))
                active = still
            with self._ready:
                self.busy_seconds += time.perf_counter() - started
                self.stats.update(batches=1, **counts)
        with self._ready:
            for work, _ in active:
                work.future.set_exception(RuntimeError("the engine has stopped"))
            for work in self._queue:
                work.future.set_exception(RuntimeError("the engine has stopped"))
            self._queue.clear()


def _settle(future: concurrent.futures.Future, answer: Any) -> None:
    if isinstance(answer, Exception):
        future.set_exception(answer)
    else:
        future.set_result(answer)
