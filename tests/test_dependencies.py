"""HALO's dependency rules, read from the source: the lake imports no agent, trainer or screen; the agent
imports no trainer or screen; the screen imports no trainer and no torch. (A trainer may drive the agent.)"""

from __future__ import annotations

import ast
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
