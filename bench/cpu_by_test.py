"""A pytest plugin that charges each test the CPU time of every process it ran: the worker, its servers, its browsers.

    .venv/bin/python -m bench suite-time --cpu-by-test      # loads it with ``-p bench.cpu_by_test``

Each pytest-xdist worker (or the single pytest process) moves itself into a cgroup of its own under the cpuacct
hierarchy (cgroup v1 ``cpuacct`` or the v2 unified one); processes it starts inherit the group, wherever they are
re-parented, so the group's CPU counter read before and after a test is that test's whole cost: setup (a
module-scoped server built for it), call and teardown. Rows go to the JSON-lines file named by
``HALO_CPU_BY_TEST`` (one per worker: ``<file>.<worker>``). Needs root; without a writable cgroup it says so once
and records nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = Path("/sys/fs/cgroup/unified")


class _Group:
    """One cgroup this process moved into, and its CPU counter in seconds."""

    def __init__(self, name: str):
        if (_V1 / "cpuacct.usage").exists():
            self.path, self._read = _V1 / name, lambda p: int((p / "cpuacct.usage").read_text()) / 1e9
        elif (_V2 / "cgroup.procs").exists():
            self.path = _V2 / name
            self._read = lambda p: int((p / "cpu.stat").read_text().split()[1]) / 1e6  # usage_usec
        else:
            raise OSError("no cpuacct cgroup hierarchy under /sys/fs/cgroup")
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float:
        return self._read(self.path)


class CpuByTest:
    def __init__(self, out: Path, worker: str):
        self.group = _Group(f"halo-suite-{os.getppid()}-{worker}")
        self.out = out.with_name(f"{out.name}.{worker}")
        self.worker = worker
        self.rows: list[dict] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall, start = self.group.seconds(), time.monotonic(), time.time()
        yield
        self.rows.append({"test": item.nodeid, "cpu_seconds": round(self.group.seconds() - cpu, 2),
                          "wall_seconds": round(time.monotonic() - wall, 2), "worker": self.worker, "start": round(start, 2)})

    def pytest_unconfigure(self, config):
        self.out.write_text("".join(json.dumps(row) + "\n" for row in self.rows))


def pytest_configure(config):
    out = os.environ.get("HALO_CPU_BY_TEST")
    if not out:
        return
    # This process's own xdist worker id (not PYTEST_XDIST_WORKER, which a pytest started by a worker's test inherits).
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        return  # the controller runs no test; its workers each load this plugin
    try:
        config.pluginmanager.register(CpuByTest(Path(out), worker or "main"), "halo-cpu-by-test")
    except OSError as err:
        print(f"cpu-by-test: no cgroup to count in ({err}); nothing recorded")


def collect(out: Path) -> list[dict]:
    """Every worker's rows, most CPU first."""
    rows = [json.loads(line) for part in sorted(out.parent.glob(f"{out.name}.*")) for line in part.read_text().splitlines()]
    return sorted(rows, key=lambda row: -row["cpu_seconds"])


def by_worker(rows: list[dict]) -> list[dict]:
    """Each worker's tests, busy seconds and last end, from the earliest start: where the run's tail is."""
    if not rows or "start" not in rows[0]:
        return []
    t0 = min(row["start"] for row in rows)
    workers: dict[str, dict] = {}
    for row in rows:
        entry = workers.setdefault(row["worker"], {"worker": row["worker"], "tests": 0, "busy_seconds": 0.0, "end_seconds": 0.0})
        entry["tests"] += 1
        entry["busy_seconds"] += row["wall_seconds"]
        entry["end_seconds"] = max(entry["end_seconds"], row["start"] - t0 + row["wall_seconds"])
    return sorted(({**w, "busy_seconds": round(w["busy_seconds"], 1), "end_seconds": round(w["end_seconds"], 1)}
                   for w in workers.values()), key=lambda w: w["worker"])


def by_module(rows: list[dict]) -> list[dict]:
    """CPU and wall seconds summed per test module, most CPU first."""
    modules: dict[str, dict] = {}
    for row in rows:
        name = row["test"].split("::", 1)[0]
        entry = modules.setdefault(name, {"module": name, "tests": 0, "cpu_seconds": 0.0, "wall_seconds": 0.0})
        entry["tests"] += 1
        entry["cpu_seconds"] += row["cpu_seconds"]
        entry["wall_seconds"] += row["wall_seconds"]
    return sorted(({**m, "cpu_seconds": round(m["cpu_seconds"], 1), "wall_seconds": round(m["wall_seconds"], 1)}
                   for m in modules.values()), key=lambda m: -m["cpu_seconds"])


def remove_groups() -> None:
    """Remove the suite's emptied cgroups (a group still holding a process stays)."""
    for root in (_V1, _V2):
        for group in root.glob("halo-suite-*"):
            try:
                group.rmdir()
            except OSError:
                pass
