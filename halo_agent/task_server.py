"""The os task server: LifelongAgentBench's session protocol over HTTP (FastAPI + uvicorn, loopback by default).

    halo-agent serve-tasks --env os --port 5000           # http://127.0.0.1:5000/api/...

Every route is a POST under ``/api`` taking and returning JSON, in the shapes of LifelongAgentBench's
``src/typings`` (its ``TaskClient`` and ``run_experiment.py`` loop work unchanged):

- ``/ping`` -> ``{"response": "Hello, World!"}``
- ``/get_attribute`` ``{"name": ...}`` -> ``{"instance_factory_type", "instance_factory_parameter_dict"}``:
  the attributes its runner and callbacks read from a task: ``task_name`` (an enum:
  ``{"module": "src.typings.general.TaskName", "value": "os_interaction"}``), ``max_round``,
  ``current_round``, ``current_sample_index``, ``command_execution_timeout`` (simple values:
  ``{"type": "int", "value": "5"}``), and ``chat_history_item_factory``: as LifelongAgentBench's
  server hands over a factory client, a ``general`` factory of its
  ``ChatHistoryItemFactoryClient`` pointed at this server's ``/api/chat_history_item_factory``
  (``/ping``, ``/construct``, ``/get_chat_history_item_dict_deep_copy``, ``/set``), whose items 0
  (user: the instructions) and 1 (agent: the acknowledgement) open every sample's history; both
  ``null`` for any other name (its client raises ``AttributeError``). Item 0 holds
  ``{previous_sample_utilization_target_position}`` once, where the lifelong callback
  (``PreviousSampleUtilizationCallback``) puts earlier solved samples with ``set``; a reset drops
  the placeholder if nothing replaced it. ``/set_attribute`` ``{"name", "instance_factory_type",
  "instance_factory_parameter_dict"}`` sets ``max_round`` or ``command_execution_timeout``; any other
  name but the server's own state is kept and read back, as setting it on their task would.
- ``/get_sample_index_list`` -> ``{"sample_index_list": [...]}`` (HALO task names; a
  LifelongAgentBench file's own keys)
- ``/reset`` ``{"session": Session}`` -> ``{"session": Session}``: a fresh sandbox with the task's
  init run (each sample is its task's instance of ``--task-seed``, 0 by default); the chat history gets the instructions (user), an
  acknowledgement (agent) and the task (user)
- ``/interact``: the last chat item is the agent's answer. As in LifelongAgentBench, the round limit
  is checked first (a ``max_round``-th answer past the limit, a finish included, gives
  ``task_limit_reached``), then the answer: ``Act: bash`` with a fenced block runs and its output is
  appended as a user item, ``Act: finish`` gives ``completed``, anything else
  ``agent_validation_failed``. A session the agent side marked ``agent_context_limit``,
  ``agent_out_of_memory`` or ``agent_unknown_error`` gets its default task output and no round.
- ``/complete``: runs the evaluation script (the session must no longer be ``running``);
  ``evaluation_record.outcome`` is ``correct``, ``incorrect`` or ``unknown``, ``detail_dict.reward``
  the reward map's value; the sandbox goes
- ``/release``: every open sandbox goes
- ``/calculate_metric`` ``{"session_partial_list": [...]}`` -> ``{"metric": {"overall", "skill",
  "difficulty_level"}}``: the share of each outcome and status and the mean reward; per skill and
  per difficulty level the counts, correct counts and correct rates (-1 where nothing was counted)

A Session is ``{task_name, sample_index, sample_status, chat_history: {value: [{role, content}]},
finish_reason, task_output, evaluation_record: {outcome, detail_dict}}`` with roles ``user`` and
``agent``. Several samples may be open at once (one sandbox each), keyed by sample index.

A body LifelongAgentBench's types reject (an unknown ``task_name``, a ``system`` role, an unknown
status) is a 422, as there. A request its task asserts against is a client error here (a 4xx whose
``detail`` says why; never a 500, which its client retries as a server fault): 404 for an unknown
sample index (reset, ``calculate_metric``); 409 for a request out of turn: a reset of a sample
already open or of a session not ``initial``, an interact or complete on a sample not open (before
its reset, or after its complete), an interact on a session not ``running`` (or with a finish reason
or task output already set), a complete on a ``running`` session, and a second request on a sample
while one is in progress (one request per sample at a time: the second is refused, not queued);
400 for a history whose last item is not the agent's, two agent items in a row, or a history
shortened or changed since the server's last answer; 410 for a sample closed after ``idle_timeout_s``
(600 s by default) without a request.

Sandboxes: each open sample holds one (``halo_agent.envs.os_sandbox``: its threat model); an idle
one is closed after ``idle_timeout_s``; at its start the server removes the sandboxes an earlier
server left behind when it was killed (``reap_stale_sandboxes``); commands of any length pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Literal, Optional, Sequence, Union

from pydantic import BaseModel, Field

from halo_agent.envs.base import EnvError
from halo_agent.envs.os_env import DEFAULT_MAX_ROUNDS, FINISH, SYSTEM_PROMPT, OSSession, RewardMap, parse_os_action
from halo_agent.envs.os_sandbox import SandboxConfig, reap_stale_sandboxes
from halo_agent.envs.os_tasks import TASK_PREFIX, OSTask, load_tasks

log = logging.getLogger(__name__)

TASK_NAME = "os_interaction"
TASK_NAMES = Literal["db_bench", "os_interaction", "knowledge_graph"]  # LifelongAgentBench's TaskName
STATUSES = ("initial", "running", "completed", "agent_validation_failed", "task_limit_reached",
            "task_environment_error", "task_unknown_error", "agent_context_limit", "agent_out_of_memory",
            "agent_unknown_error")
AGENT_ABNORMAL = ("agent_context_limit", "agent_out_of_memory", "agent_unknown_error")
OUTCOMES = ("unset", "correct", "incorrect", "unknown", "ignored")
ACKNOWLEDGEMENT = "OK."
# LifelongAgentBench's lifelong callback puts earlier solved samples here (item 0 must hold it once).
PREVIOUS_SAMPLES = "{previous_sample_utilization_target_position}"
FACTORY_ROUTE = "/chat_history_item_factory"
FACTORY_CLIENT = "src.factories.chat_history_item.online.client.ChatHistoryItemFactoryClient"
IDLE_TIMEOUT_S = 600.0
# LifelongAgentBench's client rebuilds an enum attribute from this module path.
TASK_NAME_ENUM = "src.typings.general.TaskName"
SETTABLE_ATTRIBUTES = ("max_round", "command_execution_timeout")  # take effect
READ_ONLY_ATTRIBUTES = ("task_name", "current_round", "current_sample_index")  # the server's state, not the client's

SampleIndex = Union[int, str]
SampleStatus = Literal[STATUSES]  # type: ignore[valid-type]


class ProtocolError(Exception):
    """A request LifelongAgentBench's task would assert against: answered with ``status`` (a 4xx) and the reason."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class ChatHistoryItem(BaseModel):
    role: Literal["user", "agent"]
    content: str


