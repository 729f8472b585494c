"""OS-interaction tasks: HALO's own set (``configs/os_tasks.yaml``) and LifelongAgentBench's JSON format.

A task is an instruction, an initialization script that prepares a fresh sandbox, an evaluation
script whose exit code 0 means the task is done, and a reference solution. HALO's set is YAML; each
task is a template whose ``params`` are drawn from the task seed (``halo_agent.envs.os_templates``),
so names, paths, file contents, users and expected answers differ between instances::

    tasks:
      - id: files-create-empty
        category: files            # files | permissions | processes | text | users (the step's site)
        params:
          dir: {choice: [/srv/app, /srv/web]}
          file: {choice: [ready, done]}
        instruction: Create an empty file named {{file}} in the folder {{dir}}.
        init: mkdir -p {{dir}}
        evaluation: test -f {{dir}}/{{file}} && test ! -s {{dir}}/{{file}}
        solution: touch {{dir}}/{{file}}
        skills: [touch]
        difficulty: 0              # 0, 1, 2, ...: the task server's metric per difficulty level
        short: true                # one short command solves it (the learning subset)

LifelongAgentBench's ``os_interaction`` data is one JSON object keyed by sample index::

    {"0": {"instruction": "...",
           "initialization_command_item": {"command_name": "bash", "script": "..."},
           "evaluation_info": {"ground_truth_command_item": {"command_name": "bash", "script": "..."},
                               "evaluation_command_item": {"command_name": "bash", "script": "..."}},
           "skill_list": ["useradd", "chmod"],
           "raw_entry_hash": "..."}}

``load_tasks(path)`` reads either (by content); a LifelongAgentBench sample ``7`` becomes task
``os.lab-7`` (no parameters: every seed gives the same instance). ``task.instance(seed)`` is the
task of one seed, its scripts filled in. Tasks travel to rollout workers inside their ``TaskSpec``
(``extra`` holds the templates and parameters; ``goal`` is the instance of the seed listed).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from halo_agent.envs.base import TaskSpec
from halo_agent.envs.os_templates import TemplateError, check_params, draw, render

ENV_NAME = "os"
TASK_PREFIX = "os."
BUILTIN_TASKS = Path(__file__).resolve().parent.parent / "configs" / "os_tasks.yaml"
INTERPRETERS = ("bash", "python")
CATEGORIES = ("files", "permissions", "processes", "text", "users")


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the file and the task."""


@dataclasses.dataclass(frozen=True)
class Script:
    """A script and the interpreter that runs it (LifelongAgentBench's ``CommandItem``)."""

    script: str
    interpreter: str = "bash"

    def __post_init__(self) -> None:
        if self.interpreter not in INTERPRETERS:
            raise TaskFileError(f"interpreter {self.interpreter!r} is not one of {', '.join(INTERPRETERS)}")


@dataclasses.dataclass(frozen=True)
class OSTask:
    task_id: str
    instruction: str
    init: Script
    evaluation: Script
    solution: Script
    category: str = "os"
    skills: tuple[str, ...] = ()
    short: bool = False
    source: str = "halo"  # halo | lifelongagentbench
    difficulty: int = 0  # LifelongAgentBench's difficulty level (its own samples are all 0)
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # drawn per task seed
    task_seed: int | None = None  # set on an instance: the seed its parameters were drawn from
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # an instance's drawn parameters

    def instance(self, task_seed: int) -> "OSTask":
        """The task of one seed: parameters drawn, placeholders filled (the same task where it has no parameters)."""
        if self.task_seed is not None:
            raise ValueError(f"{self.task_id} is already the instance of task seed {self.task_seed}")
        values = draw(self.params, self.task_id, int(task_seed))
        fill = (lambda text: render(text, values)) if self.params else (lambda text: text)
        return dataclasses.replace(
            self, instruction=fill(self.instruction), task_seed=int(task_seed), values=values,
            init=Script(fill(self.init.script), self.init.interpreter),
            evaluation=Script(fill(self.evaluation.script), self.evaluation.interpreter),
            solution=Script(fill(self.solution.script), self.solution.interpreter),
        )

    def to_spec(self, task_seed: int = 0) -> TaskSpec:
        """The task as a ``TaskSpec``: the templates in ``extra``, the goal of ``task_seed``'s instance."""
        if self.task_seed is not None:
            raise ValueError(f"{self.task_id}: make the spec from the task, not from an instance")
        return TaskSpec(
            task_id=self.task_id,
            env=ENV_NAME,
            site=self.category,
            goal=self.instance(task_seed).instruction,
            extra={
                "instruction": self.instruction,
                "params": dict(self.params),
                "init": dataclasses.asdict(self.init),
                "evaluation": dataclasses.asdict(self.evaluation),
                "solution": dataclasses.asdict(self.solution),
                "skills": list(self.skills),
                "difficulty": self.difficulty,
                "short": self.short,
                "source": self.source,
            },
        )

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> "OSTask":
        extra = spec.extra or {}
        missing = [k for k in ("init", "evaluation") if k not in extra]
        if missing:
            raise TaskFileError(f"task {spec.task_id} carries no {' or '.join(missing)} script: it is not an os task")
        return cls(
            task_id=spec.task_id,
            instruction=str(extra.get("instruction") or spec.goal or ""),
            params=check_params(extra.get("params")),
            init=Script(**extra["init"]),
            evaluation=Script(**extra["evaluation"]),
            solution=Script(**extra.get("solution") or {"script": ""}),
            category=spec.site,
            skills=tuple(extra.get("skills") or ()),
            short=bool(extra.get("short")),
            source=str(extra.get("source") or "halo"),
            difficulty=int(extra.get("difficulty") or 0),
        )


