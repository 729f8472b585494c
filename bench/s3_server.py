"""moto's S3 server on loopback, with S3's atomic conditional writes: the endpoint tests and benchmarks put lakes in.

A Delta commit on S3 is a PUT of ``_delta_log/<version>.json`` with ``If-None-Match: *`` (``AWS_CONDITIONAL_PUT=etag``):
of two writers racing for one version, S3 stores the first and answers the second 412, which retries at the next
version. moto's server checks the header and then stores the object in two steps, on one thread per request, so two
racing PUTs can both pass the check and the second silently replaces the first's commit: a lost write that S3 itself
never makes. Here every request that writes (any method but GET and HEAD) runs whole under one lock, which makes
each check-and-write atomic as on S3; reads run concurrently, as before.

Run as ``python -m bench.s3_server -H 127.0.0.1 -p PORT``; ``start()`` does that and waits until it answers.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def serialized_app():
    """moto's WSGI application (every service, dispatched by host and path), one writing request at a time."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    inner = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def app(environ, start_response):
        if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):  # a read sees an object before or after a write
            return inner(environ, start_response)
        with lock:  # the body is built under the lock too: moto returns it whole
            return list(inner(environ, start_response))

    return app


def main(argv: list[str] | None = None) -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(prog="python -m bench.s3_server", description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # moto builds its own URLs from it
    run_simple(args.host, args.port, serialized_app(), threaded=True, request_handler=MotoRequestHandler)


def start(recording: Path | None = None, timeout: float = 30) -> tuple[subprocess.Popen, str]:
    """Start the server on a free loopback port; returns the process (the caller terminates it) and its URL once it
    answers. With ``recording``, requests received while moto's recorder is on are logged to that file."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                                     os.environ.get("PYTHONPATH")]))}
    if recording is not None:
        env["MOTO_RECORDER_FILEPATH"] = str(recording)
    proc = subprocess.Popen([sys.executable, "-m", "bench.s3_server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                raise RuntimeError(f"the S3 server (moto) did not start on {url}") from None
            time.sleep(0.2)


if __name__ == "__main__":
    main()
