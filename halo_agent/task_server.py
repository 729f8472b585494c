"""The os task server: LifelongAgentBench's session protocol over HTTP (FastAPI + uvicorn, loopback by default).

    halo-agent serve-tasks --env os --port 5000           # http://127.0.0.1:5000/api/...

Every route is a POST under ``/api`` taking and returning JSON, as LifelongAgentBench's
``TaskClient`` calls them, so that client works unchanged:

- ``/ping`` -> ``{"response": "Hello, World!"}``
- ``/get_sample_index_list`` -> ``{"sample_index_list": [...]}`` (HALO task names; a
  LifelongAgentBench file's own keys)
- ``/reset`` ``{"session": Session}`` -> ``{"session": Session}``: a fresh sandbox with the task's
  init run; the chat history gets the instructions (user), an acknowledgement (agent) and the task (user)
- ``/interact`` ``{"session": ...}``: the last chat item is the agent's answer (``Act: bash`` with a
  fenced block, or ``Act: finish``); a command's output is appended as a user item. A finish sets
  ``sample_status`` ``completed``, an answer that does not parse ``agent_validation_failed``, a command
  past ``max_rounds`` ``task_limit_reached``
- ``/complete`` ``{"session": ...}``: runs the evaluation script; ``evaluation_record.outcome`` is
  ``correct``, ``incorrect`` or ``unknown``, ``detail_dict.reward`` the reward map's value; the sandbox goes
- ``/release``: every open sandbox goes
- ``/calculate_metric`` ``{"session_partial_list": [...]}`` -> ``{"metric": {...}}``: the share of each
  outcome and each status, the mean reward and the count

A Session is ``{task_name, sample_index, sample_status, chat_history: {value: [{role, content}]},
finish_reason, task_output, evaluation_record: {outcome, detail_dict}}`` with roles ``user`` and
``agent``. Several samples may be open at once (one sandbox each), keyed by sample index.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Optional, Sequence, Union

from pydantic import BaseModel, Field

from halo_agent.envs.base import EnvError
from halo_agent.envs.os_env import DEFAULT_MAX_ROUNDS, FINISH, SYSTEM_PROMPT, OSSession, RewardMap, parse_os_action
from halo_agent.envs.os_sandbox import SandboxConfig
from halo_agent.envs.os_tasks import TASK_PREFIX, OSTask, load_tasks

log = logging.getLogger(__name__)

TASK_NAME = "os_interaction"
STATUSES = ("initial", "running", "completed", "agent_validation_failed", "task_limit_reached",
            "task_environment_error", "task_unknown_error", "agent_context_limit", "agent_out_of_memory",
            "agent_unknown_error")
ACKNOWLEDGEMENT = "OK."

SampleIndex = Union[int, str]


class ChatHistoryItem(BaseModel):
    role: str
    content: str


class ChatHistory(BaseModel):
    value: list[ChatHistoryItem] = Field(default_factory=list)


class EvaluationRecord(BaseModel):
    outcome: str = "unset"
    detail_dict: Optional[dict[str, Optional[Union[float, int, bool]]]] = None


class Session(BaseModel):
    task_name: str = TASK_NAME
    sample_index: SampleIndex
    sample_status: str = "initial"
    chat_history: ChatHistory = Field(default_factory=ChatHistory)
    finish_reason: Optional[str] = None
    task_output: Optional[dict[str, Optional[str]]] = None
    evaluation_record: EvaluationRecord = Field(default_factory=EvaluationRecord)


class SessionRequest(BaseModel):
    session: Session


class SessionPartial(BaseModel):
    sample_index: SampleIndex
    sample_status: str
    evaluation_record: EvaluationRecord


class MetricRequest(BaseModel):
    session_partial_list: Sequence[SessionPartial]


def sample_index_of(task: OSTask) -> str:
    """A task's sample index: its name, or the key it had in a LifelongAgentBench file."""
    name = task.task_id[len(TASK_PREFIX):] if task.task_id.startswith(TASK_PREFIX) else task.task_id
    return name[len("lab-"):] if task.source == "lifelongagentbench" else name


