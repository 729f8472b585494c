"""The helpers all three CLIs share: one error line for every error a user can act on, and follow-up
commands printed so that they run as printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from deltalake.exceptions import TableNotFoundError

from halo_data.cli_support import run_cli, script_command
from halo_data.lake import LakeError


def raising(error: BaseException) -> click.Command:
    @click.command()
    @run_cli
    def command() -> None:
        raise error

    return command


@pytest.mark.parametrize("error, line", [
    (LakeError("no HALO lake at x: create one"), "Error: no HALO lake at x: create one\n"),
    (TableNotFoundError("Could not create local directory: /f/runs\nError: Os { code: 20 }"),
     "Error: Could not create local directory: /f/runs\n"),
    (ValueError(""), "Error: ValueError\n"),
    (FileNotFoundError(2, "No such file or directory", "x.yaml"),
     "Error: [Errno 2] No such file or directory: 'x.yaml'\n"),
])
def test_user_errors_are_one_line_and_exit_code_1(error, line):
    result = CliRunner().invoke(raising(error))
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", line)


def test_a_bug_is_not_hidden():
    result = CliRunner().invoke(raising(KeyError("x")))
    assert isinstance(result.exception, KeyError)


def test_script_command_names_the_script_beside_the_interpreter(tmp_path, monkeypatch):
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "halo-data").touch()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    assert script_command("halo-data", "select 1", "--lake", "my lake") == (
        ".venv/bin/halo-data 'select 1' --lake 'my lake'")
    assert script_command("halo-data", "select * from runs where run_id = 'r1'") == (
        ".venv/bin/halo-data \"select * from runs where run_id = 'r1'\"")
    monkeypatch.chdir(bin_dir)
    assert script_command("halo-data", "views") == "./halo-data views"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert script_command("halo-data", "views") == f"{bin_dir}/halo-data views"
    # not installed as a script there: the module, with this interpreter
    assert script_command("halo-agent", "tasks") == f"{bin_dir}/python -m halo_agent.cli tasks"


def test_script_commands_run_as_printed(tmp_path):
    from halo_data.lake import Lake

    Lake.init(tmp_path / "lake")
    for script in ("halo-data", "halo-agent", "halo-train"):
        line = script_command(script, "--version")
        done = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=Path.cwd(), timeout=120)
        assert (done.returncode, done.stdout) == (0, "halo 0.1.0\n"), (line, done.stderr)
    sql = "select count(*) as n from steps where run_id <> 'x'"
    line = script_command("halo-data", sql, "--lake", str(tmp_path / "lake"))
    done = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, '[\n {"n": 0}\n]\n'), done.stderr


@pytest.mark.parametrize("module", ["halo_data.cli", "halo_agent.cli", "halo_train.cli"])
def test_every_cli_takes_h_and_version(module):
    import importlib

    main = importlib.import_module(module).main
    result = CliRunner().invoke(main, ["-h"])
    assert result.exit_code == 0 and result.stdout.startswith("Usage: "), result.output
    assert CliRunner().invoke(main, ["--version"]).stdout == "halo 0.1.0\n"


# A command added to a CLI's group in a fresh process: what OpenMP's settings are when its body runs, and torch unloaded.
PROBE = """
import os, sys
from {module} import {group} as main
@main.command("probe")
def probe():
    print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("HALO_GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"),
          "torch" in sys.modules)
main(["probe"])
"""


@pytest.mark.parametrize("given, seen", [
    ({}, "None PASSIVE"),
    ({"GOMP_SPINCOUNT": "2000", "HALO_GOMP_SPINCOUNT": "2000"}, "None PASSIVE"),  # HALO's short spin, inherited: gone
    ({"GOMP_SPINCOUNT": "2000"}, "2000 PASSIVE"),  # the user's spin stands (libgomp lets it outrank the policy)
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"),
])
def test_the_chat_server_waits_passively_unless_the_user_set_openmp_wait(given, seen):
    """It calls ``passive_openmp`` before torch loads; a GOMP_SPINCOUNT HALO set for the command that started the
    server would outrank PASSIVE, so it gives way."""
    probe = ("import os; from halo_data.cli_support import passive_openmp; passive_openmp(); "
             "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HALO_GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", probe], env=env | given, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, seen), done.stderr[-2000:]


@pytest.mark.parametrize("module, group", [("halo_agent.cli", "main"), ("halo_train.cli", "main"),
                                           ("halo_train.experiment.cli", "experiment")])
@pytest.mark.parametrize("given, seen", [
    ({}, "2000 2000 None False"),  # a short spin, set before torch loads (libgomp reads it then), marked as HALO's
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "None None ACTIVE False"),  # the user's OpenMP settings stand
    ({"GOMP_SPINCOUNT": "300000"}, "300000 None None False"),
])
def test_commands_that_run_torch_set_a_short_openmp_spin_unless_openmp_wait_is_set(module, group, given, seen):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HALO_GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, group=group)], env=env | given,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip().splitlines()[-1]) == (0, seen), done.stderr[-2000:]
