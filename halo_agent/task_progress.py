"""Task-aware progress: the share of what a task's evaluation expects that the site's state already satisfies.

A REAL task is scored at the end by its site's ``/finish`` state difference. HALO keeps, per
task, a list of *expectations*: checks that decompose what the task's evaluation expects,
including the intermediate states a solution passes through. Each check has the fields of one
of agisdk's JMESPath evals and is evaluated the way agisdk evaluates one: the query on the
parsed ``/finish`` JSON, compared with ``expected_value`` by equality; a query that fails is not
satisfied. ``RealEnv`` reads ``/finish`` after every action of an episode whose task has
expectations; ``halo_agent.rewards`` turns the share into the ``task_progress`` component.

Where they come from, per task (``expectations_for``):

- ``halo_agent/sites/expectations/<site>.yaml`` (every ``*.yaml`` there is read), one entry per
  task id as HALO's registry names it::

      v2.gomail-18:
        - {description: "an email to Brian King was sent", query: "...", expected_value: true}

- otherwise a task whose evals are all JMESPath (HALO's ``halo-local`` tasks): its evals are
  its expectations;
- otherwise none: the component is NULL and nothing is polled.

Check a file (one error line and exit status 1 when it is malformed), and optionally score a
saved ``/finish`` JSON with it::

    python -m halo_agent.task_progress check [FILE.yaml ...] [--task v2.gomail-18 --state finish.json]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

EXPECTATIONS_DIR = Path(__file__).resolve().parent / "sites" / "expectations"
# Another folder of <site>.yaml files (``os.pathsep``-separated folders), read after HALO's own.
EXPECTATIONS_DIRS_ENV = "HALO_EXPECTATIONS_DIRS"
_CHECK_FIELDS = ("description", "query", "expected_value")


class ExpectationsError(ValueError):
    """An expectations file is malformed; the message is one line naming the file and the entry."""


@dataclasses.dataclass(frozen=True)
class Check:
    description: str
    query: str
    expected_value: Any
    _parsed: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def make(cls, description: str, query: str, expected_value: Any) -> "Check":
        import jmespath

        return cls(description, query, expected_value, jmespath.compile(query))

    def holds(self, state: Any) -> bool:
        """agisdk's JMESPath eval: ``jmespath.search(query, state) == expected_value``; an error is not satisfied."""
        try:
            actual = self._parsed.search(state)
        except Exception:  # jmespath raises on type errors in functions (length(null), contains(null, ..))
            return False
        return bool(actual == self.expected_value)


@dataclasses.dataclass(frozen=True)
class Expectations:
    task_id: str
    checks: tuple[Check, ...]
    source: str  # the file it came from, or "task evals"

    def satisfied(self, state: Any) -> list[bool]:
        return [c.holds(state) for c in self.checks]

    def share(self, state: Any) -> float:
        """The share of checks ``state`` (the parsed ``/finish`` JSON) satisfies, 0..1."""
        flags = self.satisfied(state)
        return sum(flags) / len(flags) if flags else 0.0


def _check(where: str, index: int, raw: Any) -> Check:
    at = f"{where}[{index}]"
    if not isinstance(raw, Mapping):
        raise ExpectationsError(f"{at}: a check must be a mapping with {', '.join(_CHECK_FIELDS)}, got {type(raw).__name__}")
    unknown = sorted(set(map(str, raw)) - set(_CHECK_FIELDS))
    if unknown:
        raise ExpectationsError(f"{at}: unknown field(s) {', '.join(unknown)}; a check has {', '.join(_CHECK_FIELDS)}")
    missing = [f for f in _CHECK_FIELDS if f not in raw]
    if missing:
        raise ExpectationsError(f"{at}: missing {', '.join(missing)}")
    description, query = raw["description"], raw["query"]
    if not isinstance(description, str) or not description.strip():
        raise ExpectationsError(f"{at}: description must be a non-empty string")
    if not isinstance(query, str) or not query.strip():
        raise ExpectationsError(f"{at} ({description}): query must be a non-empty JMESPath string")
    try:
        return Check.make(description, query, raw["expected_value"])
    except Exception as e:  # jmespath's ParseError/LexerError carry a multi-line message with a caret
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExpectationsError(f"{at} ({description}): bad JMESPath query {query!r}: {first}") from None


