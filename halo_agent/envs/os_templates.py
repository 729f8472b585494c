"""Seeded os task instances: a task's ``params`` are drawn from the task seed and fill its ``{{...}}`` placeholders.

    params:
      user: {choice: [alice, bob, carol]}        # one item (items may be mappings: {{perm.mode}})
      uid: {int: [1200, 4999]}                   # an integer, both ends included
      names: {sample: [3, [ada, lin, kim, joe]]} # k distinct items, in drawn order ({{names.0}})
      amounts: {ints: [4, 2, 40]}                # k distinct integers from lo..hi
    instruction: Create a user named {{user}} with the user id {{uid}}.
    evaluation: test "$(id -u {{user}})" = {{uid}}

A placeholder is a parameter, dotted into a mapping or list, then filters left to right:
``sum``, ``len``, ``sorted``, ``unique`` (first occurrences, in order), ``upper``, ``nl`` (joined
with the two characters ``\\n``, for ``printf``), ``words`` (joined with spaces). The draw depends on
the task id and the seed only (``random.Random`` seeded with the SHA-256 of ``"<task id>/<seed>"``), so a seed names one instance
everywhere: a rollout worker, the task server, ``halo-agent tasks --task-seed N``.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Callable, Mapping

KINDS = ("choice", "int", "sample", "ints")
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_]\w*(?:\.\w+)*)((?:\s*\|\s*\w+)*)\s*\}\}")
FILTERS: dict[str, Callable[[Any], Any]] = {
    "sum": sum,
    "len": len,
    "sorted": sorted,
    "unique": lambda items: list(dict.fromkeys(items)),
    "upper": lambda text: str(text).upper(),
    "nl": lambda items: "\\n".join(str(i) for i in items),
    "words": lambda items: " ".join(str(i) for i in items),
}


class TemplateError(ValueError):
    """A parameter or placeholder that cannot be drawn or filled; the message says which."""


def check_params(params: Any) -> dict[str, dict[str, Any]]:
    """The ``params`` mapping of a task file, checked: each a one-key mapping of a known kind."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TemplateError(f"params must be a mapping of name: {{kind: ...}}, got {type(params).__name__}")
    checked = {}
    for name, spec in params.items():
        if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in KINDS:
            raise TemplateError(f"parameter {name}: write one of {', '.join(f'{{{k}: ...}}' for k in KINDS)}, got {spec!r}")
        kind, arg = next(iter(spec.items()))
        if not isinstance(arg, list) or not _SHAPE_OK[kind](arg):
            raise TemplateError(f"parameter {name}: {kind} takes {_SHAPES[kind]}, got {arg!r}")
        checked[str(name)] = {kind: arg}
    return checked


def _ints(values: list, n: int) -> bool:
    return len(values) == n and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


_SHAPE_OK: dict[str, Callable[[list], bool]] = {
    "choice": lambda arg: len(arg) > 0,
    "int": lambda arg: _ints(arg, 2) and arg[0] <= arg[1],
    "sample": lambda arg: len(arg) == 2 and isinstance(arg[1], list) and _ints(arg[:1], 1) and 0 < arg[0] <= len(arg[1]),
    "ints": lambda arg: _ints(arg, 3) and 0 < arg[0] <= arg[2] - arg[1] + 1,
}
_SHAPES = {"choice": "a non-empty list", "int": "[lo, hi]", "sample": "[k, [items...]] with k <= len(items)",
           "ints": "[k, lo, hi] with k <= hi - lo + 1"}


def draw(params: Mapping[str, Mapping[str, Any]], task_id: str, seed: int) -> dict[str, Any]:
    """The values of one instance: every parameter drawn, in order, from the task id and seed."""
    rng = random.Random(hashlib.sha256(f"{task_id}/{seed}".encode()).digest())
    values: dict[str, Any] = {}
    for name, spec in params.items():
        kind, arg = next(iter(spec.items()))
        if kind == "choice":
            values[name] = rng.choice(arg)
        elif kind == "int":
            values[name] = rng.randint(arg[0], arg[1])
        elif kind == "sample":
            values[name] = rng.sample(arg[1], arg[0])
        else:
            values[name] = rng.sample(range(arg[1], arg[2] + 1), arg[0])
    return values


def render(text: str, values: Mapping[str, Any]) -> str:
    """``text`` with every ``{{...}}`` filled from ``values``; ``TemplateError`` names what is missing."""

    def fill(match: re.Match) -> str:
        path, filters = match.group(1).split("."), [f.strip() for f in match.group(2).split("|") if f.strip()]
        if path[0] not in values:
            raise TemplateError(f"{{{{{match.group(1)}}}}}: no parameter {path[0]!r} (parameters: {', '.join(values) or 'none'})")
        value = values[path[0]]
        for part in path[1:]:
            try:
                value = value[int(part)] if isinstance(value, list) else value[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise TemplateError(f"{{{{{match.group(1)}}}}}: {path[0]} has no {part!r}") from None
        for name in filters:
            if name not in FILTERS:
                raise TemplateError(f"{{{{...|{name}}}}}: unknown filter; filters are {', '.join(FILTERS)}")
            value = FILTERS[name](value)
        if isinstance(value, (list, dict)):
            raise TemplateError(f"{{{{{match.group(0)[2:-2].strip()}}}}} is a {type(value).__name__}: join it (| nl, | words) or index it")
        return str(value)

    return PLACEHOLDER.sub(fill, text)
