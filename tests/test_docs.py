"""Docs that cannot drift: every CLI command and every view is documented, and the site builds.

The docs are README.md and the MkDocs site under docs/ (the generated CLI reference aside, which
documents everything by construction, and the dated notes, which are history). A command is
documented when they contain ``halo-data <command>`` (for a subcommand of a group: ``halo-agent
<group> <command>``); a view is documented when its name appears in them as code (``bc_rows`` in
backticks). ``mkdocs build --strict`` builds the site: a broken link, a page missing from the nav or
a CLI reference that fails to generate fails it. The benchmark tables of docs/benchmarks.md are
those their committed results files generate.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest

from halo_data.views import view_names

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def readme() -> str:
    """README.md and every page of the site but the generated CLI reference and the dated notes."""
    assert README.exists(), "README.md is missing"
    pages = [README] + sorted(p for p in DOCS.rglob("*.md") if p != DOCS / "cli.md" and DOCS / "notes" not in p.parents)
    return "\n".join(p.read_text() for p in pages)


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
    assert missing == [], f"README.md and docs/ do not document: {', '.join(missing)}"


def test_every_halo_data_command_is_there():
    from halo_data.cli import main

    assert set(main.commands) >= {"init", "query", "views", "describe", "export", "import", "stats", "compact",
                                  "vacuum", "validate", "quarantine", "dashboard"}


def test_every_view_is_documented():
    text = readme()
    missing = [v for v in view_names() if f"`{v}`" not in text]
    assert missing == [], f"README.md and docs/ do not document the views: {', '.join(missing)}"


def test_every_command_has_help():
    from halo_data.cli import main

    for name, command in main.commands.items():
        assert command.help and len(command.help.split()) >= 3, f"halo-data {name} needs a docstring"


def test_readme_is_a_short_map_that_starts_with_the_set_up():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("bash .ci/setup && .venv/bin/halo-train quickstart ")
    assert first_block[1].startswith("bash .ci/setup && .venv/bin/python -m pytest -q ")


def test_every_page_is_in_the_nav_and_the_site_builds_strict(tmp_path):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(config_file=str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    nav_pages = {page for page in _nav_files(config["nav"])}
    files = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav_pages == files, f"add to mkdocs.yml's nav: {sorted(files - nav_pages)}; missing: {sorted(nav_pages - files)}"
    build(config)
    assert (tmp_path / "site" / "cli" / "index.html").read_text().count("halo-train online-grpo") >= 1
    # the column reference is generated from the schema and the views themselves (docs/hooks.py)
    from halo_data.schema import TABLES

    lake_page = (tmp_path / "site" / "lake" / "index.html").read_text()
    assert [c.name for t in TABLES.values() for c in t.columns if f"<code>{c.name}</code>" not in lake_page] == []
    views_page = (tmp_path / "site" / "views" / "index.html").read_text()
    assert views_page.count("Columns: ") == len(view_names())


def _nav_files(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_files(value) if isinstance(value, list) else [value]
    return out


def test_the_benchmark_tables_are_the_ones_their_results_files_give():
    from bench import reports

    page = reports.DOCS_PAGE.read_text()
    in_docs = reports.blocks(page)
    assert set(in_docs) == set(reports.names()), "every report has one block on docs/benchmarks.md, and no other block"
    stale = [name for name in reports.names() if in_docs[name] != reports.report(name)]
    assert stale == [], f"docs/benchmarks.md is out of date for {stale}: run .venv/bin/python -m bench report --write"


def test_a_report_block_is_rewritten_from_its_table_and_a_missing_block_is_named():
    from bench import reports

    text = "a\n<!-- report: os -->\nold\n<!-- /report: os -->\nb\n"
    assert reports.rewrite(text, {"os": "| new |\n"}) == "a\n<!-- report: os -->\n| new |\n<!-- /report: os -->\nb\n"
    with pytest.raises(reports.ReportError, match="no block for ray"):
        reports.rewrite(text, {"ray": "| x |\n"})
