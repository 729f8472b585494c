"""The chat server's engine thread: requests that arrive together run as one batch, as vLLM's scheduler runs them.

One thread owns the model. HTTP handler threads ``submit`` work and wait for its answer; the engine thread takes
everything queued (up to ``max_batch`` requests) and runs it: the guided choices together
(:meth:`LocalChatModel.choose_many`: their prompts prefilled as one batch, then each choice walk in turn), and
anything else (plain sampling, prompt logprobs) one request after another, as before.

Before a turn the thread waits up to ``batch_window_ms`` for more requests to arrive, until the batch is as large
as the last one was (at least two): requests sent together a few milliseconds apart run as one batch, and a lone
client's request waits at most the window.
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

from halo_agent.policies.hf_policy import ChoiceRequest, LocalChatModel

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Work:
    choice: ChoiceRequest | None  # a guided choice (batched with others), or
    call: Callable[[], Any] | None  # anything else, run alone
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)


class EngineLoop:
    """Runs ``engine``'s work on one thread, batching guided choices that arrive together; ``stop()`` ends it.

    ``stats``: ``batches`` (engine turns), ``requests``, ``batched_requests`` (those that ran in a turn with
    others), ``largest_batch``, ``busy_seconds``.
    """

    def __init__(self, engine: LocalChatModel, batch_window_ms: float = 10.0, max_batch: int = 8) -> None:
        if max_batch < 1 or batch_window_ms < 0:
            raise ValueError("max_batch must be at least 1 and batch_window_ms at least 0")
        self.engine = engine
        self.batch_window = batch_window_ms / 1000.0
        self.max_batch = max_batch
        self.stats = collections.Counter({"batches": 0, "requests": 0, "batched_requests": 0, "largest_batch": 0})
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
        """``function()``, run on the engine thread between batches."""
        return self._submit(_Work(None, function))

    @property
    def queued(self) -> int:
        """Requests waiting for the engine."""
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

    def _take(self) -> list[_Work] | None:
        """The next batch: what is queued, after waiting the window where others are being served."""
        with self._ready:
            while not self._queue and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return None
            if self.max_batch > 1:
                deadline = time.monotonic() + self.batch_window
                want = min(self.max_batch, max(2, self._last_size))
                while len(self._queue) < want and not self._stopped:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            started = time.perf_counter()
            choices = [w for w in batch if w.choice is not None]
            if choices:
                try:
                    answers = self.engine.choose_many([w.choice for w in choices])
                except Exception as e:  # noqa: BLE001 (every request of the batch fails with it)
                    answers = [e] * len(choices)
                for work, answer in zip(choices, answers):
                    _settle(work.future, answer)
            for work in batch:
                if work.call is not None:
                    try:
                        work.future.set_result(work.call())
                    except Exception as e:  # noqa: BLE001 (the request's own failure, answered to it)
                        work.future.set_exception(e)
            with self._ready:
                self._last_size = len(batch)
                self.busy_seconds += time.perf_counter() - started
                self.stats.update({"batches": 1, "requests": len(batch), "batched_requests": len(batch) if len(batch) > 1 else 0})
                self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        with self._ready:
            for work in self._queue:
                work.future.set_exception(RuntimeError("the engine has stopped"))
            self._queue.clear()


def _settle(future: concurrent.futures.Future, answer: Any) -> None:
    if isinstance(answer, Exception):
        future.set_exception(answer)
    else:
        future.set_result(answer)