def parse(data: Any, source: str) -> dict[str, Expectations]:
    """Task id -> expectations from the parsed content of one ``<site>.yaml``."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ExpectationsError(f"{source}: must map task ids to lists of checks, got {type(data).__name__}")
    out: dict[str, Expectations] = {}
    for task_id, checks in data.items():
        if not isinstance(task_id, str) or "." not in task_id:
            raise ExpectationsError(f"{source}: task id {task_id!r} must be VERSION.NAME as HALO's registry names it, e.g. v2.gomail-1")
        where = f"{source}: {task_id}"
        if not isinstance(checks, list) or not checks:
            raise ExpectationsError(f"{where}: must be a non-empty list of checks")
        out[task_id] = Expectations(task_id, tuple(_check(where, i, c) for i, c in enumerate(checks)), source)
    return out


def load_file(path: str | os.PathLike[str]) -> dict[str, Expectations]:
    """Task id -> expectations of one file; ``ExpectationsError`` (one line) when it is malformed."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ExpectationsError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ExpectationsError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse(data, str(path))


def expectation_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(EXPECTATIONS_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    return [EXPECTATIONS_DIR, *extra]


def _files(dirs: Iterable[Path]) -> tuple[tuple[str, int], ...]:
    files = []
    for d in dirs:
        if d.is_dir():
            files += sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return tuple((str(p), p.stat().st_mtime_ns) for p in files)


@functools.lru_cache(maxsize=8)
def _load_files(files: tuple[tuple[str, int], ...]) -> dict[str, Expectations]:
    table: dict[str, Expectations] = {}
    for path, _mtime in files:
        for task_id, exp in load_file(path).items():
            if task_id in table:
                raise ExpectationsError(f"{path}: {task_id} is also in {table[task_id].source}; give each task one entry")
            table[task_id] = exp
    return table


def load_all(dirs: Sequence[str | os.PathLike[str]] | None = None) -> dict[str, Expectations]:
    """Every ``<site>.yaml`` in the expectations folders, task id -> expectations (re-read when a file changes)."""
    folders = [Path(d) for d in dirs] if dirs is not None else expectation_dirs()
    return _load_files(_files(folders))


def from_evals(task_id: str, evals: Sequence[Mapping[str, Any]]) -> Expectations | None:
    """A task's own evals as expectations, when every one of them is a JMESPath eval."""
    if not evals or any((e.get("type") or "") != "jmespath" or not e.get("query") for e in evals):
        return None
    checks = []
    for i, e in enumerate(evals):
        try:
            checks.append(Check.make(str(e.get("description") or f"eval {i + 1}"), str(e["query"]), e.get("expected_value")))
        except Exception:  # a query agisdk itself would fail on: such a task is left unmeasured
            return None
    return Expectations(task_id, tuple(checks), "task evals")


def expectations_for(task: Any, dirs: Sequence[str | os.PathLike[str]] | None = None) -> Expectations | None:
    """The expectations of ``task`` (a ``TaskSpec``): its ``<site>.yaml`` entry, else its own JMESPath evals, else None."""
    table = load_all(dirs)
    found = table.get(task.task_id)
    if found is not None:
        return found
    return from_evals(task.task_id, (task.extra or {}).get("evals") or ())


# ----------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m halo_agent.task_progress", description="Check expectations files.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="load expectations files (default: every one HALO reads) and report them")
    check.add_argument("files", nargs="*", help="<site>.yaml files (default: the expectations folders)")
    check.add_argument("--task", help="with --state: score this task's expectations on a saved /finish JSON")
    check.add_argument("--state", help="a /finish JSON file")
    args = parser.parse_args(argv)
    try:
        if args.files:
            table: dict[str, Expectations] = {}
            for f in args.files:
                table.update(load_file(f))
        else:
            table = load_all()
        if args.task or args.state:
            if not (args.task and args.state):
                raise ExpectationsError("--task and --state go together")
            if args.task not in table:
                raise ExpectationsError(f"no expectations for {args.task}")
            state = json.loads(Path(args.state).read_text())
            exp = table[args.task]
            for ok, c in zip(exp.satisfied(state), exp.checks):
                print(f"{'yes' if ok else 'no ':3}  {c.description}")
            print(f"share {exp.share(state):.3f}")
        else:
            n_checks = sum(len(e.checks) for e in table.values())
            print(f"ok: {len(table)} tasks, {n_checks} checks")
    except (ExpectationsError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
