"""The os task server: LifelongAgentBench's session protocol, spoken by a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from halo_agent.envs.os_sandbox import check_host  # noqa: E402
from halo_agent.task_server import build_service, create_app  # noqa: E402

try:
    check_host()
except Exception as e:
    pytest.skip(f"os sandbox unavailable: {e}", allow_module_level=True)


@pytest.fixture
def server():
    """A real server on a free loopback port, stopped (and its sandboxes released) at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = build_service(max_rounds=2)
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
    httpd = uvicorn.Server(config)
    thread = threading.Thread(target=httpd.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not httpd.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/api", service
    httpd.should_exit = True
    thread.join(10)
    assert not service.sessions  # shutdown released every sandbox


def call(base: str, route: str, body=None):
    request = urllib.request.Request(base + route, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def agent(session, text):
    session["chat_history"]["value"].append({"role": "agent", "content": text})
    return {"session": session}


def test_a_sample_through_the_whole_protocol(server):
    base, _ = server
    assert call(base, "/ping") == {"response": "Hello, World!"}
    indices = call(base, "/get_sample_index_list")["sample_index_list"]
    assert "users-add" in indices and len(indices) >= 30
    session = call(base, "/reset", {"session": {"task_name": "os_interaction", "sample_index": "users-add"}})["session"]
    assert session["sample_status"] == "running"
    assert [m["role"] for m in session["chat_history"]["value"]] == ["user", "agent", "user"]
    assert session["chat_history"]["value"][-1]["content"] == "Create a user account named alice."
    session = call(base, "/interact", agent(session, "Think: add her\nAct: bash\n```bash\nuseradd alice && id -un alice\n```"))["session"]
    assert session["chat_history"]["value"][-1] == {"role": "user", "content": "The output of the OS:\n\nalice\n"}
    session = call(base, "/interact", agent(session, "Act: finish"))["session"]
    assert session["sample_status"] == "completed"
    session = call(base, "/complete", {"session": session})["session"]
    assert session["evaluation_record"] == {"outcome": "correct", "detail_dict": {"reward": 1.0}}

    failed = call(base, "/reset", {"session": {"task_name": "os_interaction", "sample_index": "users-group-add"}})["session"]
    failed = call(base, "/interact", agent(failed, "I would rather not."))["session"]
    assert failed["sample_status"] == "agent_validation_failed" and "no action" in failed["finish_reason"]
    failed = call(base, "/complete", {"session": failed})["session"]
    assert failed["evaluation_record"]["outcome"] == "incorrect"

    partials = [{k: s[k] for k in ("sample_index", "sample_status", "evaluation_record")} for s in (session, failed)]
    metric = call(base, "/calculate_metric", {"session_partial_list": partials})["metric"]["overall"]
    assert metric["evaluation_outcome"]["correct"] == 0.5 and metric["reward"]["mean"] == 0.25
    assert metric["basic"]["session_count"] == 2.0
    call(base, "/release")


def test_round_limit_and_protocol_errors(server):
    base, service = server
    session = call(base, "/reset", {"session": {"task_name": "os_interaction", "sample_index": "files-make-dirs"}})["session"]
    for _ in range(2):
        session = call(base, "/interact", agent(session, "Act: bash\n```bash\nls /\n```"))["session"]
    session = call(base, "/interact", agent(session, "Act: bash\n```bash\nmkdir -p /srv/data/2024/logs\n```"))["session"]
    assert session["sample_status"] == "task_limit_reached"
    assert call(base, "/complete", {"session": session})["session"]["evaluation_record"]["outcome"] == "incorrect"
    with pytest.raises(urllib.error.HTTPError) as error:
        call(base, "/reset", {"session": {"task_name": "os_interaction", "sample_index": "no-such-task"}})
    assert error.value.code == 400 and "unknown sample index" in error.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as error:
        call(base, "/interact", {"session": {"task_name": "os_interaction", "sample_index": "users-add", "sample_status": "running"}})
    assert error.value.code == 400 and "call /api/reset first" in error.value.read().decode()
    call(base, "/reset", {"session": {"task_name": "os_interaction", "sample_index": "users-add"}})
    assert list(service.sessions) == ["users-add"]  # left open: the server's shutdown must release it
