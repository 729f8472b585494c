"""The private Playwright and agisdk parts HALO uses, changed as an upgrade would change them:
HALO falls back to public APIs, gives the same results, and warns once per process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent

PAGE = """<!doctype html><html><body>
<h1 aria-description="the page's own note">Orders</h1>
<button onclick="document.title = 'sent'">Send</button>
<input aria-label="Name" aria-roledescription="name field">
<iframe srcdoc="<button aria-description='inner note'>Inner</button>"></iframe>
</body></html>"""

ARIA_JS = """() => [document, document.querySelector('iframe').contentDocument].flatMap(doc =>
  [...doc.querySelectorAll('[aria-description], [aria-roledescription]')].map(el =>
    [el.tagName, el.getAttribute('aria-description'), el.getAttribute('aria-roledescription')]))"""


@pytest.fixture(scope="module")
def session():
    from halo_agent.browser import BrowserSession

    with contextlib.closing(BrowserSession(headless=True)) as browser_session:
        yield browser_session


@pytest.fixture
def fallback_warnings(monkeypatch, caplog):
    """The fallback warnings logged in this test, as if it were a fresh process."""
    from halo_agent import private_api

    monkeypatch.setattr(private_api, "_warned", set())
    caplog.set_level(logging.WARNING, logger=private_api.__name__)
    return lambda: [r.getMessage() for r in caplog.records if r.name == private_api.__name__]


def _run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    """``command`` in a fresh process: a process holds one sync Playwright, which these tests replace."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=environment)
    assert done.returncode == 0, done.stderr
    return done


# --- Playwright's CDPSession internals (the one DevTools session per page) ---------------------


def _observe(session):
    """What an observation of PAGE gives, on a fresh page (and so a fresh DevTools session)."""
    from halo_agent.envs.base import extract_page_state

    page = session.new_page({"width": 400, "height": 300})
    page.set_content(PAGE)
    state = extract_page_state(page, "goal")
    return state.url, state.axtree, list(state.elements), state.extra, state.screenshot[:24]  # PNG size


def _count_public_sends(monkeypatch) -> list[str]:
    from playwright.sync_api import CDPSession

    sent: list[str] = []
    public_send = CDPSession.send

    def counted(self, method, params=None, **kwargs):
        sent.append(method)
        return public_send(self, method, params, **kwargs)

    monkeypatch.setattr(CDPSession, "send", counted)
    return sent


def _send_without_timeout(monkeypatch) -> None:
    """A Playwright whose internal send takes no timeout, with the public send built to match."""
    from playwright._impl.cdp_session import CDPSession as CDPSessionImpl
    from playwright.sync_api import CDPSession
    from playwright.sync_api._generated import mapping

    internal_send = CDPSessionImpl.send

    async def send(self, method, params=None):
        return await internal_send(self, method, params, None)

    def public_send(self, method, params=None):
        return mapping.from_maybe_impl(self._sync(self._impl_obj.send(method=method, params=mapping.to_impl(params))))

    monkeypatch.setattr(CDPSessionImpl, "send", send)
    monkeypatch.setattr(CDPSession, "send", public_send)


def _sessions_without_impl_obj(monkeypatch) -> None:
    """A Playwright whose sessions keep their internals under another name."""
    from playwright.sync_api import BrowserContext

    class RenamedInternals:
        def __init__(self, session):
            self.send, self.detach = session.send, session.detach

    new_cdp_session = BrowserContext.new_cdp_session
    monkeypatch.setattr(BrowserContext, "new_cdp_session", lambda self, page: RenamedInternals(new_cdp_session(self, page)))


