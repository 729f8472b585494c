"""Episodes fanned out over a Ray cluster: each Ray worker runs its own browser and writes to the lake itself.

    halo-agent rollout --ray-address auto --workers 16 --lake s3://bucket/halo ...

The driver plans the run as it does locally (the same deterministic episode ids),
hands episodes to ``--workers`` Ray actors (the attempts of one task back to back, as
the local pool does) and counts what they report. Each actor commits its finished
episodes through its own ``EpisodeWriter``, so screenshots never travel through the
driver; the lake (an ``s3://`` URI, or a folder every node shares) sees optimistic
Delta commits from many writers, which it is built for. The lake is the record: at the
end the driver checks which planned episodes it holds, and any an actor lost (a node
gone before its flush) are left to ``--resume``, which runs exactly those.

``--ray-address local`` starts a Ray instance on this machine for the run. Ray runs its
workers at niceness 15; on a cluster whose nodes do other work too, start the nodes with
``RAY_worker_niceness=0 ray start ...`` so the browsers get their share of the CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Sequence

from halo_data.lake import Lake

from halo_agent.rollout.config import EpisodeSpec, RolloutConfig, RolloutError
from halo_agent.rollout.episode import first_line
from halo_agent.rollout.workers import TaskStickyDispatch, close_quietly, env_for, pin_to_cpu, policy_for

log = logging.getLogger(__name__)

IN_FLIGHT_PER_WORKER = 2  # the next episode is queued while one runs, as in the local pool


class RolloutActor:
    """One Ray worker: its own browser and policy; runs episodes and commits them to the lake."""

    def __init__(self, config: RolloutConfig, run_id: str, worker_idx: int):
        from halo_data.writer import EpisodeWriter

        from halo_agent.browser import ensure_environment
        from halo_agent.rewards import RewardConfig
        from halo_agent.rollout.episode import EpisodeRunner
        from halo_agent.rollout.tally import Progress, Tally

        logging.basicConfig(level=os.environ.get("HALO_LOG_LEVEL", "WARNING"))
        ensure_environment()
        if config.pin_workers:
            pin_to_cpu(worker_idx)
        self.env = env_for(config)
        self.policy = policy_for(config)
        self.runner = EpisodeRunner(config, run_id, self.env, self.policy, RewardConfig.load(config.reward_config))
        writer = EpisodeWriter(Lake.open(config.lake), flush_episodes=config.flush_episodes, flush_seconds=config.flush_seconds)
        self.tally = Tally(writer, Progress(0, False, run_id))

    def run(self, spec: EpisodeSpec) -> tuple[Any, int]:
        """Run one episode and buffer it (a flush may commit it); its record and step count go back."""
        result = self.runner.run(spec)
        self.tally.write(result)
        return result.episode, len(result.steps)

    def close(self) -> tuple[float, int]:
        """Commit what is buffered and close the browser; the seconds spent in the lake and candidates written."""
        try:
            self.tally.close_writer()
        finally:
            close_quietly(self.policy, self.env)
        return self.tally.lake_seconds, self.tally.candidates


def connect(address: str, workers: int) -> bool:
    """Join the Ray cluster at ``address`` (``local``: start one here); True when this call connected."""
    import ray

    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address == "local":
        # Ray starts workers at niceness 15 (its raylet first): a browser worker then loses the
        # CPU to anything else on the machine. This instance runs only the rollout.
        options.update(num_cpus=workers, include_dashboard=False, _system_config={"worker_niceness": 0})
    else:
        options["address"] = address
    try:
        ray.init(**options)
    except ConnectionError as e:
        raise RolloutError(f"no Ray cluster at {address}: start one (`ray start --head`) or pass --ray-address HOST:PORT ({first_line(e)})") from None
    return True


def run_on_ray(config: RolloutConfig, run_id: str, todo: Sequence[EpisodeSpec], tally) -> None:
    """Runs ``todo`` on Ray actors that write to the lake; ``tally`` counts what they report."""
    import ray

    lake: Lake = tally.writer.lake
    # Actors start in their own working folders: a local lake must be named absolutely.
    root = str(Path(lake.root).resolve()) if lake.is_local else lake.root
    connected = connect(config.ray_address or "auto", int(config.workers))
    try:
        actor_cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutActor)
        n = min(int(config.workers), len(todo))
        actors = [actor_cls.remote(dataclasses.replace(config, lake=root), run_id, i) for i in range(n)]
        fatal = _dispatch(actors, todo, tally)
        missing = [s for s in todo if s.episode_id not in lake.episode_ids(run_id)]
        if missing:
            reason = "; ".join(fatal) or "workers stopped early"
            raise RuntimeError(f"{len(missing)} episode(s) were not run ({reason}); re-run with --resume to complete them")
    finally:
        if connected:
            ray.shutdown()


def _dispatch(actors: list, todo: Sequence[EpisodeSpec], tally) -> list[str]:
    """Keep every actor busy until the plan is done; close them all (committing what finished). Their errors."""
    import ray

    dispatch = TaskStickyDispatch(todo)
    in_flight: dict[Any, tuple[int, EpisodeSpec]] = {}
    dead: dict[int, str] = {}

    def send(i: int) -> None:
        spec = dispatch.next_for(i)
        if spec is not None:
            in_flight[actors[i].run.remote(spec)] = (i, spec)

    try:
        for i in range(len(actors)):
            for _ in range(IN_FLIGHT_PER_WORKER):
                send(i)
        while in_flight:
            (ref,), _ = ray.wait(list(in_flight), num_returns=1)
            i, spec = in_flight.pop(ref)
            try:
                episode, n_steps = ray.get(ref)
            except ray.exceptions.RayError as e:
                # Its episodes are not handed to another actor: one it committed before failing would
                # run twice. What it did not commit is found missing at the end, for --resume.
                if i not in dead:
                    dead[i] = f"worker {i}: {first_line(e)}"
                    log.error("Ray %s", dead[i])
                continue
            dispatch.done(i, spec.episode_id)
            if i not in dead:
                send(i)
            tally.count(episode, n_steps)
    finally:
        for ref in in_flight:  # an interrupt: episodes not started are not started
            ray.cancel(ref)
        _close_actors(actors, dead, tally)
    return list(dead.values())


def _close_actors(actors: list, dead: dict[int, str], tally) -> None:
    import ray

    closing = {i: a.close.remote() for i, a in enumerate(actors) if i not in dead}
    seconds = []
    for i, ref in closing.items():
        try:
            lake_seconds, candidates = ray.get(ref)
        except ray.exceptions.RayError as e:
            dead[i] = f"worker {i}: {first_line(e)}"
            continue
        seconds.append(lake_seconds)
        tally.candidates += candidates
    # Each actor writes in parallel with the others: the lake's share is of one worker's time.
    tally.lake_seconds += sum(seconds) / max(len(seconds), 1)
    for a in actors:
        ray.kill(a)
