"""The OS-interaction environment (``--env os``): bash tasks, one throwaway sandbox per sample.

    env = OSEnv()                                   # tasks: configs/os_tasks.yaml, or task_file=...
    page = env.reset(task, task_seed=3)             # a fresh sandbox, the init of the task's seed-3 instance run
    outcome = env.step("touch /srv/app/ready")      # the command's output is the next observation
    outcome = env.step(FINISH)                      # evaluation: +1 correct, -0.5 incorrect (or timed out, or crashed)
    env.close()

It follows LifelongAgentBench's os_interaction protocol: the agent answers ``Act: bash`` with a
fenced ```bash block (run as its own ``bash -c`` in the sample's sandbox) or ``Act: finish``; the
OS answers "The output of the OS: ..."; after ``max_rounds`` commands (5 by default) or a finish,
the task's evaluation script decides (exit 0: correct), run from trusted tools
(``Sandbox.evaluate``: the host's interpreters and loader, the sandbox's data only). A check that
fails, times out or cannot run makes the outcome ``incorrect``: no failure pays better than a wrong
answer, so a policy gains nothing by stalling the check (a fifo where a file should be) or by
breaking the sandbox. ``unknown`` is LifelongAgentBench's outcome for a sample
never evaluated; HALO's evaluation does not give it.

Steps land in the lake like browser steps, with ``env = 'os'``: the prompt is the chat history
(``PageState.extra["messages"]``, prompt version ``OS_PROMPT_VERSION``), the action is the
command (or ``finish``), the observation is the command's output, truncated with a marker
(``halo_agent.envs.os_sandbox``). The step's ``success`` reward component carries the reward map's
value of the outcome on the step that ended the episode.

``OSSession`` is one sample (sandbox, chat history, rounds, outcome); the environment and the task
server (``halo_agent.task_server``) both drive it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Mapping

from halo_agent.envs.base import EnvError, PageState, StepOutcome, TaskSpec, UnknownTaskError
from halo_agent.envs.os_sandbox import HELPER_FAILED, CommandResult, Sandbox, SandboxConfig, SandboxError
from halo_agent.envs.os_tasks import CATEGORIES, ENV_NAME, OSTask, Script, load_tasks

log = logging.getLogger(__name__)

OS_PROMPT_VERSION = "halo-os-prompt-v1"
DEFAULT_MAX_ROUNDS = 5
FINISH = "finish"
OUTCOMES = ("correct", "incorrect", "unknown")

SYSTEM_PROMPT = (
    "You are an assistant that operates a Linux (bash) machine as root to complete the user's task.\n"
    "Each turn, think briefly, then take exactly one action:\n"
    "1. To run a command, answer:\n"
    "Think: <your reasoning>\n"
    "Act: bash\n"
    "```bash\n"
    "<the command>\n"
    "```\n"
    "2. When the task is done, answer:\n"
    "Think: <your reasoning>\n"
    "Act: finish\n"
    "Every command runs in a fresh bash; files and processes persist between commands. "
    f"You have at most {DEFAULT_MAX_ROUNDS} commands."
)
# Commands a random policy draws from (the task's own solution never among them).
RANDOM_COMMANDS = ("ls -la", "pwd", "whoami", "cat /etc/os-release", "ls /srv", "id", "ps -e", FINISH)

_ACT = re.compile(r"Act:\s*(.+)")
_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\n(.*?)\n?```", re.DOTALL)


def parse_os_action(text: str | None) -> tuple[str | None, str | None]:
    """``(command or FINISH, None)`` from a model's answer, or ``(None, why not)``.

    LifelongAgentBench's format (``Act: bash`` with a fenced block, ``Act: finish``); an answer
    without ``Act:`` that holds a fenced bash block is taken as that command.
    """
    text = text or ""
    act = _ACT.search(text)
    blocks = [b.strip() for b in _BASH_BLOCK.findall(text) if b.strip()]
    if act is not None:
        kind = act.group(1).strip().lower()
        if kind.startswith("finish"):
            return FINISH, None
        if not kind.startswith("bash"):
            return None, f"unknown action {act.group(1).strip()[:40]!r}: answer Act: bash or Act: finish"
    if blocks:
        return "\n\n".join(blocks), None
    if act is not None:
        return None, "Act: bash without a ```bash block holding the command"
    return None, "no action: answer Act: bash with a ```bash block, or Act: finish"


def agent_turn(action: str) -> str:
    """The assistant message an action is recorded as in the chat history (canonical, so prompts repeat)."""
    if action == FINISH:
        return "Act: finish"
    return f"Act: bash\n```bash\n{action}\n```"


def os_output_message(result: CommandResult, timeout_s: float) -> str:
    if result.timed_out:
        return f"The command is marked as timeout since it did not finish within {timeout_s:g} seconds."
    if not result.output:
        return "The output of the OS is empty."
    return "The output of the OS:\n\n" + result.output


@dataclasses.dataclass(frozen=True)
class RewardMap:
    """Reward per evaluation outcome (+1 correct, -0.5 incorrect, 0 unknown by default).

    A check that times out or crashes is ``incorrect`` (``OSSession.evaluate``), so it is paid as a
    wrong answer whatever the map; ``unknown`` is kept for LifelongAgentBench's outcome of a sample
    never evaluated."""

    correct: float = 1.0
    incorrect: float = -0.5
    unknown: float = 0.0

    @classmethod
    def parse(cls, value: "RewardMap | Mapping[str, Any] | str | None") -> "RewardMap":
        """From a mapping or ``"correct=1,incorrect=-0.5,unknown=0"`` (outcomes left out keep their default)."""
        if value is None or isinstance(value, RewardMap):
            return value or cls()
        if isinstance(value, str):
            pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ValueError(f"reward map {value!r}: write outcome=value pairs, e.g. correct=1,incorrect=-0.5,unknown=0")
            value = {k.strip(): v.strip() for k, v in pairs}
        unknown = set(value) - set(OUTCOMES)
        if unknown:
            raise ValueError(f"reward map: unknown outcome(s) {', '.join(sorted(unknown))}; outcomes are {', '.join(OUTCOMES)}")
        try:
            return cls(**{k: float(v) for k, v in value.items()})
        except (TypeError, ValueError):
            raise ValueError(f"reward map {dict(value)!r}: values must be numbers") from None

    def reward(self, outcome: str) -> float:
        return float(getattr(self, outcome))

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


class OSSession:
    """One sample: a sandbox with the task's init run, the chat history, rounds, and the outcome."""

    def __init__(self, task: OSTask, sandbox_config: SandboxConfig | None = None, max_rounds: int = DEFAULT_MAX_ROUNDS):
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        self.task = task
        self.sandbox = Sandbox(sandbox_config)
        self.max_rounds = int(max_rounds)
        self.rounds = 0
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.instruction},
        ]
        self.last_output = ""
        self.outcome: str | None = None  # correct | incorrect, once evaluated
        self.evaluation: str | None = None  # passed | failed | timed out | crashed, once evaluated
        self.finish_reason: str | None = None

    def start(self) -> None:
        """Start the sandbox and run the task's init; ``EnvError`` when either fails."""
        try:
            self.sandbox.start()
            result = self._run(self.task.init)
        except SandboxError as e:
            self.close()
            raise EnvError(str(e)) from e
        if result.timed_out or result.exit_code != 0:
            self.close()
            raise EnvError(f"the init script of {self.task.task_id} failed (exit {result.exit_code}): {result.output[-200:].strip()}")

    def _run(self, script: Script) -> CommandResult:
        return self.sandbox.run(script.script, interpreter=script.interpreter)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def act(self, action: str) -> CommandResult | None:
        """Record the agent's action; run it when it is a command. Evaluates on finish or at the round limit."""
        if self.done:
            raise EnvError(f"{self.task.task_id} is already evaluated ({self.outcome})")
        self.messages.append({"role": "assistant", "content": agent_turn(action)})
        if action == FINISH:
            self.evaluate("finished")
            return None
        self.rounds += 1
        result = self.run_command(action)
        self.messages.append({"role": "user", "content": self.last_output})
        if self.rounds >= self.max_rounds:
            self.evaluate(f"round limit reached ({self.max_rounds})")
        return result

    def run_command(self, command: str) -> CommandResult:
        """Run one command in the sample's sandbox; ``last_output`` becomes the OS's answer to it."""
        try:
            result = self.sandbox.run(command)
        except SandboxError as e:
            raise EnvError(str(e)) from e
        self.last_output = os_output_message(result, self.sandbox.config.timeout_s)
        return result

    def evaluate(self, reason: str) -> str:
        """Run the evaluation script once, from trusted tools: correct (exit 0) or incorrect (any other exit,
        a timeout, or a check that could not run: ``evaluation`` says which)."""
        if self.outcome is None:
            try:
                result = self.sandbox.evaluate(self.task.evaluation.script, interpreter=self.task.evaluation.interpreter)
                if result.timed_out:
                    self.evaluation = "timed out"
                elif result.exit_code == HELPER_FAILED:
                    self.evaluation = "crashed"
                    log.warning("evaluation of %s could not run: %s", self.task.task_id, result.output[-300:].strip())
                else:
                    self.evaluation = "passed" if result.exit_code == 0 else "failed"
            except SandboxError as e:
                log.warning("evaluation of %s could not run: %s", self.task.task_id, e)
                self.evaluation = "crashed"
            self.outcome = "correct" if self.evaluation == "passed" else "incorrect"
            self.finish_reason = reason
        return self.outcome

    def close(self) -> None:
        self.sandbox.close()


