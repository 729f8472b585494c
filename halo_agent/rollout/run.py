"""``run_rollouts``: plan a run, record it in ``runs``, run its episodes and write them to the lake.

Every run upserts its ``runs`` row (status running -> finished | failed |
interrupted). A resumed run keeps its row and runs only the episodes the lake
lacks; it must plan the same episodes as the run it completes. Ctrl-C or SIGTERM
writes what finished and marks the run interrupted.

Candidate rows (``candidates_per_state``) are appended right after the commit of
their episodes' steps, leaving out states the lake already holds candidates for: a
resumed run never duplicates them (a kill between the two commits loses the
candidates of that flush, never its steps).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import signal
import sys
import threading
import time

from halo_data.lake import Lake, LakeError
from halo_data.runs import RunRecord, existing_run, upsert_runs, utc_now
from halo_data.writer import EpisodeWriter

from halo_agent.envs import EnvironmentUnavailable, environment_class
from halo_agent.policies import PolicyUnavailable, check_policy
from halo_agent.rewards import RewardConfig
from halo_agent.rollout.config import EpisodeSpec, RolloutConfig, RolloutError, RunSummary
from halo_agent.rollout.tally import Progress, Tally
from halo_agent.rollout.tasks import plan_episodes, resolve_tasks
from halo_agent.rollout.workers import policy_for, run_in_process, run_in_workers

log = logging.getLogger(__name__)

# Config fields that decide which episodes a run plans: a resume must keep them.
_PLAN_FIELDS = ("env", "tasks", "subset", "sample_size", "rollouts_per_task", "seed", "task_seed", "task_seeds", "split", "task_version", "task_registry", "policy", "model", "adapter")


def default_run_id(config: RolloutConfig) -> str:
    return f"{config.kind}-{config.env}-{utc_now().strftime('%Y%m%dT%H%M%S')}"


def run_rollouts(config: RolloutConfig) -> RunSummary:
    """Run (or resume) a rollout or eval run into the lake; returns what it did."""
    _check_can_start(config)
    tasks = resolve_tasks(config)  # bad task ids fail before anything is written
    run_id = config.run_id or default_run_id(config)
    config, lineage = _pin_cache_snapshot(config, run_id)
    if config.resume and (complete := _complete_run(config, run_id, tasks)) is not None:
        return complete
    # In-process runs build their policy now, so a policy that cannot start (no model, no key) writes nothing.
    local_policy = policy_for(config) if config.workers == 1 and not config.ray_address else None
    lake = Lake.init(config.lake)
    plan = plan_episodes(config, run_id, tasks)
    record, done_ids = _start_record(config, lake, run_id, len(plan))
    record = record.replace(lineage=lineage)
    todo = [spec for spec in plan if spec.episode_id not in done_ids]
    upsert_runs(lake, [record])
    log.info("run %s: %d planned, %d already in the lake, %d to run", run_id, len(plan), len(plan) - len(todo), len(todo))

    tally = Tally(EpisodeWriter(lake, flush_episodes=config.flush_episodes, flush_seconds=config.flush_seconds),
                   Progress(len(todo), config.progress, desc=run_id))
    status = "failed"
    wall0 = time.perf_counter()
    previous_sigterm = None
    if hasattr(signal, "SIGTERM") and threading.current_thread() is threading.main_thread():
        # SIGTERM (a scheduler stopping us) is handled like Ctrl-C: write what finished, mark interrupted.
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        status = _run_episodes(config, run_id, todo, tally, local_policy)
    finally:
        if local_policy is not None:
            local_policy.close()
        tally.progress.close()
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        wall = time.perf_counter() - wall0
        try:
            upsert_runs(lake, [record.replace(status=status, ended_at=utc_now())])
        except Exception:
            log.exception("could not mark run %s %s", run_id, status)
    summary = RunSummary(
        run_id=run_id, lake=str(config.lake), status=status, planned_episodes=len(plan), skipped_episodes=len(plan) - len(todo),
        episodes_written=tally.written, successes=tally.successes, env_errors=tally.env_errors, steps=tally.steps,
        wall_seconds=wall, lake_seconds=tally.lake_seconds, workers=config.workers, candidates=tally.candidates,
    )
    log.info("run %s %s: %s", run_id, status, json.dumps(summary.as_dict()))
    return summary


def _check_can_start(config: RolloutConfig) -> None:
    """Fails now, before anything is written, on a missing browser, policy, environment or a bad reward file."""
    from halo_agent.browser import ensure_environment

    ensure_environment()
    try:
        check_policy(config.policy)
        environment_class(config.env)
    except (PolicyUnavailable, EnvironmentUnavailable) as e:
        raise RolloutError(str(e)) from None
    RewardConfig.load(config.reward_config)  # fail now on a bad reward file, not in every worker
    if config.ray_address and importlib.util.find_spec("ray") is None:
        raise RolloutError("--ray-address needs Ray: pip install 'halo[cluster]'")


def _pin_cache_snapshot(config: RolloutConfig, run_id: str) -> tuple[RolloutConfig, dict[str, int] | None]:
    """A hierarchical policy's cache is read as of one version of ``steps``, fixed here for every worker and recorded
    in the run's lineage; a resumed run keeps the version it started with, so it replays what it replayed before."""
    options = config.policy_options
    if config.policy != "hierarchy" or not options.get("cache"):
        return config, None
    from halo_agent.hierarchy.cache import snapshot_version

    lake = Lake.init(config.lake)
    version = options.get("cache_version")
    if version is None:
        existing = existing_run(lake, run_id) if config.resume else None
        stored = json.loads((existing or {}).get("config") or "{}").get("policy_options", {})
        version = stored.get("cache_version", snapshot_version(lake))
    options = {**options, "lake": options.get("lake") or str(config.lake), "cache_version": int(version)}
    return dataclasses.replace(config, policy_options=options), {"steps": int(version)}


