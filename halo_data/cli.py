"""``halo-data``: query and maintain a HALO lake. Thin over ``halo_data``'s library.

    halo-data "select task_id, count(*) from episodes group by 1"      # query is the default
    echo "select * from dpo_pairs limit 3" | halo-data query - --nl
    halo-data views
    halo-data export dpo_pairs out/dpo.jsonl --where "score_margin > 0.5"
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import click

from halo_data.cli_support import CONTEXT_SETTINGS, LAKE_OPTION, check_lake_path, fail, run_cli, version_option
from halo_data.config import PARAM_NAMES
from halo_data.lake import Lake, LakeError


class DefaultGroup(click.Group):
    """A group whose unknown first argument is passed to a default command (``query``)."""

    default_command = "query"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def unknown_name(name: str) -> str:
    from halo_data import schema as S

    return f"unknown table or view {name!r}: tables are {', '.join(S.TABLES)}; `halo-data views` lists the views"


# DuckDB's words for a name that is neither a table nor a view (its suggestion is on a line QueryError drops).
_NO_SUCH_TABLE = re.compile(r"^Catalog Error: Table with name (.+) does not exist!$")


def _view_params(params: tuple[str, ...], top_percent: float | None = None) -> dict[str, Any]:
    from halo_data.config import TEXT_PARAMS, parse_params

    out: dict[str, Any] = dict(parse_params(params))
    if top_percent is not None:
        out["top_percent"] = top_percent
    for k, v in list(out.items()):
        if k not in TEXT_PARAMS:
            try:
                out[k] = float(v)
            except ValueError:
                raise ValueError(f"parameter {k} must be a number, got {v!r}") from None
    return out


@click.group(cls=DefaultGroup, context_settings=CONTEXT_SETTINGS)
@version_option()
def main() -> None:
    """Query and maintain a HALO lake: Delta tables of agent steps, and the SQL views over them."""


@main.command()
@click.argument("path", required=False)
@LAKE_OPTION
@click.pass_context
@run_cli
def init(ctx: click.Context, path: str | None, lake_path: str) -> None:
    """Create a lake at PATH or --lake (meta/info.json and every table). Safe to run again."""
    if path is not None:
        given = ctx.get_parameter_source("lake_path") == click.core.ParameterSource.COMMANDLINE
        if given and path != lake_path:
            fail(f"two lakes given ({path} and --lake {lake_path}): give one")
        lake_path = check_lake_path(path)
    lake = Lake.init(lake_path)
    click.echo(f"lake ready at {lake.root} (format version {lake.info.format_version})")


@main.command()
@click.argument("sql")
@LAKE_OPTION
@click.option("--table", "fmt", flag_value="table", help="Output as a table (the default on a terminal).")
@click.option("--json", "fmt", flag_value="json", help="Output a JSON array (the default when piped).")
@click.option("--nl", "fmt", flag_value="nl", help="Output newline-delimited JSON.")
@click.option("--csv", "fmt", flag_value="csv", help="Output CSV.")
@click.option("--parquet", "parquet_file", type=click.Path(dir_okay=False), help="Write the result to a Parquet FILE.")
@click.option("--as-of", help="Read an older snapshot: N (steps version), TABLE=N[,TABLE=N], or an ISO time.")
@click.option("-p", "--param", "named", nargs=2, multiple=True, metavar="NAME VALUE", help="Named SQL parameter ($NAME).")
@click.option("--set", "view_params", multiple=True, metavar="NAME=VALUE", help=f"View parameter: {PARAM_NAMES}.")
@run_cli
def query(sql: str, lake_path: str, fmt: str | None, parquet_file: str | None, as_of: str | None, named, view_params) -> None:
    """Run read-only SQL (or - for stdin) against the lake's tables and views."""
    from halo_data import output
    from halo_data.query import run_query, write_query_parquet

    if sql == "-":
        sql = sys.stdin.read()
    lake = Lake.open(lake_path)
    try:
        if parquet_file:  # streamed: a result of any size is written a batch at a time
            rows = write_query_parquet(lake, parquet_file, sql, parameters=dict(named), as_of=as_of,
                                       params=_view_params(view_params))
            click.echo(f"{rows} rows written to {parquet_file}", err=True)
            return
        table = run_query(lake, sql, parameters=dict(named), as_of=as_of, params=_view_params(view_params))
    except LakeError as e:
        missing = _NO_SUCH_TABLE.match(str(e))
        if missing:
            fail(unknown_name(missing.group(1)))
        raise
    fmt = fmt or ("table" if sys.stdout.isatty() else "json")
    writer = {"table": output.write_table, "json": output.write_json, "nl": output.write_nl, "csv": output.write_csv}[fmt]
    writer(table, sys.stdout)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Output JSON.")
