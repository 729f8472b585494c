"""How a rollout hands episodes to its workers, and keeps each worker on a CPU (no browser needed)."""

from __future__ import annotations

import subprocess
import sys

from halo_agent.envs.base import TaskSpec
from halo_agent.rollout import EpisodeSpec, TaskStickyDispatch


def _plan(tasks: int, attempts: int) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(task=TaskSpec(task_id=f"miniwob.t{t}", env="miniwob", site="miniwob"), task_seed=0,
                    attempt_idx=a, episode_id=f"e{t}-{a}", policy_seed=a)
        for t in range(tasks)
        for a in range(attempts)
    ]


def test_a_worker_runs_one_tasks_attempts_back_to_back():
    dispatch = TaskStickyDispatch(_plan(3, 4))
    got: dict[int, list[str]] = {0: [], 1: []}
    worker = 0
    while True:
        spec = dispatch.next_for(worker)
        if spec is None:
            break
        got[worker].append(spec.episode_id)
        dispatch.done(worker, spec.episode_id)
        worker = 1 - worker  # the two workers finish episodes in turn
    assert got[0] == ["e0-0", "e0-1", "e0-2", "e0-3", "e2-0", "e2-2"]
    assert got[1] == ["e1-0", "e1-1", "e1-2", "e1-3", "e2-1", "e2-3"]
    assert dispatch.next_for(0) is None and dispatch.next_for(1) is None


def test_episodes_of_a_stopped_worker_go_to_the_others():
    dispatch = TaskStickyDispatch(_plan(1, 4))
    first, second = dispatch.next_for(0), dispatch.next_for(0)
    dispatch.done(0, first.episode_id)
    dispatch.give_back(0)  # worker 0 died while running the second
    rest = []
    while (spec := dispatch.next_for(1)) is not None:
        rest.append(spec.episode_id)
        dispatch.done(1, spec.episode_id)
    assert sorted(rest) == sorted({"e0-1", "e0-2", "e0-3"}) and second.episode_id in rest


def test_pin_to_cpu_keeps_the_process_and_its_children_on_one_cpu():
    code = (
        "import os, subprocess, sys\n"
        "from halo_agent.rollout import pin_to_cpu\n"
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "cpu = pin_to_cpu(len(cpus) + 1)\n"
        "assert cpu == cpus[(len(cpus) + 1) % len(cpus)], cpu\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
        " capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(cpu, child)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(maxsplit=1)
    assert out[1].strip() == f"[{out[0]}]"
