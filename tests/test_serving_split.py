"""`python -m bench serving`'s split of a step's time: the timing proxy between rollout and server, and the split's sums."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.serving import TimingProxy, split


@pytest.fixture
def slow_server():
    """A server on loopback answering every POST after 50 ms with the JSON it was sent, and every GET at once."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(0.05)
            self._answer(json.dumps({"path": self.path, "echo": json.loads(body)}).encode())

        def do_GET(self) -> None:
            self._answer(b'{"ok": true}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_proxy_passes_requests_through_and_times_the_servers_answers(slow_server):
    proxy = TimingProxy(slow_server)
    try:
        for k in range(3):
            request = urllib.request.Request(proxy.url + "/chat/completions", data=json.dumps({"k": k}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert json.loads(answer.read()) == {"path": "/v1/chat/completions", "echo": {"k": k}}
        seconds, requests = proxy.take()
        assert requests == 3 and 0.15 <= seconds < 2.0
        assert proxy.take() == (0.0, 0)
    finally:
        proxy.close()


def test_the_split_adds_up_to_the_wall_time():
    row = {"steps": 10, "wall_seconds": 20.0, "engine_seconds": 8.0, "prefill_seconds": 3.0, "round_trip_seconds": 8.5,
           "policy_seconds": 9.5, "env_seconds": 6.0, "lake_seconds": 0.5, "workers": 1}
    parts = split([row, {**row, "steps": 30, "wall_seconds": 60.0}])
    assert parts["wall"] == pytest.approx(2.0)
    assert sum(v for k, v in parts.items() if k != "wall") == pytest.approx(parts["wall"])
    assert parts["engine_prefill"] == pytest.approx(6.0 / 40) and parts["server_http_json"] == pytest.approx(1.0 / 40)
    # two workers share the wall: their seconds are shares of twice the wall time
    assert split([{**row, "workers": 2}])["wall"] == pytest.approx(4.0)