def views(as_json: bool) -> None:
    """List every view with what one of its rows is."""
    from halo_data.views import all_views

    vs = all_views()
    if as_json:
        click.echo(json.dumps([{"view": v.name, "description": v.description} for v in vs], indent=2))
        return
    width = max(len(v.name) for v in vs)
    for v in vs:
        click.echo(f"{v.name.ljust(width)}  {v.description}")


@main.command()
@click.argument("name")
@LAKE_OPTION
@run_cli
def describe(name: str, lake_path: str) -> None:
    """Columns and types of a table or view (with each table column's documentation)."""
    from halo_data import schema as S
    from halo_data.reader import RAW_TABLE_NAMES
    from halo_data.views import view_names

    if name not in S.TABLES and name not in view_names() and name not in RAW_TABLE_NAMES.values():
        fail(unknown_name(name))
    lake = Lake.open(lake_path)
    con = lake.connect()
    try:
        rows = con.execute(f'describe "{name}"').fetchall()
    finally:
        con.close()
    spec = S.TABLES.get(name)
    docs = {c.name: c.doc for c in spec.columns} if spec else {}
    width = max(len(r[0]) for r in rows)
    twidth = max(len(r[1]) for r in rows)
    for r in rows:
        click.echo(f"{r[0].ljust(width)}  {r[1].ljust(twidth)}  {docs.get(r[0], '')}".rstrip())


EXPORT_FORMATS = ("jsonl", "parquet", "atif", "hf", "otel")
EPISODE_FORMATS = ("atif", "otel")  # whole episodes: OUTPUT alone takes every episode of the lake


@main.command()
@click.argument("view")
@click.argument("output", required=False)
@LAKE_OPTION
@click.option("--format", "fmt", metavar="FORMAT",
              help=f"{' | '.join(EXPORT_FORMATS)}. Default: from OUTPUT's suffix (.parquet, else jsonl).")
@click.option("--where", help="SQL filter on the view's columns (atif, otel: an episode is exported when one of its rows matches).")
@click.option("--top-percent", type=float, help="Top-percent cut of progress_ranking (bc_rows).")
@click.option("--set", "view_params", multiple=True, metavar="NAME=VALUE", help=f"View parameter: {PARAM_NAMES}.")
@click.option("--as-of", help="Read an older snapshot (see query).")
@click.option("--split-by", metavar="COLUMN", help="hf: one split per value of COLUMN (default: one split, train).")
@click.option("--push-to-hub", "hub_repo", metavar="REPO", help="hf: then upload the folder to the Hub as dataset REPO (needs HF_TOKEN).")
@click.option("--private", is_flag=True, help="hf: with --push-to-hub, create the Hub dataset private.")
@run_cli
def export(view: str, output: str | None, lake_path: str, fmt: str | None, where: str | None, top_percent: float | None,
           view_params, as_of: str | None, split_by: str | None, hub_repo: str | None, private: bool) -> None:
    """Write VIEW to OUTPUT: JSONL in TRL's column names (prompt/completion, prompt/chosen/rejected), Parquet,
    a Hugging Face dataset folder (--format hf), or whole episodes (--format atif|otel [VIEW] OUTPUT): ATIF
    documents, or OpenTelemetry GenAI traces in OTLP JSON."""
    if fmt is not None and fmt not in EXPORT_FORMATS:
        fail(f"unknown export format {fmt!r}: use {', '.join(EXPORT_FORMATS)}")
    if output is None:
        if fmt not in EPISODE_FORMATS:
            fail("missing OUTPUT: halo-data export VIEW OUTPUT (only --format atif or otel takes OUTPUT alone)")
        view, output = "steps", view
    if fmt != "hf" and (split_by or hub_repo or private):
        fail("--split-by, --push-to-hub and --private are options of --format hf")
    lake = Lake.open(lake_path)
    params = _view_params(view_params, top_percent)
    if fmt == "atif":
        from halo_data.atif import export_atif

        episodes, images = export_atif(lake, output, view=view, where=where, params=params, as_of=as_of)
        click.echo(f"{episodes} episodes written as ATIF to {output} ({images} screenshots)")
        return
    if fmt == "otel":
        from halo_data.otel import export_otel

        episodes, spans = export_otel(lake, output, view=view, where=where, params=params, as_of=as_of)
        click.echo(f"{episodes} episodes written as OTLP JSON traces to {output} ({spans} spans)")
        return
    if fmt == "hf":
        from halo_data.hf_dataset import export_hf, push_to_hub

        result = export_hf(lake, view, output, where=where, params=params, as_of=as_of, split_by=split_by)
        splits = ", ".join(f"{s}: {n}" for s, n in result.rows.items())
        click.echo(f"{result.total} rows of {view} written to {output} as a Hugging Face dataset ({splits})")
        if hub_repo:
            click.echo(f"pushed to {push_to_hub(output, hub_repo, private=private)}")
        return
    from halo_data.ops import export as do_export

    n = do_export(lake, view, output, fmt=fmt, where=where, params=params, as_of=as_of)
    click.echo(f"{n} rows of {view} written to {output}")


