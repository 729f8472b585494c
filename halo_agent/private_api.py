"""The private parts of Playwright and agisdk that HALO uses, and what it does when an upgrade changes them.

- Playwright's ``CDPSession._impl_obj.send``, run by the sync wrapper's ``_sync``
  (``envs.base._PageDevTools``): DevTools answers skip Playwright's walk over every value
  (~10% of a MiniWoB step) and several requests are in flight at once. Falls back to the
  public ``CDPSession.send``, one request at a time.
- agisdk's ``_get_global_playwright`` (``browser.shared_playwright``): one Playwright per
  process, shared with agisdk's ``BrowserEnv`` (a second sync Playwright in one thread fails).
  Falls back to HALO's own ``sync_playwright().start()``.
- Playwright's ``driver/package/browsers.json`` (``browser.playwright_revisions``): the
  folders where Playwright looks for Chromium, so ``setup`` can link Debian's Chromium there.
  Falls back to ``playwright install --dry-run``, which prints the same folders (one more
  process per Python process).

BrowserGym's ``_post_extract`` is not used: HALO removes its marks from a page itself
(``envs.base.unmark_elements``), as it makes them (``envs.base.mark_elements``).

Each fallback logs one warning per process that names what changed. pyproject.toml pins
Playwright and agisdk to the releases these fast paths are tested with; the fallbacks are
for an environment that installs another release anyway.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# What an upgrade raises when a private name moves (AttributeError, ImportError), its signature
# changes (TypeError) or a file changes its layout (KeyError, ValueError, OSError).
UPGRADE_ERRORS = (AttributeError, ImportError, KeyError, TypeError, ValueError, OSError)

_warned: set[str] = set()


def warn_fallback(private: str, error: BaseException, fallback: str) -> None:
    """Log, once per process for each private part, that it changed and which public path is used instead."""
    if private in _warned:
        return
    _warned.add(private)
    detail = str(error).splitlines()[0] if str(error) else ""
    log.warning(
        "%s changed (%s: %s); using %s",
        private, type(error).__name__, detail, fallback,
    )