class OSTaskService:
    """The protocol's logic, apart from HTTP (the routes call these)."""

    def __init__(self, tasks: Sequence[OSTask], sandbox_config: SandboxConfig | None = None,
                 max_rounds: int = DEFAULT_MAX_ROUNDS, reward_map: RewardMap | None = None) -> None:
        self.tasks = {sample_index_of(t): t for t in tasks}
        self.sandbox_config = sandbox_config or SandboxConfig()
        self.max_rounds = int(max_rounds)
        self.reward_map = reward_map or RewardMap()
        self.sessions: dict[str, OSSession] = {}
        self._lock = threading.Lock()

    def sample_index_list(self) -> list[str]:
        return list(self.tasks)

    def _task(self, index: SampleIndex) -> OSTask:
        task = self.tasks.get(str(index))
        if task is None:
            raise KeyError(f"unknown sample index {index!r}: get them from /api/get_sample_index_list")
        return task

    def reset(self, session: Session) -> Session:
        task = self._task(session.sample_index)
        if session.sample_status != "initial":
            raise ValueError(f"reset needs a session in status 'initial', got {session.sample_status!r}")
        key = str(session.sample_index)
        with self._lock:
            old = self.sessions.pop(key, None)
        if old is not None:
            old.close()
        sample = OSSession(task, self.sandbox_config, self.max_rounds)
        session.sample_status = "running"
        try:
            sample.start()
        except EnvError as e:
            session.sample_status, session.finish_reason = "task_environment_error", str(e)
            return session
        with self._lock:
            self.sessions[key] = sample
        history = session.chat_history.value
        history += [ChatHistoryItem(role="user", content=SYSTEM_PROMPT), ChatHistoryItem(role="agent", content=ACKNOWLEDGEMENT),
                    ChatHistoryItem(role="user", content=task.instruction)]
        return session

    def _open(self, session: Session) -> OSSession:
        sample = self.sessions.get(str(session.sample_index))
        if sample is None:
            raise ValueError(f"sample {session.sample_index!r} has no open session: call /api/reset first")
        return sample

    def interact(self, session: Session) -> Session:
        sample = self._open(session)
        history = session.chat_history.value
        if session.sample_status != "running":
            return session
        if not history or history[-1].role != "agent":
            raise ValueError("interact needs the agent's answer as the last chat history item (role 'agent')")
        action, error = parse_os_action(history[-1].content)
        if action is None:
            session.sample_status, session.finish_reason = "agent_validation_failed", error
            session.task_output = {"answer": None}
        elif action == FINISH:
            session.sample_status, session.task_output = "completed", {"answer": None}
        elif sample.rounds >= sample.max_rounds:
            session.sample_status = "task_limit_reached"
            session.finish_reason = f"Task limit reached. The limit is {sample.max_rounds}."
            session.task_output = {"answer": None}
        else:
            try:
                sample.act(action)
            except EnvError as e:
                session.sample_status, session.finish_reason = "task_environment_error", str(e)
                return session
            history.append(ChatHistoryItem(role="user", content=sample.last_output))
        return session

    def complete(self, session: Session) -> Session:
        with self._lock:
            sample = self.sessions.pop(str(session.sample_index), None)
        if sample is None:
            raise ValueError(f"sample {session.sample_index!r} has no open session: call /api/reset first")
        try:
            outcome = sample.evaluate(session.sample_status)
        finally:
            sample.close()
        session.evaluation_record = EvaluationRecord(outcome=outcome, detail_dict={"reward": self.reward_map.reward(outcome)})
        return session

    def release(self) -> None:
        with self._lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for sample in sessions:
            sample.close()

    def calculate_metric(self, partials: Sequence[SessionPartial]) -> dict[str, Any]:
        n = len(partials)
        metric: dict[str, Any] = {"overall": {"basic": {"session_count": float(n)}}}
        if n == 0:
            return metric
        outcomes = [p.evaluation_record.outcome for p in partials]
        rewards = [self.reward_map.reward(o) if o in ("correct", "incorrect", "unknown") else 0.0 for o in outcomes]
        metric["overall"]["evaluation_outcome"] = {o: outcomes.count(o) / n for o in ("unset", "correct", "incorrect", "unknown", "ignored")}
        metric["overall"]["sample_status"] = {s: sum(p.sample_status == s for p in partials) / n for s in STATUSES}
        metric["overall"]["reward"] = {"mean": sum(rewards) / n}
        return metric


def create_app(service: OSTaskService):
    """The FastAPI app: the protocol's routes under ``/api``; a request the protocol refuses is a 400 with the reason."""
    from fastapi import APIRouter, FastAPI, HTTPException

    def guarded(call, *args):
        try:
            return call(*args)
        except (KeyError, ValueError) as e:
            raise HTTPException(status_code=400, detail=str(e).strip("'\"")) from None

    router = APIRouter()

    @router.post("/ping")
    def ping() -> dict[str, str]:
        return {"response": "Hello, World!"}

    @router.post("/get_sample_index_list")
    def get_sample_index_list() -> dict[str, list[str]]:
        return {"sample_index_list": service.sample_index_list()}

    @router.post("/reset")
    def reset(request: SessionRequest) -> SessionRequest:
        return SessionRequest(session=guarded(service.reset, request.session))

    @router.post("/interact")
    def interact(request: SessionRequest) -> SessionRequest:
        return SessionRequest(session=guarded(service.interact, request.session))

    @router.post("/complete")
    def complete(request: SessionRequest) -> SessionRequest:
        return SessionRequest(session=guarded(service.complete, request.session))

    @router.post("/release")
    def release() -> None:
        service.release()

    @router.post("/calculate_metric")
    def calculate_metric(request: MetricRequest) -> dict[str, Any]:
        return {"metric": service.calculate_metric(request.session_partial_list)}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        service.release()  # the server stops: no sandbox outlives it

    app = FastAPI(title="HALO os task server", lifespan=lifespan)
    app.include_router(router, prefix="/api")
    return app


def build_service(task_file: str | None = None, max_rounds: int = DEFAULT_MAX_ROUNDS, reward_map: str | None = None,
                  timeout_s: float = 20.0) -> OSTaskService:
    return OSTaskService(load_tasks(task_file), SandboxConfig(timeout_s=timeout_s), max_rounds, RewardMap.parse(reward_map))


def serve(service: OSTaskService, host: str = "127.0.0.1", port: int = 5000) -> None:
    """Serve in the foreground until Ctrl-C; open sandboxes are released on the way out."""
    import uvicorn

    uvicorn.run(create_app(service), host=host, port=port, log_level="warning")