@pytest.mark.parametrize(
    "change, error", [(_send_without_timeout, "TypeError"), (_sessions_without_impl_obj, "AttributeError")]
)
def test_devtools_use_the_public_send_when_playwrights_internals_change(session, monkeypatch, fallback_warnings, change, error):
    from halo_agent.envs import base

    monkeypatch.setattr(base, "_private_send_works", True)
    expected = _observe(session)
    sent = _count_public_sends(monkeypatch)
    _observe(session)
    assert sent == [] and fallback_warnings() == []  # the fast path, silent

    change(monkeypatch)
    sent = _count_public_sends(monkeypatch)
    for _ in range(3):  # a page and a DevTools session each: one warning for the process
        assert _observe(session) == expected
    assert "DOMSnapshot.captureSnapshot" in sent and "Page.captureScreenshot" in sent
    assert base._private_send_works is False
    [warning] = fallback_warnings()
    assert warning.startswith(f"Playwright's CDPSession._impl_obj.send / _sync changed ({error}: ")
    assert warning.endswith("using the slower public CDPSession.send, one request at a time")


def test_a_miniwob_episode_scores_the_same_on_the_public_send(monkeypatch, fallback_warnings):
    from halo_agent.envs import base
    from halo_agent.envs.miniwob import MiniWoBEnv

    monkeypatch.setattr(base, "_private_send_works", True)
    _send_without_timeout(monkeypatch)
    env = MiniWoBEnv(headless=True)
    try:
        for _ in range(2):
            page = env.reset(MiniWoBEnv.task_spec("click-button"), task_seed=3)
            wanted = re.search(r'"(.+)"', page.goal).group(1)
            right = next(e for e in page.elements if e.role == "button" and e.name == wanted)
            out = env.step(f"click('{right.bid}')")
            assert (out.reward, out.terminated, out.raw_reward, out.action_error) == (1.0, True, 1.0, None)
            assert out.page.screenshot.startswith(b"\x89PNG")
    finally:
        env.close()
    assert len(fallback_warnings()) == 1


# --- BrowserGym's _post_extract: HALO unmarks pages itself -------------------------------------


def test_observations_restore_the_pages_aria_attributes_without_browsergyms_post_extract(session, monkeypatch):
    from agisdk.REAL.browsergym.core import observation

    from halo_agent.envs.base import extract_page_state, mark_elements, unmark_elements

    monkeypatch.delattr(observation, "_post_extract")
    page = session.new_page({"width": 400, "height": 300})
    page.set_content(PAGE)
    original = page.evaluate(ARIA_JS)
    assert len(original) == 3

    mark_elements(page)
    marked = page.evaluate(ARIA_JS)
    assert all(re.match(r"browsergym_id_\w+ ", description or "") for _, description, _ in marked)
    assert len(marked) > len(original)  # every element carries its bid while the page is read
    unmark_elements(page)
    assert page.evaluate(ARIA_JS) == original

    state = extract_page_state(page, "goal")
    assert page.evaluate(ARIA_JS) == original
    assert "button 'Inner'" in state.axtree and "browsergym_id" not in state.axtree


# --- agisdk's _get_global_playwright -------------------------------------------------------------

GLOBAL_PLAYWRIGHT_SCRIPT = """
import json, logging, sys
import agisdk.REAL.browsergym.core as core
from halo_agent import private_api
from halo_agent.browser import BrowserSession

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("halo_agent.private_api").addHandler(handler)
results = []
for change in json.loads(sys.argv[1]):
    private_api._warned.clear()  # each change as if in a fresh process
    records.clear()
    exec(change, {"core": core})
    seen = []
    for _ in range(2):  # two launches (browsers of their own, not the process's shared one), one warning
        session = BrowserSession(headless=True, shared=False)
        page = session.new_page({"width": 400, "height": 300})
        page.set_content('<button bid="7" onclick="this.textContent = \\'sent\\'">Send</button>')
        page.get_by_test_id("7").click()  # BrowserGym's actions find elements by bid this way
        seen.append(page.inner_text("button"))
        session.close()
    results.append({"seen": seen, "warnings": [r.getMessage() for r in records]})
print(json.dumps(results))
"""

