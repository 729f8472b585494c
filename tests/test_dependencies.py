"""HALO's dependency rules, read from the source: the lake imports no agent, trainer or screen; the agent
imports no trainer or screen; the screen imports no trainer and no torch. (A trainer may drive the agent.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = {
    "halo_data": {"halo_agent", "halo_train", "dashboards"},
    "halo_agent": {"halo_train", "dashboards"},
    "dashboards": {"halo_train", "torch", "transformers"},
}


def imported_packages(source: str) -> set[str]:
    """Top-level package of every import in ``source``, at any depth (inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def violations(package: str) -> list[str]:
    forbidden = RULES[package]
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in sorted(imported_packages(path.read_text()) & forbidden):
            found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_dependency_rules_hold(package):
    assert violations(package) == []


def test_the_check_sees_imports_anywhere_in_a_file():
    source = "import os\nfrom halo_train.config import X\ndef f():\n    import torch.nn as nn\n    from . import sib\n"
    assert imported_packages(source) == {"os", "halo_train", "torch"}


def module_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` and the package's modules it imports, at any depth (inside functions too), outside
    ``if TYPE_CHECKING:`` blocks. ``from pkg import sub`` names the module ``pkg.sub``, not the package's facade."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in sorted((ROOT / package).rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for n in ast.walk(block)}
        found = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module
                found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names}
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): modules that import each other in a circle."""
    index, low, stack, cycles = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.mark.parametrize("package", sorted(RULES) + ["halo_train"])
def test_modules_import_no_circle(package):
    """A module reads top to bottom: nothing it imports, however late, imports it back."""
    assert import_cycles(module_imports(package)) == []


def test_the_cycle_check_finds_a_circle_through_an_import_inside_a_function(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import f\n")
    (package / "a.py").write_text("from pkg.sub import b\ndef f():\n    return b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def g():\n    from ..a import f\n    return f\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = module_imports("pkg")
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"}, "pkg.c": set(), "pkg.sub": set(), "pkg.sub.b": {"pkg.a"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b"]]
