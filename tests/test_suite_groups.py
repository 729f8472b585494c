"""The suite's own distribution: under pytest-xdist, the tests of a module that share a module-scoped fixture run on
one worker (tests/conftest.py marks them for --dist loadgroup), so the fixture — a served model, a browser, a lake
of rollouts — is built once per run, not once per worker."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import os
import pytest

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    marker = tmp_path_factory.getbasetemp().parent / f"built-{os.getpid()}"
    marker.write_text("")
    return os.environ.get("PYTEST_XDIST_WORKER")

@pytest.mark.parametrize("i", range(6))
def test_shared(shared, i):
    assert shared == os.environ.get("PYTEST_XDIST_WORKER")

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass
'''


def test_a_module_fixtures_tests_run_on_one_worker_and_build_it_once(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "-v",
                           "--rootdir", str(tmp_path), "-o", "addopts=", "--dist", "loadgroup",
                           "--basetemp", str(tmp_path / "base"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    workers = {}
    for worker, name in re.findall(r"\[(gw\d+)\] .*PASSED \S+::(test_\w+)", done.stdout):
        workers.setdefault(name, set()).add(worker)
    assert set(workers) == {"test_shared", "test_alone"}, done.stdout[-3000:]
    assert len(workers["test_shared"]) == 1, f"the module fixture's tests ran on {sorted(workers['test_shared'])}"
    assert len(list((tmp_path / "base").glob("built-*"))) == 1  # built by one process, once


BUSY = '''
import subprocess, sys

def test_busy_child():
    # a child process that spins for 0.6 s of CPU, then ends: its CPU is this test's
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"],
                   check=True)

def test_idle():
    pass
'''


def test_cpu_by_test_charges_a_test_the_cpu_of_the_processes_it_started(tmp_path):
    """``bench suite-time --cpu-by-test``'s plugin: a test that starts a busy process is charged its CPU."""
    from bench.cpu_by_test import _V1, _V2, collect, remove_groups

    if os.geteuid() != 0 or not ((_V1 / "cpuacct.usage").exists() or (_V2 / "cgroup.procs").exists()):
        pytest.skip("needs root and a cgroup hierarchy to count CPU in")
    (tmp_path / "test_busy.py").write_text(BUSY)
    out = tmp_path / "cpu.jsonl"
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "bench.cpu_by_test", "-q",
                               "--rootdir", str(tmp_path), "-o", "addopts=", "-p", "no:xdist", str(tmp_path)],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "HALO_CPU_BY_TEST": str(out), "PYTHONPATH": str(TESTS.parent)})
    finally:
        remove_groups()  # the sample run's group, empty once it ended
    assert done.returncode == 0, done.stdout[-3000:]
    rows = {row["test"].split("::")[-1]: row for row in collect(out)}
    assert set(rows) == {"test_busy_child", "test_idle"} and {row["worker"] for row in rows.values()} == {"main"}
    assert rows["test_busy_child"]["cpu_seconds"] >= 0.6 > rows["test_idle"]["cpu_seconds"]