GLOBAL_PLAYWRIGHT_CHANGES = {
    "del core._get_global_playwright": "ImportError",
    "core._get_global_playwright = lambda headless: None": "TypeError",
    "core._get_global_playwright = lambda: None": "TypeError: it returned a NoneType, not a Playwright",
}


def test_browser_sessions_start_their_own_playwright_when_agisdks_accessor_changes():
    script = [sys.executable, "-c", GLOBAL_PLAYWRIGHT_SCRIPT, json.dumps(list(GLOBAL_PLAYWRIGHT_CHANGES))]
    results = json.loads(_run(script).stdout)
    for error, result in zip(GLOBAL_PLAYWRIGHT_CHANGES.values(), results, strict=True):
        assert result["seen"] == ["sent", "sent"]
        [warning] = result["warnings"]
        assert warning.startswith(f"agisdk's _get_global_playwright changed ({error}")
        assert warning.endswith("using a Playwright of HALO's own; agisdk's BrowserEnv may fail to start in this process")


# --- Playwright's browsers.json ------------------------------------------------------------------


@pytest.fixture
def revisions():
    """The revisions browsers.json gives; the cache is cleared around the test."""
    from halo_agent import browser

    browser.playwright_revisions.cache_clear()
    yield browser.playwright_revisions()
    browser.playwright_revisions.cache_clear()


@pytest.mark.parametrize(
    "layout, error",
    [
        (None, "FileNotFoundError"),
        ("<html>moved</html>", "JSONDecodeError"),
        ({"browsers": {"chromium": {"revision": "1"}}}, "TypeError"),
        ({"browsers": [{"name": "chromium", "rev": "1"}]}, "KeyError"),
        ({"browsers": [{"name": "chrome", "revision": "1"}]}, "ValueError: browsers.json names no chromium or chromium-headless-shell"),
    ],
)
def test_links_go_where_playwright_looks_when_browsers_json_changes(revisions, tmp_path, monkeypatch, fallback_warnings, layout, error):
    from halo_agent import browser

    changed = tmp_path / "browsers.json"
    if layout is not None:
        changed.write_text(layout if isinstance(layout, str) else json.dumps(layout))
    monkeypatch.setattr(browser, "_browsers_json", lambda: changed)
    for _ in range(2):
        browser.playwright_revisions.cache_clear()
        assert browser.playwright_revisions() == revisions
    [warning] = fallback_warnings()
    assert warning.startswith(f"Playwright's driver/package/browsers.json changed ({error}")
    assert warning.endswith("using the slower `playwright install --dry-run`, one more process per Python process")


def test_chromium_launches_through_links_made_without_browsers_json(revisions, tmp_path, monkeypatch, fallback_warnings):
    from halo_agent import browser

    monkeypatch.setattr(browser, "_browsers_json", lambda: tmp_path / "moved.json")
    browser.playwright_revisions.cache_clear()
    links = tmp_path / "ms-playwright"
    assert browser.setup(links) == links
    assert len(fallback_warnings()) == 1
    # A fresh process reads the real browsers.json: Playwright launches what the fallback linked.
    done = _run([sys.executable, "-m", "halo_agent.browser", "check"], PLAYWRIGHT_BROWSERS_PATH=str(links))
    assert re.fullmatch(r"Chromium [\d.]+ launches headless\n", done.stdout)


def test_a_playwright_whose_cli_lists_no_chromium_is_one_clear_error(tmp_path, monkeypatch, revisions, fallback_warnings):
    from halo_agent import browser

    monkeypatch.setattr(browser, "_browsers_json", lambda: tmp_path / "moved.json")
    monkeypatch.setattr(browser, "_EXECUTABLE_LAYOUT", {"chromium-next": ("chrome-linux64", "chrome")})
    browser.playwright_revisions.cache_clear()
    with pytest.raises(browser.BrowserSetupError, match=r"^`playwright install --dry-run chromium` names no chromium-next: install the Playwright release that pyproject.toml names$"):
        browser.playwright_revisions()