def _changed_plan(stored_config: str | None, config: RolloutConfig) -> list[str]:
    """The plan options (``_PLAN_FIELDS``) in which ``config`` differs from a stored run's config JSON."""
    stored, mine = json.loads(stored_config or "{}"), json.loads(config.to_json())
    return [k for k in _PLAN_FIELDS if k in stored and stored.get(k) != mine.get(k)]


def _complete_run(config: RolloutConfig, run_id: str, tasks) -> RunSummary | None:
    """A resumed run that finished and has every planned episode in the lake: there is nothing to run, so no
    policy is built and its ``runs`` row stays as it is. None for anything else (a run to start or complete, or
    options that changed: the normal path says which), which then resumes as usual."""
    try:
        lake = Lake.open(config.lake)
    except LakeError:
        return None
    con = lake.connect(views=False, tables=("runs", "steps"))  # one connection, two tables: a resume may come often
    try:
        run = con.execute("select status, config from runs where run_id = $r", {"r": run_id}).fetchall()
        done = {r[0] for r in con.execute("select distinct episode_id from steps where run_id = $r", {"r": run_id}).fetchall()} if run else set()
    finally:
        con.close()
    if not run or run[0][0] != "finished":
        return None
    if _changed_plan(run[0][1], config):
        return None
    plan = plan_episodes(config, run_id, tasks)
    if any(spec.episode_id not in done for spec in plan):
        return None
    log.info("run %s: complete, all %d planned episodes in the lake; nothing to run", run_id, len(plan))
    return RunSummary(run_id=run_id, lake=str(config.lake), status="finished", planned_episodes=len(plan),
                      skipped_episodes=len(plan), episodes_written=0, successes=0, env_errors=0, steps=0,
                      wall_seconds=0.0, lake_seconds=0.0, workers=config.workers)


def _start_record(config: RolloutConfig, lake: Lake, run_id: str, planned: int) -> tuple[RunRecord, set[str]]:
    """The run's ``runs`` record at its start, and the episodes already in the lake (a resume)."""
    record = RunRecord(
        run_id=run_id, kind=config.kind, mode=config.effective_mode, env=config.env, policy=config.policy,
        model=config.model, adapter=config.adapter, policy_version=config.policy_version, split=config.split,
        task_version=config.task_version, config=config.to_json(),
        command=list(sys.argv) if config.command is None else config.command,
        planned_episodes=planned, status="running", started_at=utc_now(),
    )
    existing = existing_run(lake, run_id)
    if existing is None:
        return record, set()
    if not config.resume:
        raise RolloutError(f"run {run_id!r} already exists in {config.lake}: pass --resume to complete it, or choose another --run-id")
    changed = _changed_plan(existing.get("config"), config)
    if changed:
        raise RolloutError(f"--resume of {run_id!r} with different {', '.join(changed)} than the run had: use the original options")
    return record.replace(started_at=existing.get("started_at") or record.started_at), lake.episode_ids(run_id)


def _run_episodes(config: RolloutConfig, run_id: str, todo: list[EpisodeSpec], tally: Tally, local_policy) -> str:
    """Runs ``todo`` through ``tally``'s writer and commits what finished; the run's final status."""
    try:
        if todo and config.ray_address:
            from halo_agent.rollout.ray_workers import run_on_ray

            run_on_ray(config, run_id, todo, tally)
        elif todo:
            if config.workers == 1:
                run_in_process(config, run_id, todo, tally.write, local_policy)
            else:
                run_in_workers(config, run_id, todo, tally.write)
        tally.close_writer()
        return "finished"
    except KeyboardInterrupt:
        tally.close_writer()
        log.warning("run %s interrupted: %d episodes written; complete it with --resume --run-id %s", run_id, tally.written, run_id)
        return "interrupted"
    except BaseException:
        try:
            tally.close_writer()
        except Exception:
            log.exception("could not write the finished episodes of run %s", run_id)
        raise


def _raise_keyboard_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt
