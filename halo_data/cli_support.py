"""What HALO's three CLIs share: ``--lake``, ``-h``, ``--version``, and one way to fail.

Every command body is wrapped in ``run_cli``: an error a user can act on (a lake
error, a Delta or DuckDB error, a bad value, a missing file) becomes one
``Error: …`` line on stderr and exit code 1, never a traceback. The traceback
is still logged at DEBUG, for the CLIs that have ``-v``.

The lake rule for every command: commands that add data (``halo-data init`` and
``import``, ``halo-agent rollout`` and ``eval``, ``halo-train quickstart``)
create the lake when it is missing, as ``halo-data init`` would; the others
need an existing lake and say how to create one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn

import click
import duckdb
from deltalake.exceptions import DeltaError

from halo_data.lake import LakeError

log = logging.getLogger(__name__)

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

# Errors a user can act on. RuntimeError is here for the browser and torch (a Chromium that
# will not start, a GPU out of memory): their first line says what happened.
USER_ERRORS = (LakeError, DeltaError, duckdb.Error, ValueError, OSError, RuntimeError)


# libgomp's spin before a waiting thread sleeps. Its default (300,000) holds a core the thread being waited for needs
# wherever a job shares the cores (a chat server, rollout workers, their browsers): a LoRA step of SmolLM2 beside a
# chat-server-like process took 31 s at the default against 6.7 s at 2,000, and 3.4 s alone at both
# (`python -m bench omp-wait`, docs/benchmarks.md). OMP_WAIT_POLICY=PASSIVE (no spin) matches it shared, and costs
# 12% alone.
OPENMP_SPINCOUNT = "2000"
# Set beside GOMP_SPINCOUNT where HALO chose it, not the user: a server that waits passively gives it up.
HALO_SPIN_MARK = "HALO_GOMP_SPINCOUNT"


def short_openmp_spin() -> None:
    """Set ``GOMP_SPINCOUNT`` for this process and the ones it starts, unless OpenMP's wait is set already.

    libgomp reads it when torch loads, so a command calls this before anything imports torch."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = os.environ[HALO_SPIN_MARK] = OPENMP_SPINCOUNT


def passive_openmp() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` for this process unless the user set OpenMP's wait: the chat server's, whose
    decode steps wait passively best beside other work (docs/benchmarks.md). A ``GOMP_SPINCOUNT`` outranks the
    policy in libgomp, so HALO's own short spin, inherited from the command that started the server, gives way."""
    if os.environ.get(HALO_SPIN_MARK) and os.environ.get("GOMP_SPINCOUNT") == os.environ[HALO_SPIN_MARK]:
        del os.environ["GOMP_SPINCOUNT"]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def default_lake() -> str:
    return os.environ.get("HALO_LAKE", "lake")


def check_lake_path(path: str) -> str:
    """A local path that is a plain file cannot become a lake: say so before delta-rs does (in 33 lines)."""
    if Path(path.removeprefix("file://")).is_file():
        fail(f"{path} is a file, not a lake: a lake is a folder (`halo-data init PATH` creates one)")
    return path


LAKE_OPTION = click.option(
    "--lake",
    "lake_path",
    default=default_lake,
    show_default="lake/ or $HALO_LAKE",
    callback=lambda ctx, param, value: check_lake_path(value),
    help="Lake root: a folder or an object-store URI (commands that add data create it).",
)


def version_option() -> Callable:
    return click.version_option(package_name="halo", message="halo %(version)s")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def run_cli(func: Callable) -> Callable:
    """Turn the errors a user can act on into one ``Error: ...`` line and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:  # `halo-data ... | head`: the console entry ends quietly
            raise
        except USER_ERRORS as e:
            log.debug("%s failed", func.__name__, exc_info=True)
            fail(first_line(e))

    return wrapper


def key_values(pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (``--env-option``, ``--policy-option``) as a dict; a value parses as JSON where it can
    (numbers, true/false), else stays text. A pair without ``=`` raises ValueError."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"{pair!r}: write KEY=VALUE")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def script_command(script: str, *args: str) -> str:
    """A command line for HALO's console script ``script`` that runs as printed.

    The scripts sit beside the running interpreter (``.venv/bin``), which is often not on
    PATH: name them by their path, relative to the working folder when inside it. Where the
    script is not installed there, run its module with this interpreter.
    """
    bin_dir = Path(sys.executable).parent
    exe = bin_dir / script
    if exe.exists():
        head = [shlex.quote(_shortest(exe))]
    else:
        module = {"halo-data": "halo_data.cli", "halo-agent": "halo_agent.cli", "halo-train": "halo_train.cli"}[script]
        head = [shlex.quote(_shortest(Path(sys.executable))), "-m", module]
    return " ".join([*head, *map(_quote, args)])


def _quote(arg: str) -> str:
    """shlex.quote, but SQL with single quotes reads better in double quotes (when nothing in it expands there)."""
    if "'" in arg and not set(arg) & set('"$`\\!'):
        return f'"{arg}"'
    return shlex.quote(arg)


def _shortest(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (``.venv/bin/halo-data``), else absolute."""
    path = path.absolute()
    try:
        relative = str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
    return relative if os.sep in relative else f".{os.sep}{relative}"