class OSEnv:
    """OS-interaction episodes, one sandbox each (implements ``halo_agent.envs.base.Environment``)."""

    name = ENV_NAME

    def __init__(
        self,
        task_file: str | None = None,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        reward_map: RewardMap | Mapping[str, Any] | str | None = None,
        timeout_s: float = 20.0,
        memory_mb: int = 512,
        max_processes: int = 64,
        output_limit: int = 8192,
        rootfs: str = "/",
        cpus: float = 1.0,
        **_: Any,
    ) -> None:
        self.task_file = task_file
        self.max_rounds = int(max_rounds)
        self.reward_map = RewardMap.parse(reward_map)
        self.sandbox_config = SandboxConfig(
            timeout_s=float(timeout_s), memory_mb=int(memory_mb), max_processes=int(max_processes),
            output_limit=int(output_limit), rootfs=rootfs, cpus=float(cpus),
        )
        self.session: OSSession | None = None

    @classmethod
    def list_tasks(cls, task_file: str | None = None, task_seed: int | None = None, **_: Any) -> list[TaskSpec]:
        """The tasks, each goal that of the instance of ``task_seed`` (0 by default); a reset draws its own seed's."""
        return [t.to_spec(task_seed or 0) for t in load_tasks(task_file)]

    @classmethod
    def subsets(cls, task_file: str | None = None) -> dict[str, list[str]]:
        """Named task subsets: ``short`` (one short command solves each), and each category."""
        tasks = load_tasks(task_file)
        named = {"all": [t.task_id for t in tasks], "short": [t.task_id for t in tasks if t.short]}
        for category in CATEGORIES:
            named[category] = [t.task_id for t in tasks if t.category == category]
        return named

    def reset(self, task: TaskSpec, task_seed: int) -> PageState:
        self._end_session()
        try:
            os_task = OSTask.from_spec(task).instance(task_seed)
        except ValueError as e:
            raise UnknownTaskError(str(e)) from None
        self.session = OSSession(os_task, self.sandbox_config, self.max_rounds)
        self.session.start()
        return self._page()

    def _page(self) -> PageState:
        session = self.session
        assert session is not None
        return PageState(
            goal=session.task.instruction,
            url=f"os://{session.task.task_id}",
            axtree=session.last_output,
            elements=(),
            screenshot=None,
            extra={
                "messages": [dict(m) for m in session.messages],
                "prompt_version": OS_PROMPT_VERSION,
                "action_format": "bash",
                "commands": list(RANDOM_COMMANDS),
                "round": session.rounds,
            },
        )

    def step(self, action: str) -> StepOutcome:
        session = self.session
        if session is None:
            raise EnvError("step() before reset()")
        result = session.act(action)
        info: dict[str, Any] = {}
        if result is not None:
            info.update(exit_code=result.exit_code, timed_out=result.timed_out, truncated=result.truncated,
                        command_ms=round(result.duration_ms, 2))
        return self._outcome(info, action_error="timeout" if result is not None and result.timed_out else None)

    def conclude(self) -> StepOutcome:
        """Evaluate an episode that the episode loop stopped before a finish (e.g. its last output did not parse)."""
        if self.session is None:
            raise EnvError("conclude() before reset()")
        self.session.evaluate("stopped by the episode loop")
        return self._outcome({})

    def _outcome(self, info: dict[str, Any], action_error: str | None = None) -> StepOutcome:
        session = self.session
        assert session is not None
        done = session.done
        page = self._page()
        if done:
            info.update(outcome=session.outcome, evaluation=session.evaluation, finish_reason=session.finish_reason,
                        rounds=session.rounds)
            session.close()  # evaluated: nothing more runs in this sandbox
        return StepOutcome(
            page=page,
            reward=self.reward_map.reward(session.outcome) if done else 0.0,
            terminated=done,
            action_error=action_error,
            raw_reward=(1.0 if session.outcome == "correct" else 0.0) if done else None,
            info=info,
        )

    def _end_session(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def close(self) -> None:
        self._end_session()