@main.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@LAKE_OPTION
@click.option("--run-id", help="Run id for the imported episodes (default: derived from each source).")
@click.option("--format", "fmt", metavar="FORMAT", default="auto", show_default=True,
              help="auto | agisdk | jsonl | atif | art (auto: ATIF .json/.jsonl documents are recognised by their "
                   "schema_version, ART's Parquet trajectory logs by their columns).")
@run_cli
def import_(sources: tuple[str, ...], lake_path: str, run_id: str | None, fmt: str) -> None:
    """Import agisdk result folders, per-episode JSONL trajectories, ATIF documents or ART's Parquet trajectory logs
    (creating the lake if missing)."""
    from halo_data.importers import IMPORT_FORMATS, import_sources

    if fmt not in IMPORT_FORMATS:
        fail(f"unknown import format {fmt!r}: use {', '.join(IMPORT_FORMATS)}")
    for source in sources:
        if not os.path.exists(source):
            fail(f"{source} does not exist")
    lake = Lake.init(lake_path)
    report = import_sources(lake, list(sources), run_id=run_id, fmt=fmt)
    click.echo(f"imported {report.episodes} episodes ({report.steps} steps) into {lake.root}")
    if report.failures:
        for f in report.failures:
            click.echo(f"Error: {f}", err=True)
        sys.exit(1)


@main.command()
@LAKE_OPTION
@click.option("--json", "as_json", is_flag=True)
@run_cli
def stats(lake_path: str, as_json: bool) -> None:
    """Rows, files, bytes and version of every table, and its Delta log's bytes."""
    from halo_data import output
    from halo_data.ops import stats as do_stats

    rows = do_stats(Lake.open(lake_path))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        import pyarrow as pa

        output.write_table(pa.Table.from_pylist(rows), sys.stdout)


@main.command()
@LAKE_OPTION
@click.option("--target-size", type=int, help="Target file size in bytes.")
@run_cli
def compact(lake_path: str, target_size: int | None) -> None:
    """Merge small files and drop screenshot copies. Readers of older snapshots are not disturbed."""
    from halo_data.ops import compact as do_compact

    report = do_compact(Lake.open(lake_path), target_size=target_size)
    parts = [f"{t}: {m['files_removed']} -> {m['files_added']} files" for t, m in report["tables"].items() if m["files_removed"]]
    click.echo(f"dropped {report['screenshot_copies_dropped']} screenshot copies; " + ("; ".join(parts) or "nothing to merge"))


