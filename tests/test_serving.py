"""Runtime LoRA on HALO's chat server (vLLM's API, bodies, answers and errors) and the one engine client for both."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from halo_agent.chat_server import ChatCompletionServer  # noqa: E402
from halo_agent.local_http import reply  # noqa: E402
from halo_agent.policies.hf_policy import LocalChatModel  # noqa: E402
from halo_agent.serving import EngineClient, EngineError  # noqa: E402

MESSAGES = [{"role": "user", "content": "Click the Submit button."}]


def call(url: str, body: dict | None = None) -> SimpleNamespace:
    """One real HTTP request: status, content type, text and the parsed JSON where it is JSON."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, ctype, text = r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, text = e.code, e.headers["Content-Type"], e.read().decode()
    parsed = json.loads(text) if ctype.startswith("application/json") else None
    return SimpleNamespace(status_code=status, content_type=ctype, text=text, json=lambda: parsed)


@pytest.fixture(scope="module")
def models(tiny_lora_models):
    return tiny_lora_models


@pytest.fixture()
def server(models):
    base, _ = models
    with ChatCompletionServer(LocalChatModel(base, device="cpu"), served_model_name="tiny") as s:
        yield s


def chat(url: str, model: str) -> dict:
    return call(f"{url}/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True}).json()


def token_logprobs(answer: dict) -> list[float]:
    return [t["logprob"] for t in answer["choices"][0]["logprobs"]["content"]]


def test_load_serve_and_unload_like_vllm(server, models):
    base, adapters = models
    before = chat(server.url, "tiny")

    r = call(f"{server.url}/load_lora_adapter", {"lora_name": "policy-1", "lora_path": adapters["policy-1"]})
    assert r.status_code == 200
    assert r.content_type.startswith("text/plain")
    assert r.text == "Success: LoRA adapter 'policy-1' added successfully."
    cards = {c["id"]: c for c in call(f"{server.url}/models").json()["data"]}
    assert cards["policy-1"]["parent"] == "tiny"

    # The adapter loaded at run time serves exactly what an engine started with it serves.
    served = chat(server.url, "policy-1")
    reference = LocalChatModel(base, adapters={"policy-1": adapters["policy-1"]}, device="cpu").generate(
        MESSAGES, max_new_tokens=6, adapter="policy-1"
    )
    assert served["choices"][0]["message"]["content"] == reference.generations[0].text
    assert token_logprobs(served) == pytest.approx(reference.generations[0].logprobs, abs=1e-5)
    assert token_logprobs(served) != pytest.approx(token_logprobs(before), abs=1e-3)
    # The base model is still served as it was.
    assert token_logprobs(chat(server.url, "tiny")) == pytest.approx(token_logprobs(before), abs=1e-6)

    r = call(f"{server.url}/unload_lora_adapter", {"lora_name": "policy-1"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'policy-1' removed successfully.")
    gone = call(f"{server.url}/chat/completions", {"model": "policy-1", "messages": MESSAGES})
    assert gone.status_code == 404
    # Unloading the last adapter leaves the base weights exactly as they were.
    assert token_logprobs(chat(server.url, "tiny")) == pytest.approx(token_logprobs(before), abs=1e-6)


@pytest.mark.parametrize(
    "route, body, status, kind, message",
    [
        ("load_lora_adapter", {"lora_name": "x"}, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."),
        ("load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent/adapter"}, 404, "NotFoundError",
         "Loading lora x failed: No adapter found for /nonexistent/adapter"),
        ("load_lora_adapter", {"lora_name": "tiny", "lora_path": "/nonexistent"}, 400, "InvalidUserInput",
         "The lora adapter 'tiny' has already been loaded."),
        ("unload_lora_adapter", {"lora_name": "never-loaded"}, 404, "NotFoundError", "The lora adapter 'never-loaded' cannot be found."),
        ("unload_lora_adapter", {}, 400, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided."),
    ],
)
def test_refusals_match_vllm(server, route, body, status, kind, message):
    r = call(f"{server.url}/{route}", body)
    assert r.status_code == status
    assert r.json()["error"]["type"] == kind
    assert r.json()["error"]["message"] == message


def test_same_name_twice_is_refused_and_the_first_keeps_serving(server, models):
    _, adapters = models
    ok = call(f"{server.url}/load_lora_adapter", {"lora_name": "p", "lora_path": adapters["policy-1"]})
    assert ok.status_code == 200
    first = token_logprobs(chat(server.url, "p"))
    again = call(f"{server.url}/load_lora_adapter", {"lora_name": "p", "lora_path": adapters["policy-2"]})
    assert again.status_code == 400 and again.json()["error"]["message"] == "The lora adapter 'p' has already been loaded."
    assert token_logprobs(chat(server.url, "p")) == pytest.approx(first, abs=1e-6)


def test_client_swaps_versions_under_new_names(server, models):
    _, adapters = models
    with EngineClient(server.url, backoff=0.0) as engine:
        engine.wait_ready(timeout=5)
        first = engine.swap_adapter("policy-1", adapters["policy-1"])
        assert first.loaded and first.serving == "policy-1"
        second = engine.swap_adapter("policy-2", adapters["policy-2"], retire="policy-1")
        assert second.loaded and second.serving == "policy-2" and second.seconds >= 0
        assert set(engine.models()) == {"tiny", "policy-2"}

        # A version whose folder is not there: nothing changes, policy-2 keeps serving, and the result says so.
        failed = engine.swap_adapter("policy-3", "/nonexistent/policy-3", retire="policy-2")
        assert not failed.loaded and failed.serving == "policy-2"
        assert "still serving policy-2" in failed.message and "No adapter found" in failed.message
        assert set(engine.models()) == {"tiny", "policy-2"}
        assert chat(server.url, "policy-2")["choices"][0]["message"]["content"] is not None


def test_a_swap_replaces_an_adapter_an_earlier_run_left_under_the_same_name(server, models):
    """An engine that outlives runs (vLLM behind --engine-url) still serves the last version of a run that ended; a
    later run's policy-1 takes the name over rather than being refused and sampling with a stale version."""
    _, adapters = models
    with EngineClient(server.url, backoff=0.0) as engine:
        engine.load_adapter("policy-1", adapters["policy-1"])  # the earlier run's
        swap = engine.swap_adapter("policy-1", adapters["policy-2"])
        assert swap.loaded and swap.serving == "policy-1"
        assert engine.models()["policy-1"]["root"] == str(adapters["policy-2"])
        again = engine.swap_adapter("policy-1", adapters["policy-2"])  # the same folder: nothing to replace
        assert again.loaded and engine.models()["policy-1"]["root"] == str(adapters["policy-2"])
        engine.unload_adapter("policy-1")
    served = token_logprobs(chat(server.url, "tiny"))
    assert served  # the base model still answers


def test_retried_load_whose_answer_was_lost_counts_as_loaded(server, models):
    _, adapters = models
    with EngineClient(server.url, backoff=0.0) as engine:
        engine.load_adapter("policy-1", adapters["policy-1"])
        # The same load again, as a retry after a dropped answer would send it: already there, from the same folder.
        engine.load_adapter("policy-1", adapters["policy-1"])
        with pytest.raises(EngineError, match="already been loaded"):
            engine.load_adapter("policy-1", adapters["policy-2"])
        engine.unload_adapter("policy-1")
        engine.unload_adapter("policy-1")  # a retried unload: already gone


class FlakyEngine(http.server.ThreadingHTTPServer):
    """A local engine that answers the first ``failures`` load requests with 503, then succeeds."""

    def __init__(self, failures: int):
        self.failures, self.loads = failures, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.loads += 1
                status, body = (503, json.dumps({"error": {"message": "busy", "type": "ServiceUnavailable", "code": 503}}))
                if outer.loads > outer.failures:
                    status, body = 200, "Success: LoRA adapter 'v' added successfully."
                reply(self, status, body.encode(), "application/json" if status >= 400 else "text/plain")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self):
        self.shutdown()
        self.server_close()


def test_client_retries_a_busy_engine_then_gives_up():
    flaky = FlakyEngine(failures=2)
    try:
        with EngineClient(flaky.url, retries=3, backoff=0.0) as engine:
            engine.load_adapter("v", "/adapters/v")
            assert flaky.loads == 3
        flaky.loads, flaky.failures = 0, 10
        with EngineClient(flaky.url, retries=2, backoff=0.0) as engine:
            swap = engine.swap_adapter("v", "/adapters/v", retire="u")
            assert not swap.loaded and swap.serving == "u"
            assert "503 busy" in swap.message
            assert flaky.loads == 3
    finally:
        flaky.close()


def test_unreachable_engine_is_one_clear_error():
    with EngineClient("http://127.0.0.1:9", retries=1, backoff=0.0) as engine:
        with pytest.raises(EngineError, match="no engine answered at http://127.0.0.1:9/v1 within 0 s"):
            engine.wait_ready(timeout=0.0, interval=0.0)
        with pytest.raises(EngineError, match="ConnectionRefusedError"):
            engine.load_adapter("v", "/adapters/v")


PARENTS = {
    # the online loop's server, in a session of its own as `halo-train serve` starts it
    "online loop": """
import os, signal, subprocess, sys, time
from halo_train.serve import chat_server_command
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a job started in the background: the server inherits it
server = subprocess.Popen(chat_server_command(sys.argv[1], {}, 0, parent_pid=os.getpid()), stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
line = server.stdout.readline()
print(server.pid if " at " in line else f"no server: {line!r}", flush=True)
time.sleep(600)
""",
    # the engine `halo-train experiment run` serves its cells with, for the length of a with block
    "experiment runner": """
import signal, sys, tempfile, time
from pathlib import Path
from halo_train.serve import ServeSpec, free_port, running
signal.signal(signal.SIGINT, signal.SIG_IGN)
with running(ServeSpec(sys.argv[1], {}, port=free_port(), engine="chat"), Path(tempfile.mkdtemp()) / "engine.log") as state:
    print(state["pid"], flush=True)
    time.sleep(600)
""",
}


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _autogroups() -> bool:
    """Whether this kernel schedules by session groups (CONFIG_SCHED_AUTOGROUP, switched on)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="reads process states from /proc")
@pytest.mark.parametrize("started_by", sorted(PARENTS))
def test_the_chat_server_stops_when_the_process_that_started_it_is_killed(models, started_by):
    """The online loop and the experiment runner start the chat server with --parent-pid: one killed with -9
    leaves no server behind.
    Started by a niced parent in a session of its own, the server keeps that niceness for its session's
    scheduling group (where the kernel groups by session), so a background job's server stays in the background."""
    import os
    import signal
    import subprocess
    import sys
    import time

    base, _ = models
    parent = subprocess.Popen([sys.executable, "-c", PARENTS[started_by], str(base)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.nice(7))
    line = parent.stdout.readline().strip()
    assert line.isdigit(), line
    server = int(line)
    try:
        assert _running(server)
        assert os.getsid(server) == server and os.getpriority(os.PRIO_PROCESS, server) == 7
        if _autogroups():
            with open(f"/proc/{server}/autogroup") as f:
                assert f.read().split()[-2:] == ["nice", "7"]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while _running(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(server)
    finally:
        if _running(server):
            os.kill(server, signal.SIGKILL)


def test_a_client_gone_before_the_answer_is_one_log_line_and_the_request_still_counts(server, models, caplog, capfd):
    """A client killed while its load runs (an online run killed with -9): the server loads the adapter, finds the
    connection closed when it answers, says so in one line, and serves on; a retry finds the adapter loaded."""
    import logging
    import socket
    import time
    from urllib.parse import urlparse

    _, adapters = models
    url = urlparse(server.url)
    body = json.dumps({"lora_name": "policy-1", "lora_path": adapters["policy-1"]}).encode()
    with caplog.at_level(logging.INFO, logger="halo_agent.chat_server"):
        client = socket.create_connection((url.hostname, url.port), timeout=30)
        client.sendall(b"POST /v1/load_lora_adapter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        client.close()  # before the answer
        for _ in range(200):  # until the server has tried to answer
            if any("closed the connection" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "halo_agent.chat_server" and r.levelno >= logging.INFO]
    assert lines == [f"loaded LoRA adapter policy-1 from {adapters['policy-1']}",
                     "POST /v1/load_lora_adapter: the client closed the connection before the answer"], lines
    assert "Traceback" not in capfd.readouterr().err
    assert "policy-1" in [m["id"] for m in call(f"{server.url}/models").json()["data"]]
    with EngineClient(server.url, backoff=0.0) as engine:  # the retry an online run makes on --resume
        engine.load_adapter("policy-1", adapters["policy-1"])
    assert chat(server.url, "policy-1")["model"] == "policy-1"
