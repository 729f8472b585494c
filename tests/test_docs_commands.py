"""The commands the docs show run as printed.

Every command line in a ```bash block of README.md, bench/README.md and the docs site (docs/, not the dated notes
under docs/notes/) is checked in one of two ways:

- **run**: the `halo-data` commands that read a lake (queries, `views`, `describe`, `stats`,
  `validate`) run for real, in-process, against a small synthetic lake at `lake/` in a temporary
  folder, and must exit 0;
- **parsed**: every other HALO command (`halo-agent`, `halo-train`, `python -m halo_agent...`,
  `python -m bench ...`) is parsed by its own click or argparse parser exactly as printed (the
  command, its options, their types and choices), and stopped before it starts work: rollouts,
  training runs and servers take minutes and need ports, models or a GPU host.

Commands of other programs (`vllm`, `ray`, `accelerate`, `pip`, `export`, `bash .ci/setup`) are left to
their authors, and `python -m pytest` is this suite.
"""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
CLICK_SCRIPTS = {"halo-data": "halo_data.cli", "halo-agent": "halo_agent.cli", "halo-train": "halo_train.cli"}
RUN_SUBCOMMANDS = {"query", "views", "describe", "stats", "validate"}
# Other programs, and the test suite itself (`python -m pytest`, which this test is part of).
OTHER_PROGRAMS = {"vllm", "ray", "accelerate", "pip", "export", "bash", "cd", "mkdocs", "python -m pytest"}


@dataclass(frozen=True)
class DocCommand:
    page: str
    line: str
    argv: tuple[str, ...]


def doc_pages() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", ROOT / "bench" / "README.md"] + sorted(p for p in docs.rglob("*.md") if "notes" not in p.relative_to(docs).parts)


def bash_lines(text: str) -> list[str]:
    """Each command of the ```bash blocks, continuation lines joined."""
    out, block, current = [], False, ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            block = stripped.startswith("```bash") and not block
            continue
        if not block:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(current.strip())
        current = ""
    return out


def argv_of(line: str) -> tuple[str, ...]:
    """The words of one command: comments, `VAR=value` prefixes and a trailing `&` dropped."""
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)
    if words and words[-1] == "&":
        words.pop()
    return tuple(words)


def doc_commands() -> list[DocCommand]:
    found = []
    for page in doc_pages():
        for line in bash_lines(page.read_text()):
            # `a && b` documents two commands; the set-up lines (`bash .ci/setup && ...`) among them.
            for part in line.split(" && "):
                argv = argv_of(part)
                if argv:
                    found.append(DocCommand(str(page.relative_to(ROOT)), part, argv))
    return found


def program(argv: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """("halo-data", args), ("python -m MODULE", args), or (the other program's name, args)."""
    name = argv[0].rsplit("/", 1)[-1]
    if name in CLICK_SCRIPTS:
        return name, argv[1:]
    if name.startswith("python") and argv[1:2] == ("-m",):
        return f"python -m {argv[2]}", argv[3:]
    return name, argv[1:]


class Parsed(Exception):
    """Raised where a command would start its work: its arguments parsed."""


def parse_click(script: str, args: tuple[str, ...], monkeypatch) -> None:
    group = importlib.import_module(CLICK_SCRIPTS[script]).main
    original = click.Command.invoke

    def invoke(self, ctx):
        if isinstance(self, click.Group):
            return original(self, ctx)
        raise Parsed(self.name)

    monkeypatch.setattr(click.Command, "invoke", invoke)
    with pytest.raises(Parsed):
        group.main(list(args), prog_name=script, standalone_mode=False)


def parse_module(module: str, args: tuple[str, ...], monkeypatch) -> None:
    """Runs ``python -m module args`` as Python would, up to its argparse parser's answer."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, argv=None, namespace=None):
        original(self, argv, namespace)
        raise Parsed(self.prog)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(Parsed):
        runpy.run_module(module, run_name="__main__", alter_sys=False)


COMMANDS = doc_commands()


def test_the_docs_show_commands():
    programs = {program(c.argv)[0] for c in COMMANDS}
    assert {"halo-data", "halo-agent", "halo-train", "python -m bench"} <= programs
    unknown = sorted(p for p in programs if p not in CLICK_SCRIPTS and p not in OTHER_PROGRAMS
                     and not p.startswith(("python -m halo_agent", "python -m halo_data", "python -m halo_train",
                                           "python -m bench", "python -m dashboards")))
    assert unknown == [], f"commands of programs this test does not know: {unknown}"


def runs_for_real(command: DocCommand) -> bool:
    name, args = program(command.argv)
    if name != "halo-data":
        return False
    first = next((a for a in args if not a.startswith("-")), None)
    sub = first if first in importlib.import_module("halo_data.cli").main.commands else "query"
    return sub in RUN_SUBCOMMANDS


@pytest.fixture(scope="module")
def synthetic_lake_dir(tmp_path_factory):
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake

    folder = tmp_path_factory.mktemp("docs-lake")
    build_synthetic_lake(str(folder / "lake"), SyntheticSpec(n_steps=200, attempts_per_task=4, min_steps=5,
                                                             max_steps=10, screenshot_size=(16, 8), seed=1))
    return folder


@pytest.mark.parametrize("command", [c for c in COMMANDS if runs_for_real(c)], ids=lambda c: f"{c.page}: {c.line}")
def test_lake_command_runs_as_printed(command, synthetic_lake_dir, monkeypatch):
    from halo_data.cli import main

    monkeypatch.chdir(synthetic_lake_dir)
    monkeypatch.delenv("HALO_LAKE", raising=False)
    result = CliRunner().invoke(main, list(command.argv[1:]), prog_name="halo-data")
    assert result.exit_code == 0, (command.line, result.output)


@pytest.mark.parametrize("command", [c for c in COMMANDS if not runs_for_real(c)
                                     and program(c.argv)[0] not in OTHER_PROGRAMS],
                         ids=lambda c: f"{c.page}: {c.line}")
def test_command_parses_as_printed(command, monkeypatch):
    name, args = program(command.argv)
    if name in CLICK_SCRIPTS:
        parse_click(name, args, monkeypatch)
    else:
        parse_module(name.removeprefix("python -m "), args, monkeypatch)
