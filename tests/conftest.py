"""Shared test set-up: offline environment for agisdk/Playwright, and small lake fixtures."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

# agisdk imports tiktoken, which would download its encoding; Playwright must use Debian's
# Chromium. Both are arranged before any test imports them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# Several workers share the cores (addopts' -n): one intra-op thread per process (workers and the servers and jobs
# they start inherit it), and idle OpenMP threads sleep instead of spinning on a core another process needs.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    from halo_agent.browser import ensure_environment
except ImportError:  # the agent extra is not installed
    pass
else:
    ensure_environment()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n N --dist loadgroup``, the default in pyproject.toml): the tests of a module that
    share one of its module-scoped fixtures (a live server, a browser, a lake they read) run on one worker, so the
    fixture is built once; every other test goes to whichever worker is free. Slow tests start first, so the
    longest ones are not the last to begin."""
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        shared = definitions and any(d[-1].scope in ("module", "class") for d in definitions.name2fixturedefs.values() if d)
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        if "build_once" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("timeout"):
            # its setup may wait for another worker's build of a model folder before building nothing itself
            item.add_marker(pytest.mark.timeout(2 * float(config.getini("timeout") or 600)))
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")
                    and item.get_closest_marker("xdist_group")}

    def slow_first(item) -> int:
        grouped = item.get_closest_marker("xdist_group") is not None
        return 0 if (item.module.__name__ in slow_modules if grouped else item.get_closest_marker("slow")) else 1

    items.sort(key=slow_first)  # stable: a module's tests keep their order


@pytest.fixture(scope="session")
def build_once(tmp_path_factory):
    """``build_once(name, build)``: ``build(folder)`` run once per test session across every pytest-xdist worker
    (the others wait for it), its JSON-able result returned to each. For model folders several tests read:
    a worker that needs one takes the finished folder instead of building its own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's popen-gwN
    root = Path(root)

    def once(name: str, build):
        folder = root / f"shared-{name}"
        with open(root / f"shared-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = folder / ".built.json"
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                result = build(folder)
                done.write_text(json.dumps(result))
            return json.loads(done.read_text())

    return once


@pytest.fixture
def lake(tmp_path):
    """An empty, initialised lake under tmp_path."""
    from halo_data.lake import Lake

    return Lake.init(tmp_path / "lake")


@pytest.fixture
def synthetic_lake(tmp_path):
    """A small lake of synthetic episodes (several tasks x attempts, small screenshots)."""
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake

    spec = SyntheticSpec(n_steps=600, attempts_per_task=4, min_steps=5, max_steps=12, screenshot_size=(48, 32), seed=7)
    return build_synthetic_lake(str(tmp_path / "synthetic-lake"), spec)


@pytest.fixture(scope="session")
def tiny_lora_models(build_once):
    """A tiny base model and two LoRA adapters with random (non-zero) weights, so each changes the output."""
    import torch

    torch.set_num_threads(1)

    def build(root: Path):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        from halo_train.tiny_model import build_tiny_model

        base = build_tiny_model(root / "base")
        adapters = {}
        for i, name in enumerate(("policy-1", "policy-2")):
            torch.manual_seed(100 + i)
            model = get_peft_model(
                AutoModelForCausalLM.from_pretrained(base),
                LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
            )
            model.save_pretrained(root / name)
            adapters[name] = str(root / name)
        return [str(base), adapters]

    base, adapters = build_once("serving", build)
    return base, adapters


@pytest.fixture
def race_processes():
    """Start ``n`` spawned processes ``target(root, index, start_event)``, release them at once, wait.

    Returns their exit codes. Spawned, never forked: delta-rs does not survive a fork.
    """
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")

    def race(target, root: str, n: int, timeout: float = 120) -> list[int | None]:
        start = spawn.Event()
        procs = [spawn.Process(target=target, args=(root, i, start)) for i in range(n)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(timeout)
        return [p.exitcode for p in procs]

    return race


def pytest_sessionfinish(session, exitstatus):
    """Release DuckDB connections that outlive the tests (the dashboard caches one per lake
    snapshot for the life of the process), so none is alive when DuckDB's module is torn down."""
    import gc
    import sys

    if "streamlit" in sys.modules:
        import logging

        import streamlit as st

        # Outside a running app, clearing the caches logs a notice that would follow pytest's summary.
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("streamlit"):
                logging.getLogger(name).setLevel(logging.ERROR)
        st.cache_resource.clear()
        st.cache_data.clear()
    gc.collect()
