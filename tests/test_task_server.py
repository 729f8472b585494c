"""The os task server: LifelongAgentBench's session protocol, spoken by a real `halo-agent serve-tasks` on 127.0.0.1.

The client below is written from LifelongAgentBench's documented shapes (src/typings, src/tasks/client.py,
src/utils/client.py): attributes it does not hold are read with /api/get_attribute, as its TaskClient does,
and ``run_sample`` is its run_experiment.py loop (reset, then agent inference and interact while running,
then complete; calculate_metric over the sessions; release).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from halo_agent.envs.os_sandbox import HOST_ID_BASE, check_host  # noqa: E402
from halo_agent.envs.os_tasks import load_tasks  # noqa: E402
from halo_agent.task_server import sample_index_of  # noqa: E402

try:
    check_host()
except Exception as e:
    pytest.skip(f"os sandbox unavailable: {e}", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
MAX_ROUNDS = 2
TASK_SEED = 3
# The oracle's knowledge: each sample's instance of the served task seed (its goal and reference solution).
INSTANCES = {sample_index_of(t): t.instance(TASK_SEED) for t in load_tasks()}


class LabTaskClient:
    """LifelongAgentBench's TaskClient, from its shapes: POST JSON to /api/<route>; unknown attributes from the server."""

    def __init__(self, server_address: str) -> None:
        self.__dict__["server_address"] = server_address.rstrip("/")
        assert self._call("/ping") == {"response": "Hello, World!"}

    def _call(self, route: str, body: dict | None = None):
        request = urllib.request.Request(self.server_address + route, data=json.dumps(body or {}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"null")

    def __getattr__(self, name: str):
        answer = self._call("/get_attribute", {"name": name})
        kind, parameters = answer["instance_factory_type"], answer["instance_factory_parameter_dict"]
        if kind is None:
            raise AttributeError(f"Attribute '{name}' is not found.")
        if kind == "enum":
            assert parameters["module"] == "src.typings.general.TaskName"
            return parameters["value"]
        assert kind == "simple_immutable_type"
        return {"int": int, "str": str, "float": float, "NoneType": lambda _: None, "bool": lambda v: v == "True"}[parameters["type"]](parameters["value"])

    def __setattr__(self, name: str, value) -> None:
        self._call("/set_attribute", {"name": name, "instance_factory_type": "simple_immutable_type",
                                      "instance_factory_parameter_dict": {"type": type(value).__name__, "value": str(value)}})

    def get_sample_index_list(self) -> list:
        return self._call("/get_sample_index_list")["sample_index_list"]

    def reset(self, session: dict) -> None:
        session.update(self._call("/reset", {"session": session})["session"])

    def interact(self, session: dict) -> None:
        session.update(self._call("/interact", {"session": session})["session"])

    def complete(self, session: dict) -> None:
        session.update(self._call("/complete", {"session": session})["session"])

    def release(self) -> None:
        self._call("/release")

    def calculate_metric(self, partials: list[dict]) -> dict:
        return self._call("/calculate_metric", {"session_partial_list": partials})["metric"]


def new_session(task: LabTaskClient, sample_index) -> dict:
    """Session(task_name=task.task_name, sample_index=...) as LifelongAgentBench builds it, dumped."""
    return {"task_name": task.task_name, "sample_index": sample_index, "sample_status": "initial", "chat_history": {"value": []},
            "finish_reason": None, "task_output": None, "evaluation_record": {"outcome": "unset", "detail_dict": None}}


def run_sample(task: LabTaskClient, sample_index, answers: list[str]) -> dict:
    """run_experiment.py's loop for one sample, with an agent that gives ``answers`` in turn."""
    session = new_session(task, sample_index)
    task.reset(session)
    turns = iter(answers)
    while session["sample_status"] == "running":
        session["chat_history"]["value"].append({"role": "agent", "content": next(turns)})  # agent.inference
        task.interact(session)
    task.complete(session)
    return session


def partial(session: dict) -> dict:
    return {k: session[k] for k in ("sample_index", "sample_status", "evaluation_record")}


def bash(command: str) -> str:
    return f"Think: run it\nAct: bash\n```bash\n{command}\n```"


def start_server(*options: str) -> tuple[str, subprocess.Popen]:
    """`halo-agent serve-tasks --env os OPTIONS` in its own process on a free loopback port, once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "halo_agent.cli", "serve-tasks", "--env", "os", "--port", str(port), *options],
                               env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 60
    while True:
        try:
            LabTaskClient(base)
            return base, process
        except (urllib.error.URLError, ConnectionError):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"serve-tasks did not start: {process.stderr.read()[-2000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server():
    """The server for this module's tests; stopped with SIGINT at the end."""
    base, process = start_server("--max-rounds", str(MAX_ROUNDS), "--timeout", "10", "--task-seed", str(TASK_SEED))
    yield base, process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(30)


def refused(call, *args) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as error:
        call(*args)
    return error.value.code, error.value.read().decode()


def test_a_run_experiment_loop_with_their_client_shapes(server):
    base, _ = server
    task = LabTaskClient(base)
    assert task.task_name == "os_interaction"  # /api/get_attribute, as their loop reads it
    assert (task.max_round, task.current_sample_index) == (MAX_ROUNDS, None)
    with pytest.raises(AttributeError):
        task.no_such_attribute
    indices = task.get_sample_index_list()
    assert "users-add" in indices and len(indices) == 42

    user = INSTANCES["users-add"].values["user"]
    solved = run_sample(task, "users-add", [bash(f"useradd {user} && id -un {user}"), "Think: done\nAct: finish"])
    history = solved["chat_history"]["value"]
    assert [m["role"] for m in history] == ["user", "agent", "user", "agent", "user", "agent"]
    assert history[2]["content"] == f"Create a user account named {user}."  # the instance of --task-seed
    assert history[4] == {"role": "user", "content": f"The output of the OS:\n\n{user}\n"}
    assert solved["sample_status"] == "completed"
    assert solved["evaluation_record"] == {"outcome": "correct", "detail_dict": {"reward": 1.0}}

    invalid = run_sample(task, "users-group-add", ["I would rather not."])
    assert invalid["sample_status"] == "agent_validation_failed" and "no action" in invalid["finish_reason"]
    assert invalid["evaluation_record"]["outcome"] == "incorrect"

    # The round limit is checked before the answer: two commands, then a finish is task_limit_reached.
    limited = run_sample(task, "files-make-dirs", [bash("ls /"), bash(INSTANCES["files-make-dirs"].solution.script), "Act: finish"])
    assert limited["sample_status"] == "task_limit_reached"
    assert limited["finish_reason"] == f"Task limit reached. The limit is {MAX_ROUNDS}."
    assert limited["evaluation_record"]["outcome"] == "correct"  # the work was done before the limit

    metric = task.calculate_metric([partial(s) for s in (solved, invalid, limited)])
    assert metric["overall"]["basic"] == {"session_count": 3.0}
    assert metric["overall"]["evaluation_outcome"]["correct"] == pytest.approx(2 / 3)
    assert metric["overall"]["sample_status"]["task_limit_reached"] == pytest.approx(1 / 3)
    skill = metric["skill"]
    assert skill["count_dict"]["useradd"] == 1 and skill["correct_rate_dict"]["useradd"] == 1.0
    assert skill["correct_rate_dict"]["groupadd"] == 0.0 and skill["correct_rate_dict"]["tar"] == -1  # not counted
    assert set(skill) == {"count_dict", "correct_count_dict", "correct_rate_dict", "effective_count_dict",
                          "effective_correct_count_dict", "effective_correct_rate_dict"}
    assert metric["difficulty_level"] == {"count_dict": {"0": 3}, "correct_count_dict": {"0": 2},
                                          "correct_rate_dict": {"0": pytest.approx(2 / 3)}}
    task.release()


def test_a_command_through_the_protocol_cannot_read_the_host_shadow(server):
    base, _ = server
    task = LabTaskClient(base)
    with open("/etc/shadow") as f:
        host_root_line = next(line.strip() for line in f if line.startswith("root:"))
    session = run_sample(task, "users-add", [bash("cat /etc/shadow; cat /proc/self/uid_map"), "Act: finish"])
    output = session["chat_history"]["value"][4]["content"]
    assert host_root_line not in output and "root:*:" in output
    assert output.split()[-3:] == ["0", str(HOST_ID_BASE), "65536"]  # root inside is not root outside


def test_what_their_server_refuses_is_refused_with_a_client_error_and_the_reason(server):
    base, _ = server
    task = LabTaskClient(base)
    # Bodies their types reject: 422.
    assert refused(task.reset, {**new_session(task, "users-add"), "task_name": "no_such_task"})[0] == 422
    bad_role = new_session(task, "users-add")
    bad_role["chat_history"]["value"] = [{"role": "system", "content": "You are root."}]
    assert refused(task.reset, bad_role)[0] == 422
    # Requests their task asserts against: a 4xx (never a 500, which their client retries), with the reason.
    code, text = refused(task.reset, new_session(task, "no-such-task"))
    assert code == 404 and "unknown sample index" in text
    code, text = refused(task.complete, {**new_session(task, "users-delete"), "sample_status": "completed"})
    assert code == 409 and "call /api/reset first" in text  # complete before reset
    session = new_session(task, "users-delete")
    task.reset(session)
    code, text = refused(task.reset, new_session(task, "users-delete"))
    assert code == 409 and "already open" in text
    assert task.current_sample_index == "users-delete" and task.current_round == 0
    code, text = refused(task.complete, session)
    assert code == 409 and "no longer running" in text
    two_agents = json.loads(json.dumps(session))
    two_agents["chat_history"]["value"] += [{"role": "agent", "content": "Act: finish"}, {"role": "agent", "content": "Act: finish"}]
    code, text = refused(task.interact, two_agents)
    assert code == 400 and "two agent items" in text
    shortened = json.loads(json.dumps(session))
    shortened["chat_history"]["value"] = shortened["chat_history"]["value"][2:] + [{"role": "agent", "content": bash("true")}]
    code, text = refused(task.interact, shortened)
    assert code == 400 and "shortened or changed" in text  # a tampered history
    code, text = refused(task.interact, {**new_session(task, "users-uid"), "sample_status": "running",
                                         "chat_history": {"value": [{"role": "agent", "content": "Act: finish"}]}})
    assert code == 409 and "call /api/reset first" in text
    code, text = refused(task.calculate_metric, [{"sample_index": "no-such-task", "sample_status": "completed",
                                                  "evaluation_record": {"outcome": "correct", "detail_dict": None}}])
    assert code == 404 and "unknown sample indices" in text
    # The session itself still goes on: the refused requests changed nothing.
    session["chat_history"]["value"].append({"role": "agent", "content": bash(INSTANCES["users-delete"].solution.script)})
    task.interact(session)
    session["chat_history"]["value"].append({"role": "agent", "content": "Act: finish"})
    task.interact(session)
    task.complete(session)
    assert session["evaluation_record"]["outcome"] == "correct"


PATTERN = "{previous_sample_utilization_target_position}"


class LabFactoryClient:
    """LifelongAgentBench's ChatHistoryItemFactoryClient, from its shapes: built from the general instance factory
    the task's get_attribute hands over (module and parameters), it pings its server, then construct and set."""

    def __init__(self, server_address: str, request_timeout: int) -> None:
        self.server_address, self.request_timeout = server_address.rstrip("/"), request_timeout
        assert self._call("/ping") == {"response": "Hello, World!"}

    def _call(self, route: str, body: dict | None = None):
        return LabTaskClient._call(self, route, body)

    def construct(self, index: int, expected_role: str | None = None) -> dict:
        return self._call("/construct", {"chat_history_item_index": index, "expected_role": expected_role})["chat_history_item"]

    def set(self, index: int, role: str, content: str) -> None:
        self._call("/set", {"prompt_index": index, "role": role, "content": content})


def test_their_lifelong_callback_reads_and_sets_the_first_prompt_through_the_factory(server):
    """run_experiment.py with PreviousSampleUtilizationCallback: the runner reads item 0 of the task's
    chat_history_item_factory (it must hold the placeholder once), the callback sets it before each
    sample with the samples solved so far, and the task opens each history with it."""
    base, _ = server
    task = LabTaskClient(base)
    answer = task._call("/get_attribute", {"name": "chat_history_item_factory"})
    assert answer["instance_factory_type"] == "general"
    factory_spec = answer["instance_factory_parameter_dict"]
    assert factory_spec["module"] == "src.factories.chat_history_item.online.client.ChatHistoryItemFactoryClient"
    factory = LabFactoryClient(**factory_spec["parameters"])  # GeneralInstanceFactory.create()
    original = factory.construct(0, expected_role="user")["content"]
    assert original.count(PATTERN) == 1  # the callback's own assertion
    assert factory.construct(1, expected_role="agent") == {"role": "agent", "content": "OK."}
    items = factory._call("/get_chat_history_item_dict_deep_copy")["chat_history_item_dict"]["value"]
    assert items == {"0": {"role": "user", "content": original}, "1": {"role": "agent", "content": "OK."}}
    utilized: list[dict] = []
    sessions = []
    for index in ("users-add", "users-group-add"):
        # on_session_create: the question and the rest of each utilized session's history, in place of the pattern
        examples = "\n" + "".join(f"Question {s['chat_history']['value'][2]['content']}:\n"
                                   + "\n".join(f"{m['role']}: {m['content']}" for m in s["chat_history"]["value"][3:]) for s in utilized)
        factory.set(0, "user", original.replace(PATTERN, examples))
        instance = INSTANCES[index]
        session = run_sample(task, index, [bash(instance.solution.script), "Act: finish"])
        sessions.append(session)
        if session["evaluation_record"]["outcome"] == "correct" and session["sample_status"] == "completed":  # on_task_complete
            utilized.append(session)
    first, second = (s["chat_history"]["value"][0]["content"] for s in sessions)
    assert PATTERN not in first and PATTERN not in second
    assert INSTANCES["users-add"].instruction not in first
    assert f"Question {INSTANCES['users-add'].instruction}:" in second  # the first sample, solved, shown to the second
    assert [s["evaluation_record"]["outcome"] for s in sessions] == ["correct", "correct"]
    factory.set(0, "user", original)
    code, text = refused(factory.set, 1, "user", "no")
    assert code == 400 and "keeps the role" in text
    task.release()


def test_a_sample_left_idle_is_closed_and_then_refused_with_410():
    from halo_agent.envs.os_sandbox import SandboxConfig
    from halo_agent.task_server import OSTaskService, ProtocolError, Session

    service = OSTaskService(load_tasks()[:3], SandboxConfig(timeout_s=5), idle_timeout_s=0.3)
    index = sample_index_of(load_tasks()[0])
    session = service.reset(Session(task_name="os_interaction", sample_index=index))
    holder = service.sessions[index].sandbox.sandbox.holder_pid
    assert holder and Path(f"/proc/{holder}").exists()
    deadline = time.monotonic() + 10
    while (index in service.sessions or Path(f"/proc/{holder}").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the reaper looks every idle_timeout_s / 4, takes the sample, then closes its sandbox
    assert index not in service.sessions
    assert not Path(f"/proc/{holder}").exists()  # its sandbox is closed
    session.chat_history.value.append(session.chat_history.value[-1].model_copy(update={"role": "agent", "content": "Act: finish"}))
    with pytest.raises(ProtocolError) as refusal:
        service.interact(session)
    assert refusal.value.status == 410 and "without a request" in str(refusal.value)
    service.shutdown()


def test_set_attribute_and_shutdown_releases_every_sandbox(server):
    base, process = server
    task = LabTaskClient(base)
    task.max_round = 1
    assert task.max_round == 1
    limited = run_sample(task, "files-make-dirs", [bash("true"), "Act: finish"])
    assert limited["sample_status"] == "task_limit_reached"
    task.max_round = MAX_ROUNDS
    task.server_address_note = "kept"  # a name of the client's own: kept and read back, as on their task
    assert task.server_address_note == "kept"
    assert refused(task._call, "/set_attribute", {"name": "task_name", "instance_factory_type": "simple_immutable_type",
                                                 "instance_factory_parameter_dict": {"type": "str", "value": "db_bench"}})[0] == 400
    task.reset(new_session(task, "users-add"))  # left open: the server's shutdown must release it
    threads = Path(f"/proc/{process.pid}/task").iterdir()  # the routes run in a thread pool: each thread's children
    children = [int(p) for thread in threads for p in (thread / "children").read_text().split()]
    assert children  # the open sample's unshare
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 0
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
