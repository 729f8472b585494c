"""Benchmarks as data: each benchmark's table, made from its committed results files.

A benchmark NAME keeps its raw results in ``bench/results/NAME/`` (one JSON file per run, written by
:func:`save`), and ``bench/reports/NAME.py`` (``-`` spelled ``_``) exposes ``report(results_dir) -> str``,
the Markdown table of those results, each row with the command that produced it.

    .venv/bin/python -m bench report              # every table
    .venv/bin/python -m bench report os           # one
    .venv/bin/python -m bench report --write      # rewrite the generated blocks of docs/benchmarks.md
    .venv/bin/python -m bench report --check      # exit 1 if docs/benchmarks.md differs from them

In docs/benchmarks.md a table sits between ``<!-- report: NAME -->`` and ``<!-- /report: NAME -->``.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- report: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /report: (?P=name) -->)", re.S)


class ReportError(Exception):
    """A report that cannot be made or written; the message says what to do."""


def names() -> list[str]:
    """Every benchmark with a report module, by its command name."""
    here = Path(__file__).resolve().parent
    return sorted(p.stem.replace("_", "-") for p in here.glob("*.py") if not p.stem.startswith("_"))


def report(name: str) -> str:
    """The Markdown table of benchmark NAME, from ``bench/results/NAME/``."""
    if name not in names():
        raise ReportError(f"no report named {name!r}; one of: {', '.join(names())}")
    folder = RESULTS / name
    if not any(folder.glob("*.json")) and not any(folder.glob("*.parquet")):
        return f"No committed results yet (`{folder.relative_to(ROOT)}/`).\n"
    module = importlib.import_module(f"bench.reports.{name.replace('-', '_')}")
    return module.report(folder).rstrip("\n") + "\n"


def blocks(text: str) -> dict[str, str]:
    """NAME -> the generated text between its markers in ``text``."""
    return {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}


def rewrite(text: str, tables: dict[str, str]) -> str:
    """``text`` with each block's body replaced by its table; every table needs its block."""
    missing = sorted(set(tables) - set(blocks(text)))
    if missing:
        raise ReportError(f"docs/benchmarks.md has no block for {', '.join(missing)}: add "
                          f"'<!-- report: NAME -->' and '<!-- /report: NAME -->' lines where the table goes")
    return BLOCK.sub(lambda m: m.group(1) + tables.get(m.group("name"), m.group("body")) + m.group(4), text)


def load_runs(folder: Path) -> list[dict]:
    """Every JSON results file of a benchmark, oldest first (file names start with the time)."""
    return [json.loads(p.read_text()) | {"file": p.name} for p in sorted(folder.glob("*.json"))]


def head_commit() -> str:
    """The checkout's commit, with ``+dirty`` where tracked files differ from it (what a benchmark measured)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def save(name: str, result: dict, argv: list[str] | None) -> Path:
    """Writes one run's result to ``bench/results/NAME/<time>.json``, with the command that made it (the
    benchmark's own options ``argv``), the machine and the commit (the run's ``commit`` where it recorded the one
    it started at, else the checkout's now)."""
    argv = list(argv or [])
    result = dict(result)
    commit = result.pop("commit", None) or head_commit()
    folder = RESULTS / name
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = {
        "benchmark": name,
        "command": shlex.join([".venv/bin/python", "-m", "bench", name, *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()) + " UTC",
        "machine": {"cores": os.cpu_count(), "load_average": [round(x, 1) for x in os.getloadavg()],
                    "python": platform.python_version(), "platform": platform.platform(terse=True)},
        "commit": commit,
    }
    clash = sorted(set(record) & set(result))
    if clash:
        raise ValueError(f"a result may not use the keys save() writes: {', '.join(clash)}")
    record |= result
    out = folder / f"{stamp}.json"
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; numbers right-aligned."""
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    numeric = [all(isinstance(r[i], (int, float)) for r in rows) if rows else False for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---:" if n else "---" for n in numeric) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def provenance(run: dict) -> str:
    """One line under a table: when, where, and the results file."""
    m = run.get("machine", {})
    load = m.get("load_average")
    commit = run.get("commit")
    return (f"{run.get('date', '?')}, {m.get('cores', '?')} cores" + (f", load {load[0]}" if load else "")
            + (f", commit {commit[:10]}{'+dirty' if commit.endswith('+dirty') else ''}" if commit else "")
            + f"; `bench/results/{run['benchmark']}/{run['file']}`")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench report [NAME ...] [--write | --check]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench report",
                                 description="Print each benchmark's table, made from its committed results files.")
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks (default: all): {', '.join(names())}")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks of docs/benchmarks.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md's blocks differ from the tables")
    a = ap.parse_args(argv)
    try:
        tables = {name: report(name) for name in (a.names or names())}
        if a.write or a.check:
            text = DOCS_PAGE.read_text()
            new = rewrite(text, tables)
            if a.check:
                stale = sorted(n for n in tables if blocks(text).get(n) != tables[n])
                if stale:
                    print(f"Error: docs/benchmarks.md is out of date for {', '.join(stale)}: "
                          "run .venv/bin/python -m bench report --write", file=sys.stderr)
                    return 1
                return 0
            DOCS_PAGE.write_text(new)
            print(f"docs/benchmarks.md: {len(tables)} tables written")
            return 0
    except ReportError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print("\n".join(f"## {name}\n\n{body}" for name, body in tables.items()), end="")
    return 0