class ChatHistory(BaseModel):
    value: list[ChatHistoryItem] = Field(default_factory=list)


class EvaluationRecord(BaseModel):
    outcome: Literal[OUTCOMES] = "unset"  # type: ignore[valid-type]
    detail_dict: Optional[dict[str, Optional[Union[float, int, bool]]]] = None


class Session(BaseModel):
    task_name: TASK_NAMES
    sample_index: SampleIndex
    sample_status: SampleStatus = "initial"
    chat_history: ChatHistory = Field(default_factory=ChatHistory)
    finish_reason: Optional[str] = None
    task_output: Optional[dict[str, Optional[str]]] = None
    evaluation_record: EvaluationRecord = Field(default_factory=EvaluationRecord)


class SessionRequest(BaseModel):
    session: Session


class SessionPartial(BaseModel):
    sample_index: SampleIndex
    sample_status: SampleStatus
    evaluation_record: EvaluationRecord


class MetricRequest(BaseModel):
    session_partial_list: Sequence[SessionPartial]


class GetAttributeRequest(BaseModel):
    name: str


class SetAttributeRequest(BaseModel):
    name: str
    instance_factory_type: Literal["simple_immutable_type", "enum", "general"]
    instance_factory_parameter_dict: dict[str, Any]


def sample_index_of(task: OSTask) -> str:
    """A task's sample index: its name, or the key it had in a LifelongAgentBench file."""
    name = task.task_id[len(TASK_PREFIX):] if task.task_id.startswith(TASK_PREFIX) else task.task_id
    return name[len("lab-"):] if task.source == "lifelongagentbench" else name