@main.command()
@LAKE_OPTION
@run_cli
def upgrade(lake_path: str) -> None:
    """Rewrite an older lake in this HALO's format (one commit per table; older snapshots stay readable until vacuum)."""
    from halo_data.ops import upgrade as do_upgrade

    report = do_upgrade(Lake.open(lake_path))
    before, after = report["format_version"]
    parts = [f"{t}: partitioned by {', '.join(m['partition_by'][1]) or 'nothing'} ({m['files'][0]} -> {m['files'][1]} files)"
             for t, m in report["tables"].items()]
    if before == after and not parts:
        click.echo(f"lake {lake_path} is already in format version {after}: nothing to rewrite")
    else:
        click.echo(f"format version {before} -> {after}" + ("; " + "; ".join(parts) if parts else ""))


@main.command()
@LAKE_OPTION
@click.option("--retention-hours", type=int, default=168, show_default=True)
@click.option("--dry-run", is_flag=True)
@run_cli
def vacuum(lake_path: str, retention_hours: int, dry_run: bool) -> None:
    """Delete files no snapshot within the retention needs (ends time travel before it), and superseded Delta checkpoints."""
    from halo_data.ops import vacuum as do_vacuum

    out = do_vacuum(Lake.open(lake_path), retention_hours=retention_hours, dry_run=dry_run)
    n = sum(len(v) for v in out.values())
    checkpoints = sum(f.startswith("_delta_log/") for v in out.values() for f in v)
    click.echo(f"{'would delete' if dry_run else 'deleted'} {n} files"
               + (f" ({checkpoints} of them superseded Delta checkpoints)" if checkpoints else ""))


@main.command()
@LAKE_OPTION
@click.option("--all-versions", is_flag=True, help="Check the files of every snapshot, not only the current one.")
@run_cli
def validate(lake_path: str, all_versions: bool) -> None:
    """Check every file is readable and matches the schema, and no episode step is stored twice."""
    from halo_data.ops import validate as do_validate

    problems = do_validate(Lake.open(lake_path), all_versions=all_versions)
    if problems:
        for p in problems:
            click.echo(f"Error: {p}", err=True)
        sys.exit(1)
    click.echo("lake is valid")


@main.command()
@LAKE_OPTION
@click.option("--dry-run", is_flag=True, help="List what would be forgotten; commit nothing.")
@run_cli
def repair(lake_path: str, dry_run: bool) -> None:
    """Forget data files that the tables name but storage lost (Delta's FSCK, one commit per table): their rows are
    gone from then on, and every read works again. `validate` says which files are missing."""
    from halo_data.ops import repair as do_repair

    out = do_repair(Lake.open(lake_path), dry_run=dry_run)
    n = sum(len(v) for v in out.values())
    click.echo(f"{'would forget' if dry_run else 'forgot'} {n} missing files"
               + (": " + ", ".join(f"{table} {len(files)}" for table, files in out.items()) if out else ""))


@main.command()
@click.argument("run_id")
@LAKE_OPTION
@run_cli
def quarantine(run_id: str, lake_path: str) -> None:
    """Delete every row of RUN_ID (recoverable with --as-of until vacuumed)."""
    from halo_data.ops import quarantine as do_quarantine

    report = do_quarantine(Lake.open(lake_path), run_id)
    n = sum(report["deleted_rows"].values())
    as_of = ",".join(f"{t}={v}" for t, v in report["restore_as_of"].items())
    click.echo(f"deleted {n} rows of run {run_id}; read them back with --as-of {as_of}")


@main.command()
@LAKE_OPTION
@click.option("--port", type=int, default=8501, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@run_cli
def dashboard(lake_path: str, port: int, host: str) -> None:
    """Start the Streamlit dashboard on the lake."""
    import importlib.util
    import subprocess

    # Started by module name in a process of its own: the lake never imports the screen.
    if importlib.util.find_spec("dashboards") is None or importlib.util.find_spec("streamlit") is None:
        fail("the dashboard is not installed: pip install 'halo[dashboard]'")
    click.echo(f"HALO dashboard on http://{host}:{port} (lake {lake_path})", err=True)
    cmd = [sys.executable, "-m", "dashboards", "--lake", lake_path, "--port", str(port), "--host", host]
    sys.exit(subprocess.call(cmd))


def entry() -> None:
    try:
        main()
    except BrokenPipeError:  # `halo-data ... | head`
        sys.stderr.close()
        sys.exit(0)


if __name__ == "__main__":
    entry()
