"""The suite's own distribution: under pytest-xdist, the tests of a module that share a module-scoped fixture run on
one worker (tests/conftest.py marks them for --dist loadgroup), so the fixture — a served model, a browser, a lake
of rollouts — is built once per run, not once per worker."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

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
