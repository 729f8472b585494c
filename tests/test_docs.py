"""Docs that cannot drift: every CLI command and every view is documented in README.md.

A command is documented when README.md contains ``halo-data <command>`` (for a
subcommand of a group: ``halo-agent <group> <command>``); a view is documented
when its name appears in README.md as code (``bc_rows`` in backticks).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest

from halo_data.views import view_names

README = Path(__file__).resolve().parent.parent / "README.md"


def readme() -> str:
    assert README.exists(), "README.md is missing"
    return README.read_text()


def command_paths(group: click.Group, prefix: str) -> list[str]:
    """``prefix cmd`` for every visible command, ``prefix group cmd`` for the commands of subgroups."""
    out = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        out.append(f"{prefix} {name}")
        if isinstance(command, click.Group):
            out += command_paths(command, f"{prefix} {name}")
    return out


def cli_group(module: str) -> click.Group:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} is not importable here ({e})")
    group = getattr(mod, "main", None)
    if not isinstance(group, click.Group):
        pytest.skip(f"{module} has no click group `main` yet")
    return group


@pytest.mark.parametrize("module, script", [
    ("halo_data.cli", "halo-data"),
    ("halo_agent.cli", "halo-agent"),
    ("halo_train.cli", "halo-train"),
])
def test_every_command_is_documented(module, script):
    group = cli_group(module)
    text = readme()
    commands = command_paths(group, script)
    assert commands, f"{script} has no commands"
    missing = [c for c in commands if c not in text]
    assert missing == [], f"README.md does not document: {', '.join(missing)}"


def test_every_halo_data_command_is_there():
    from halo_data.cli import main

    assert set(main.commands) >= {"init", "query", "views", "describe", "export", "import", "stats", "compact",
                                  "vacuum", "validate", "quarantine", "dashboard"}


def test_every_view_is_documented():
    text = readme()
    missing = [v for v in view_names() if f"`{v}`" not in text]
    assert missing == [], f"README.md does not document the views: {', '.join(missing)}"


def test_every_command_has_help():
    from halo_data.cli import main

    for name, command in main.commands.items():
        assert command.help and len(command.help.split()) >= 3, f"halo-data {name} needs a docstring"
