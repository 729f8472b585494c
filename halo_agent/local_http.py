"""HTTP servers HALO runs on 127.0.0.1: the local REAL sites and the CPU chat server.

    with LocalSite("gomail") as site:          # a free port, served from a background thread
        ...
    python -m halo_agent.sites gomail           # the same in the foreground until Ctrl-C (``serve_until_interrupted``)
"""

from __future__ import annotations

import http.server
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)


class LocalHTTPServer:
    """A ``ThreadingHTTPServer`` bound to 127.0.0.1 (by default), served from a thread (``start``/``stop``, ``with``)
    or in the foreground (``serve_forever``)."""

    thread_name = "local-http"

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], port: int = 0, host: str = "127.0.0.1"):
        self._httpd = http.server.ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self.origin

    def start(self):
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        log.info("%s at %s", self.thread_name, self.url)
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def shutdown(self) -> None:
        """Make ``serve_forever`` return; call it from another thread."""
        self._httpd.shutdown()

    def stop(self) -> None:
        self.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def reply(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
    """Send one whole answer: status, headers (``Content-Length`` included) and body."""
    handler.send_response(status)
    for name, value in {"Content-Type": content_type, **(headers or {})}.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


Server = TypeVar("Server", bound=LocalHTTPServer)


def serve_until_interrupted(build: Callable[[], Server], errors: tuple[type[BaseException], ...], banner: Callable[[Server], str],
                            parent_pid: int | None = None) -> int:
    """A command line's server: build it (``errors`` become one ``Error:`` line, exit 1), print ``banner``, serve until
    Ctrl-C, or, with ``parent_pid``, until that process is no longer this one's parent."""
    try:
        server = build()
    except errors as e:
        sys.stderr.write(f"Error: {e}\n")
        return 1
    if parent_pid is not None:
        stop_with_parent(server, parent_pid)
    sys.stdout.write(banner(server) + "\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def stop_with_parent(server: LocalHTTPServer, parent_pid: int, every: float = 0.5) -> None:
    """Stop ``server`` once ``parent_pid`` is no longer this process's parent: the process that started it has ended,
    even by ``kill -9``, and nothing else would stop it. (A shutdown, not a signal: a server started in the
    background may ignore SIGINT.)"""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every)
        log.info("the process that started this server (pid %d) has ended: stopping", parent_pid)
        server.shutdown()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
