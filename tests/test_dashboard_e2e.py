"""End to end: `halo-data dashboard` on a free loopback port, opened in headless Chromium."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_dashboard import build_fixture_lake

CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-quic",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the dashboard exited with {server.returncode}: {server.stdout.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"the dashboard at {url} did not answer within {timeout:.0f}s")


@pytest.fixture
def dashboard_url(tmp_path):
    lake = build_fixture_lake(tmp_path / "lake")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "halo_data.cli", "dashboard", "--lake", lake.root, "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server)
        yield url
    finally:
        # The CLI starts streamlit as its child: stop the whole session this test started.
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:  # streamlit may outlive the CLI that started it: nothing of the session stays behind
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()


def test_dashboard_in_chromium(dashboard_url, tmp_path):
    shots = Path(os.environ.get("HALO_E2E_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    # Sync Playwright refuses to start where another sync Playwright (agisdk's, kept for the
    # whole process by earlier rollout tests) owns the thread's event loop: use a thread of our own.
    errors: list[BaseException] = []

    def browse() -> None:
        try:
            _browse(dashboard_url, shots)
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    worker = threading.Thread(target=browse)
    worker.start()
    worker.join(timeout=240)
    assert not worker.is_alive(), "the browser did not finish within 240 s"
    if errors:
        raise errors[0]


def _browse(dashboard_url: str, shots: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})

            page.goto(f"{dashboard_url}/replay", wait_until="domcontentloaded")
            image = page.locator('[data-testid="stImage"] img').first
            image.wait_for(state="visible", timeout=45_000)
            # an analyst's tool does not offer to deploy itself
            page.locator('[data-testid="stToolbar"]').wait_for(state="attached", timeout=15_000)
            assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle(), timeout=15_000)
            assert image.evaluate("img => img.naturalWidth") == 320
            page.get_by_text("action drawn at").first.wait_for(timeout=15_000)
            page.screenshot(path=str(shots / "replay.png"), full_page=True)

            page.goto(f"{dashboard_url}/grpo", wait_until="domcontentloaded")
            page.get_by_text("frac_reward_zero_std per run").wait_for(timeout=45_000)
            page.get_by_text("learning stalls").first.wait_for(timeout=15_000)
            page.screenshot(path=str(shots / "grpo.png"), full_page=True)
            assert not page.locator('[data-testid="stException"]').count()
        finally:
            browser.close()
