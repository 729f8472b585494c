"""Local web clones that speak REAL's ``/config`` + ``/finish`` contract.

The hosted REAL sites (GoMail, Omnizon, ...) are not reachable everywhere. A
local clone lets agisdk's whole task path run offline: its ``AbstractWebCloneTask``
opens ``<site>/config?run_id=..&task_id=..`` to reset the site for a task, the
agent works on ``<site>/``, and the evaluator reads the state difference from the
``<pre>`` of ``<site>/finish``. The clones keep their state in the origin's
``localStorage`` as the hosted ones do, so each browser context (one per episode)
has its own data and parallel workers never interfere.

Serve one::

    python -m halo_agent.sites gomail --port 8377

The tasks in ``halo_agent/sites/tasks`` (task version ``halo-local``) point at that
default address; ``halo_agent.registry.register_local_tasks()`` registers them with
agisdk, and ``RealEnv(site_urls={"gomail": url})`` sends any task of a site (also
agisdk's own v2 GoMail tasks) to another address.
"""

from __future__ import annotations

import http.server
import logging
import urllib.parse
from pathlib import Path

from halo_agent.local_http import LocalHTTPServer, reply

log = logging.getLogger(__name__)

SITES_DIR = Path(__file__).resolve().parent
TASKS_DIR = SITES_DIR / "tasks"
LOCAL_TASK_VERSION = "halo-local"
DEFAULT_PORT = 8377
# Each clone's default address, the one its tasks in ``tasks/`` point at.
DEFAULT_PORTS = {"gomail": DEFAULT_PORT, "omnizon": 8378, "gocalendar": 8379}
SITES = tuple(DEFAULT_PORTS)

# The contract's endpoints: pages shared by every clone (``contract/``) that call the clone's own ``/state.js``
# (``STATE_KEY``, ``freshState``, ``stateDiff``) and the shared ``/contract.js`` (``loadState``, ``saveState``),
# so they do the work in the browser.
CONTRACT_DIR = SITES_DIR / "contract"
_CONTRACT_ROUTES = {"/config": "config.html", "/finish": "finish.html", "/submit": "finish.html", "/contract.js": "contract.js"}
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}


class UnknownSiteError(ValueError):
    pass


def _handler_for(root: Path) -> type[http.server.BaseHTTPRequestHandler]:
    class SiteHandler(http.server.BaseHTTPRequestHandler):
        server_version = "HALO-LocalSite/1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urllib.parse.urlsplit(self.path).path
            # agisdk joins "<start url>" + "/config"; a start URL ending in "/" gives "//config".
            path = "/" + path.lstrip("/")
            contract = _CONTRACT_ROUTES.get(path.rstrip("/"))
            folder, name = (CONTRACT_DIR, contract) if contract else (root, path.lstrip("/"))
            if "." not in name.rsplit("/", 1)[-1]:
                # "/" and the pages of the clone's own routing (/search?q=.., /product/212, /cart): its one page answers them.
                name = "index.html"
            file = (folder / name).resolve()
            if folder not in file.parents or not file.is_file():
                self.send_error(404, "Not found")
                return
            body = file.read_bytes()
            reply(self, 200, body, _CONTENT_TYPES.get(file.suffix, "application/octet-stream"), {"Cache-Control": "no-store"})

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
            log.debug("%s %s", self.address_string(), format % args)

    return SiteHandler


class LocalSite(LocalHTTPServer):
    """One local clone served on 127.0.0.1 from a background thread.

    >>> with LocalSite("gomail") as site:   # a free port
    ...     site.url                           # 'http://127.0.0.1:PORT'
    """

    def __init__(self, site: str = "gomail", port: int = 0, host: str = "127.0.0.1"):
        root = SITES_DIR / site
        if site not in SITES or not root.is_dir():
            raise UnknownSiteError(f"unknown local site {site!r}: choose one of {', '.join(SITES)}")
        self.site = site
        self.thread_name = f"site-{site}"
        super().__init__(_handler_for(root.resolve()), port=port, host=host)