@dataclasses.dataclass
class _OpenSample:
    sandbox: OSSession
    history: list[ChatHistoryItem]  # the history as the server last answered it
    rounds: int = 0
    busy: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one request on the sample at a time
    last_used: float = dataclasses.field(default_factory=time.monotonic)


class ConstructRequest(BaseModel):
    chat_history_item_index: int
    expected_role: Optional[Literal["user", "agent"]] = None


class SetPromptRequest(BaseModel):
    prompt_index: int
    role: Literal["user", "agent"]
    content: str


def simple_value(value: Any) -> dict[str, Any]:
    """LifelongAgentBench's transfer form of a bool, None, int, float or str."""
    return {"instance_factory_type": "simple_immutable_type",
            "instance_factory_parameter_dict": {"type": type(value).__name__, "value": str(value)}}


class OSTaskService:
    """The protocol's logic, apart from HTTP (the routes call these)."""

    def __init__(self, tasks: Sequence[OSTask], sandbox_config: SandboxConfig | None = None,
                 max_rounds: int = DEFAULT_MAX_ROUNDS, reward_map: RewardMap | None = None, task_seed: int = 0,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be positive, got {idle_timeout_s}")
        self.task_seed = int(task_seed)
        self.idle_timeout_s = float(idle_timeout_s)
        # LifelongAgentBench's ChatHistoryItemDict: the items every sample's history opens with.
        self.prompts: dict[str, ChatHistoryItem] = {
            "0": ChatHistoryItem(role="user", content=f"{SYSTEM_PROMPT}\n{PREVIOUS_SAMPLES}"),
            "1": ChatHistoryItem(role="agent", content=ACKNOWLEDGEMENT),
        }
        self.expired: dict[str, str] = {}  # samples closed for idleness, until reset again
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()
        self.tasks = {sample_index_of(t): t.instance(self.task_seed) for t in tasks}  # each sample: its seed's instance
        self.sandbox_config = sandbox_config or SandboxConfig()
        self.max_rounds = int(max_rounds)
        self.reward_map = reward_map or RewardMap()
        self.sessions: dict[str, _OpenSample] = {}
        self.current_sample_index: Optional[SampleIndex] = None  # the sample reset last, while open
        self.attributes: dict[str, dict[str, Any]] = {}  # attributes a client set, in their transfer form
        self._lock = threading.Lock()
        reap_stale_sandboxes(force=True)  # what a server killed earlier left behind

    def sample_index_list(self) -> list[str]:
        return list(self.tasks)

    # ------------------------------------------------------------------------------ attributes
    def get_attribute(self, name: str, server_address: str = "http://127.0.0.1:5000/api") -> dict[str, Any]:
        if name == "chat_history_item_factory" and name not in self.attributes:
            # LifelongAgentBench's server hands a factory client over this way (a Client is a pydantic model).
            return {"instance_factory_type": "general",
                    "instance_factory_parameter_dict": {"module": FACTORY_CLIENT, "parameters": {
                        "server_address": server_address.rstrip("/") + FACTORY_ROUTE, "request_timeout": 60}}}
        if name == "task_name":
            return {"instance_factory_type": "enum", "instance_factory_parameter_dict": {"module": TASK_NAME_ENUM, "value": TASK_NAME}}
        current = self.sessions.get(str(self.current_sample_index)) if self.current_sample_index is not None else None
        values = {"max_round": self.max_rounds, "current_round": current.rounds if current else 0,
                  "current_sample_index": self.current_sample_index,
                  "command_execution_timeout": int(self.sandbox_config.timeout_s)}
        if name in self.attributes:
            return self.attributes[name]
        if name not in values:
            return {"instance_factory_type": None, "instance_factory_parameter_dict": None}
        return simple_value(values[name])

    def set_attribute(self, request: SetAttributeRequest) -> None:
        """``max_round`` and ``command_execution_timeout`` take effect; any other name but the server's own state
        is kept as given and read back (LifelongAgentBench's client sets what it likes on its task)."""
        parameters = request.instance_factory_parameter_dict
        if request.name in READ_ONLY_ATTRIBUTES:
            raise ValueError(f"attribute {request.name!r} is the server's own; settable: {', '.join(SETTABLE_ATTRIBUTES)} and names of your own")
        if request.name not in SETTABLE_ATTRIBUTES:
            self.attributes[request.name] = {"instance_factory_type": request.instance_factory_type,
                                             "instance_factory_parameter_dict": dict(parameters)}
            return
        if request.instance_factory_type != "simple_immutable_type" or parameters.get("type") != "int":
            raise ValueError(f"{request.name} takes an int (simple_immutable_type), got {request.instance_factory_type} {parameters}")
        value = int(parameters["value"])
        if value < 1:
            raise ValueError(f"{request.name} must be at least 1, got {value}")
        if request.name == "max_round":
            self.max_rounds = value
        else:
            self.sandbox_config = dataclasses.replace(self.sandbox_config, timeout_s=float(value))

    # ---------------------------------------------------------------- the chat history item factory
    def construct(self, index: int, expected_role: Optional[str] = None) -> ChatHistoryItem:
        item = self.prompts.get(str(index))
        if item is None:
            raise ProtocolError(f"chat history item {index} does not exist (items: {', '.join(sorted(self.prompts))})", 404)
        if expected_role is not None and item.role != expected_role:
            raise ProtocolError(f"chat history item {index} has role {item.role!r}, not {expected_role!r}", 400)
        return item.model_copy()

    def set_prompt(self, index: int, role: str, content: str) -> None:
        """LifelongAgentBench's ``set``: an item's content (its role may not change), read by the next resets."""
        current = self.prompts.get(str(index))
        if current is not None and current.role != role:
            raise ProtocolError(f"chat history item {index} has role {current.role!r}: set keeps the role", 400)
        self.prompts[str(index)] = ChatHistoryItem(role=role, content=content)

    def _opening(self) -> list[ChatHistoryItem]:
        instructions, acknowledgement = self.construct(0, "user"), self.construct(1, "agent")
        instructions.content = instructions.content.replace(f"\n{PREVIOUS_SAMPLES}", "").replace(PREVIOUS_SAMPLES, "")
        return [instructions, acknowledgement]

    # -------------------------------------------------------------------------------- sessions
    def _task(self, index: SampleIndex) -> OSTask:
        task = self.tasks.get(str(index))
        if task is None:
            raise ProtocolError(f"Task reset failed: unknown sample index {index!r}: get them from /api/get_sample_index_list", 404)
        return task

    def _check_task_name(self, session: Session) -> None:
        if session.task_name != TASK_NAME:
            raise ProtocolError(f"this server serves task {TASK_NAME!r}, not {session.task_name!r}", 400)

    def reset(self, session: Session) -> Session:
        self._check_task_name(session)
        task = self._task(session.sample_index)
        if session.sample_status != "initial":
            raise ProtocolError(f"Task reset failed: reset needs a session in status 'initial', got {session.sample_status!r}")
        key = str(session.sample_index)
        sample = OSSession(task, self.sandbox_config, self.max_rounds)
        with self._lock:
            if key in self.sessions:
                raise ProtocolError(f"Task reset failed: sample {session.sample_index!r} is already open: complete it first")
            self.sessions[key] = _OpenSample(sample, [])  # claimed before the slow start, so a second reset fails
            self.expired.pop(key, None)
        self._start_reaper()
        session.sample_status = "running"
        try:
            sample.start()
        except EnvError as e:
            with self._lock:
                self.sessions.pop(key, None)
            session.sample_status, session.finish_reason = "task_environment_error", str(e)
            return session
        history = session.chat_history.value
        history += [*self._opening(), ChatHistoryItem(role="user", content=task.instruction)]
        with self._lock:
            if key in self.sessions:  # not released meanwhile
                self.sessions[key].history = [item.model_copy() for item in history]
                self.sessions[key].last_used = time.monotonic()
                self.current_sample_index = session.sample_index
        return session

    def _open(self, session: Session, route: str) -> _OpenSample:
        self._check_task_name(session)
        key = str(session.sample_index)
        sample = self.sessions.get(key)
        if sample is None:
            if key in self.expired:
                raise ProtocolError(f"{route}: sample {session.sample_index!r} {self.expired[key]}: reset it again", 410)
            raise ProtocolError(f"{route}: sample {session.sample_index!r} has no open session: call /api/reset first")
        return sample

    @contextlib.contextmanager
    def _claim(self, session: Session, route: str):
        """The open sample, held for this request: a second request on it meanwhile is refused (409)."""
        sample = self._open(session, route)
        if not sample.busy.acquire(blocking=False):
            raise ProtocolError(f"{route}: sample {session.sample_index!r} has a request in progress: one request per sample at a time")
        try:
            if self.sessions.get(str(session.sample_index)) is not sample:  # closed (idle, released) while we waited
                raise ProtocolError(f"{route}: sample {session.sample_index!r} was closed meanwhile: reset it again", 410)
            yield sample
        finally:
            sample.last_used = time.monotonic()
            sample.busy.release()

    def _check_history(self, sample: _OpenSample, history: list[ChatHistoryItem]) -> None:
        if not history or history[-1].role != "agent":
            raise ProtocolError("interact needs the agent's answer as the last chat history item (role 'agent')", 400)
        if len(history) >= 2 and history[-2].role == "agent":
            raise ProtocolError("the chat history holds two agent items in a row: one agent answer per interact", 400)
        if len(history) != len(sample.history) + 1 or history[:-1] != sample.history:
            raise ProtocolError(f"the chat history was shortened or changed since the last answer ({len(sample.history)} items "
                                f"then, {len(history) - 1} before the agent's answer now): send it back whole, plus the answer", 400)

    def interact(self, session: Session) -> Session:
        with self._claim(session, "interact") as sample:
            return self._interact(sample, session)

    def _interact(self, sample: _OpenSample, session: Session) -> Session:
        status = session.sample_status
        if not ((status == "running" and session.finish_reason is None) or status in AGENT_ABNORMAL):
            raise ProtocolError(f"interact needs a running session without a finish reason, got status {status!r}")
        if session.task_output is not None:
            raise ProtocolError("interact needs a session without a task output (it is set once the sample ends)")
        history = session.chat_history.value
        self._check_history(sample, history)
        if status in AGENT_ABNORMAL:
            session.task_output = {"answer": None}
            return session
        if sample.rounds >= self.max_rounds:  # the round limit first, whatever the answer (LifelongAgentBench's order)
            session.sample_status = "task_limit_reached"
            session.finish_reason = f"Task limit reached. The limit is {self.max_rounds}."
            session.task_output = {"answer": None}
            return session
        sample.rounds += 1
        action, error = parse_os_action(history[-1].content)
        if action is None:
            session.sample_status, session.finish_reason = "agent_validation_failed", error
            session.task_output = {"answer": None}
        elif action == FINISH:
            session.sample_status, session.task_output = "completed", {"answer": None}
        else:
            try:
                sample.sandbox.run_command(action)
            except EnvError as e:
                session.sample_status, session.finish_reason = "task_environment_error", str(e)
                session.task_output = {"answer": None}
                return session
            history.append(ChatHistoryItem(role="user", content=sample.sandbox.last_output))
        sample.history = [item.model_copy() for item in history]
        return session

    def complete(self, session: Session) -> Session:
        if session.sample_status == "running":
            self._open(session, "complete")
            raise ProtocolError("complete needs a session that is no longer running: interact until it ends (finish, round limit)")
        with self._claim(session, "complete") as claimed:
            with self._lock:
                sample = self.sessions.pop(str(session.sample_index), None)
            if sample is not claimed:
                raise ProtocolError(f"complete: sample {session.sample_index!r} has no open session: call /api/reset first")
        if str(self.current_sample_index) == str(session.sample_index):
            self.current_sample_index = None
        try:
            outcome = sample.sandbox.evaluate(session.sample_status)
        finally:
            sample.sandbox.close()
        session.evaluation_record = EvaluationRecord(outcome=outcome, detail_dict={"reward": self.reward_map.reward(outcome)})
        return session

    def release(self) -> None:
        with self._lock:
            sessions, self.sessions = list(self.sessions.values()), {}
            self.current_sample_index = None
        for sample in sessions:
            sample.sandbox.close()

    def shutdown(self) -> None:
        """Release every sandbox and stop the idle reaper (the server stops)."""
        self._closed.set()
        self.release()

    # ----------------------------------------------------------------------------- idle samples
    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_idle, name="halo-idle-samples", daemon=True)
                self._reaper.start()

    def _reap_idle(self) -> None:
        while not self._closed.wait(min(5.0, self.idle_timeout_s / 4)):
            self.close_idle()

    def close_idle(self) -> list[str]:
        """Close the samples without a request for ``idle_timeout_s`` (a request in progress keeps its sample)."""
        now, closed = time.monotonic(), []
        with self._lock:
            for key, sample in list(self.sessions.items()):
                if now - sample.last_used >= self.idle_timeout_s and sample.busy.acquire(blocking=False):
                    del self.sessions[key]
                    self.expired[key] = f"was closed after {self.idle_timeout_s:g} s without a request"
                    if str(self.current_sample_index) == key:
                        self.current_sample_index = None
                    closed.append((key, sample))
        for key, sample in closed:
            sample.sandbox.close()
            sample.busy.release()
        if closed:
            log.warning("closed %d idle sample(s): %s", len(closed), ", ".join(k for k, _ in closed))
        return [key for key, _ in closed]

    # ---------------------------------------------------------------------------------- metric
    def calculate_metric(self, partials: Sequence[SessionPartial]) -> dict[str, Any]:
        unknown = [p.sample_index for p in partials if str(p.sample_index) not in self.tasks]
        if unknown:
            raise ProtocolError(f"calculate_metric over unknown sample indices {unknown[:5]}: get them from /api/get_sample_index_list", 404)
        tasks = [self.tasks[str(p.sample_index)] for p in partials]
        correct = [p.evaluation_record.outcome == "correct" for p in partials]
        return {"overall": self._overall(partials), "skill": self._by_skill(tasks, correct),
                "difficulty_level": self._by_difficulty(tasks, correct)}

    def _overall(self, partials: Sequence[SessionPartial]) -> dict[str, dict[str, float]]:
        n = len(partials)
        metric: dict[str, dict[str, float]] = {"basic": {"session_count": float(n)}}
        if n == 0:
            return metric
        outcomes = [p.evaluation_record.outcome for p in partials]
        rewards = [self.reward_map.reward(o) if o in ("correct", "incorrect", "unknown") else 0.0 for o in outcomes]
        metric["evaluation_outcome"] = {o: outcomes.count(o) / n for o in OUTCOMES}
        metric["sample_status"] = {s: sum(p.sample_status == s for p in partials) / n for s in STATUSES}
        metric["reward"] = {"mean": sum(rewards) / n}
        return metric

    def _by_skill(self, tasks: list[OSTask], correct: list[bool]) -> dict[str, dict[str, float]]:
        skills = sorted({skill for task in self.tasks.values() for skill in task.skills})
        count = {s: 0 for s in skills}
        right = {s: 0 for s in skills}
        for task, ok in zip(tasks, correct):
            for skill in task.skills:
                count[skill] += 1
                right[skill] += ok
        rate = _rates(count, right)
        # Every skill of a task counts as effective (LifelongAgentBench's default for os_interaction).
        return {"count_dict": count, "correct_count_dict": right, "correct_rate_dict": rate,
                "effective_count_dict": dict(count), "effective_correct_count_dict": dict(right),
                "effective_correct_rate_dict": dict(rate)}

    @staticmethod
    def _by_difficulty(tasks: list[OSTask], correct: list[bool]) -> dict[str, dict[str, float]]:
        levels = [str(level) for level in sorted({task.difficulty for task in tasks})]
        count = {level: 0 for level in levels}
        right = {level: 0 for level in levels}
        for task, ok in zip(tasks, correct):
            count[str(task.difficulty)] += 1
            right[str(task.difficulty)] += ok
        return {"count_dict": count, "correct_count_dict": right, "correct_rate_dict": _rates(count, right)}