def _halo_task(raw: Any, path: Path) -> OSTask:
    if not isinstance(raw, dict) or not raw.get("id"):
        raise TaskFileError(f"{path}: every task needs an id, got {str(raw)[:80]!r}")
    name = str(raw["id"])
    unknown = set(raw) - {"id", "category", "params", "instruction", "init", "evaluation", "solution", "skills", "short", "difficulty"}
    if unknown:
        raise TaskFileError(f"{path}: task {name} has unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("instruction", "evaluation", "solution"):
        if not str(raw.get(key) or "").strip():
            raise TaskFileError(f"{path}: task {name} needs a non-empty {key}")
    category = str(raw.get("category") or "os")
    try:
        params = check_params(raw.get("params"))
    except TemplateError as e:
        raise TaskFileError(f"{path}: task {name}: {e}") from None
    task = OSTask(
        task_id=TASK_PREFIX + name,
        params=params,
        instruction=str(raw["instruction"]).strip(),
        init=Script(str(raw.get("init") or "true")),
        evaluation=Script(str(raw["evaluation"])),
        solution=Script(str(raw["solution"])),
        category=category,
        skills=tuple(str(s) for s in raw.get("skills") or ()),
        short=bool(raw.get("short", False)),
        difficulty=_difficulty(raw.get("difficulty", 0), path, name),
    )
    try:
        task.instance(0)  # every placeholder names a parameter and fills to text
    except TemplateError as e:
        raise TaskFileError(f"{path}: task {name}: {e}") from None
    return task


def _difficulty(value: Any, path: Path, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TaskFileError(f"{path}: task {name} has difficulty {value!r}: write a level 0, 1, 2, ...")
    return value


def _command_item(raw: Any, where: str) -> Script:
    if not isinstance(raw, dict) or "script" not in raw:
        raise TaskFileError(f"{where} must be an object with command_name and script")
    name = str(raw.get("command_name") or "bash")
    if name not in INTERPRETERS:
        raise TaskFileError(f"{where}: command_name {name!r} is not supported (bash or python)")
    return Script(str(raw["script"]), name)


def _lab_task(key: str, raw: Any, path: Path) -> OSTask:
    where = f"{path}: sample {key}"
    if not isinstance(raw, dict):
        raise TaskFileError(f"{where} is not an object")
    for field in ("instruction", "initialization_command_item", "evaluation_info"):
        if field not in raw:
            raise TaskFileError(f"{where} has no {field} (not LifelongAgentBench os_interaction data?)")
    info = raw["evaluation_info"]
    if not isinstance(info, dict):
        raise TaskFileError(f"{where}: evaluation_info must be an object")
    skills = tuple(str(s) for s in raw.get("skill_list") or ())
    return OSTask(
        task_id=f"{TASK_PREFIX}lab-{key}",
        instruction=str(raw["instruction"]).strip(),
        init=_command_item(raw["initialization_command_item"], f"{where} initialization_command_item"),
        evaluation=_command_item(info.get("evaluation_command_item"), f"{where} evaluation_command_item"),
        solution=_command_item(info.get("ground_truth_command_item"), f"{where} ground_truth_command_item"),
        category="lab",
        skills=skills,
        source="lifelongagentbench",
    )


def load_tasks(path: str | Path | None = None) -> list[OSTask]:
    """Tasks from a HALO YAML/JSON task file or a LifelongAgentBench os_interaction JSON (HALO's own set by default)."""
    path = Path(path) if path else BUILTIN_TASKS
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(f"task file {path} does not exist") from None
    import yaml

    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise TaskFileError(f"task file {path} cannot be parsed: {str(e).splitlines()[0]}") from None
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        tasks = [_halo_task(raw, path) for raw in data["tasks"]]
    elif isinstance(data, dict) and data:
        tasks = [_lab_task(str(key), raw, path) for key, raw in data.items()]
    else:
        raise TaskFileError(f"task file {path} holds neither HALO tasks (tasks: [...]) nor LifelongAgentBench samples")
    _check_unique(tasks, path)
    return tasks


def _check_unique(tasks: Iterable[OSTask], path: Path) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise TaskFileError(f"{path}: task id {task.task_id} appears twice")
        seen.add(task.task_id)
