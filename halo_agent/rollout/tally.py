"""What a rollout run has written so far: ``Tally`` writes finished episodes (and their candidate rows) to the lake
and counts them; ``Progress`` is the run's progress bar. A Ray worker keeps its own ``Tally`` over its own writer."""

from __future__ import annotations

import dataclasses
import time

from halo_data.writer import EpisodeWriter

from halo_agent.candidates import write_candidates
from halo_agent.rollout.config import EpisodeResult


class Progress:
    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = None
        self.done = 0
        self.successes = 0
        self.steps = 0
        self.started = time.perf_counter()
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)

    def update(self, episode, n_steps: int) -> None:
        self.done += 1
        self.successes += int(bool(episode.success))
        self.steps += n_steps
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            self.bar.set_postfix(success=f"{self.successes}/{self.done}", steps_s=f"{self.steps / elapsed:.1f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclasses.dataclass
class Tally:
    """Writes finished episodes and counts what was written, and the time spent in the lake."""

    writer: EpisodeWriter
    progress: Progress
    written: int = 0
    successes: int = 0
    env_errors: int = 0
    steps: int = 0
    candidates: int = 0
    lake_seconds: float = 0.0
    pending_candidates: list = dataclasses.field(default_factory=list)  # rows whose steps are not committed yet

    def write(self, result: EpisodeResult) -> None:
        t = time.perf_counter()
        self.writer.write_episode(result.episode, result.steps, result.screenshots)
        self.pending_candidates += result.candidates
        if not self.writer.pending_episodes:  # that write flushed: the steps are in, the candidates may follow
            self._write_candidates()
        self.lake_seconds += time.perf_counter() - t
        self.count(result.episode, len(result.steps))

    def count(self, episode, n_steps: int) -> None:
        """Count one finished episode (written here, or by a Ray worker into the same lake)."""
        self.written += 1
        self.successes += int(bool(episode.success))
        self.env_errors += int(episode.error_kind == "env")
        self.steps += n_steps
        self.progress.update(episode, n_steps)

    def close_writer(self) -> None:
        t = time.perf_counter()
        self.writer.close()
        self._write_candidates()
        self.lake_seconds += time.perf_counter() - t

    def _write_candidates(self) -> None:
        if self.pending_candidates:
            self.candidates += write_candidates(self.writer.lake, self.pending_candidates)
            self.pending_candidates = []