def _rates(count: dict[str, int], right: dict[str, int]) -> dict[str, float]:
    return {key: (right[key] / n if n else -1) for key, n in count.items()}


def create_app(service: OSTaskService):
    """The FastAPI app: the protocol's routes under ``/api``; what LifelongAgentBench's task refuses is a 4xx with the reason."""
    from fastapi import APIRouter, FastAPI, HTTPException, Request

    def guarded(call, *args):
        try:
            return call(*args)
        except ProtocolError as e:
            raise HTTPException(status_code=e.status, detail=str(e)) from None
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None

    router = APIRouter()

    @router.post("/ping")
    def ping() -> dict[str, str]:
        return {"response": "Hello, World!"}

    def get_attribute(request: GetAttributeRequest, http: Request) -> dict[str, Any]:
        return service.get_attribute(request.name, str(http.base_url).rstrip("/") + "/api")

    get_attribute.__annotations__["http"] = Request  # imported here, not where FastAPI resolves the names
    router.post("/get_attribute")(get_attribute)

    @router.post("/set_attribute")
    def set_attribute(request: SetAttributeRequest) -> None:
        guarded(service.set_attribute, request)

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
        return {"metric": guarded(service.calculate_metric, request.session_partial_list)}

    # LifelongAgentBench's chat history item factory server, for the factory client get_attribute hands over.
    factory = APIRouter()

    @factory.post("/ping")
    def factory_ping() -> dict[str, str]:
        return {"response": "Hello, World!"}

    @factory.post("/get_attribute")
    def factory_get_attribute(request: GetAttributeRequest) -> dict[str, Any]:
        return {"instance_factory_type": None, "instance_factory_parameter_dict": None}

    @factory.post("/construct")
    def construct(request: ConstructRequest) -> dict[str, Any]:
        item = guarded(service.construct, request.chat_history_item_index, request.expected_role)
        return {"chat_history_item": item.model_dump()}

    @factory.post("/get_chat_history_item_dict_deep_copy")
    def get_chat_history_item_dict_deep_copy() -> dict[str, Any]:
        return {"chat_history_item_dict": {"value": {k: v.model_dump() for k, v in service.prompts.items()}}}

    @factory.post("/set")
    def set_prompt(request: SetPromptRequest) -> None:
        guarded(service.set_prompt, request.prompt_index, request.role, request.content)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        service.shutdown()  # the server stops: no sandbox outlives it

    app = FastAPI(title="HALO os task server", lifespan=lifespan)
    app.include_router(router, prefix="/api")
    app.include_router(factory, prefix="/api" + FACTORY_ROUTE)
    return app


def build_service(task_file: str | None = None, max_rounds: int = DEFAULT_MAX_ROUNDS, reward_map: str | None = None,
                  timeout_s: float = 20.0, task_seed: int = 0, idle_timeout_s: float = IDLE_TIMEOUT_S) -> OSTaskService:
    return OSTaskService(load_tasks(task_file), SandboxConfig(timeout_s=timeout_s), max_rounds, RewardMap.parse(reward_map),
                         task_seed=task_seed, idle_timeout_s=idle_timeout_s)


def serve(service: OSTaskService, host: str = "127.0.0.1", port: int = 5000) -> None:
    """Serve in the foreground until Ctrl-C; open sandboxes are released on the way out."""
    import uvicorn

    uvicorn.run(create_app(service), host=host, port=port, log_level="warning")
