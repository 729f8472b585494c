"""``halo-train experiment``: screen, register, run, status, export and report a pre-registered experiment."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import click

from halo_data.cli_support import CONTEXT_SETTINGS, run_cli, short_openmp_spin
from halo_train.experiment.record import ExperimentError, holder, holding

ROOT_HELP = "Where the lake, adapters, logs and records go (default: runs/NAME beside the working directory)."


def _setup(protocol: str, root: str | None, **kw):
    from halo_train.experiment.protocol import load
    from halo_train.experiment.runner import Runner

    p = load(protocol)
    return Runner(p, Path(root or Path("runs") / p.name), **kw)


def _results(runner, results: str | None) -> Path:
    """RESULTS/NAME: beside a protocols/ folder (bench/protocols -> bench/results), else beside the protocol file."""
    if results:
        return Path(results)
    folder = runner.cwd.parent if runner.cwd.name == "protocols" else runner.cwd
    return folder / "results" / runner.p.name


def _logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("halo_train.experiment")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


protocol_argument = click.argument("protocol", metavar="PROTOCOL.yaml")
root_option = click.option("--root", default=None, help=ROOT_HELP)


@click.group("experiment", context_settings=CONTEXT_SETTINGS)
def experiment() -> None:
    """Pre-registered experiments: a protocol file (tasks, splits, arms, seeds, budget, statistics, targets),
    screened on dev seeds, registered at a commit, run stage by stage (resumed exactly, each test split once),
    exported and reported. See docs/learning.md."""
    short_openmp_spin()  # also as `python -m halo_train.experiment`: the stages inherit it


@experiment.command("register")
@protocol_argument
@root_option
@run_cli
def register_command(protocol: str, root: str | None) -> None:
    """Record the protocol file's sha256 and the code's commit in the root: stages run only at that commit.
    Run it again at a new commit to let later stages run there (the file itself may not change once a stage ran)."""
    runner = _setup(protocol, root)
    runner.p.check_prompt_version()
    reg = runner.records.register(runner.p)
    where = reg["commit"] or f"halo {reg['packages'].get('halo')} (not a git checkout)"
    click.echo(f"registered {runner.p.name} (sha256 {reg['protocol_sha256'][:12]}) at {where}"
               f"{' with uncommitted changes' if reg['dirty'] else ''} in {runner.records.registration_file}")
    if reg["protocol_commit"] is None:
        click.echo(f"note: {runner.p.path} is not committed as it is: commit it to make the registration public")


@experiment.command("run")
@protocol_argument
@root_option
@click.option("--arms", default=None, help="Only these arms, comma-separated.")
@click.option("--seeds", default=None, help="Only these training seeds, comma-separated.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Rollout worker processes (browsers).")
@click.option("--dry-run", is_flag=True, help="Print the commands instead of running them (no records, no checks).")
@run_cli
def run_command(protocol: str, root: str | None, arms: str | None, seeds: str | None, workers: int, dry_run: bool) -> None:
    """Every stage of the plan not yet done, in order, each resumed where it stopped."""
    runner = _setup(protocol, root, workers=workers, dry_run=dry_run)
    unknown = [a for a in (arms or "").split(",") if a and a not in runner.p.arms]
    if unknown:
        raise click.UsageError(f"unknown arm(s) {', '.join(unknown)}: the protocol's arms are {', '.join(runner.p.arms)}")
    # SIGTERM (kill PID) ends the runner as Ctrl-C would: the running stage and the engine stop on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _logging()
    # One runner per root; a root that does not exist holds no registration, and `run` says so.
    with holding(runner.root, "run") if runner.root.exists() and not dry_run else contextlib.nullcontext():
        runner.run(arms=arms.split(",") if arms else None, seeds=[int(s) for s in seeds.split(",")] if seeds else None)


@experiment.command("status")
@protocol_argument
@root_option
@run_cli
def status_command(protocol: str, root: str | None) -> None:
    """Every stage: done, or episodes there of planned; the registrations, the commits stages ran at, and the last stage
    started or ended."""
    runner = _setup(protocol, root)
    rows = runner.status()
    for row in rows:
        click.echo(f"{row.stage:<52} {row}")
    episodes = [r for r in rows if r.unit == "episodes"]
    there, planned = sum(r.there for r in episodes), sum(r.planned for r in episodes)
    trained = [r.done for r in rows if r.unit != "episodes"]
    click.echo(f"episodes of the planned samples and evaluations: {there} of {planned} ({100 * there / max(planned, 1):.0f}%); "
               f"training: {sum(trained)} of {len(trained)} done")
    regs = runner.records.registrations()
    click.echo(f"registrations: {len(regs)}" + (f" (latest at {regs[-1]['commit'] or 'no commit'})" if regs else
                                                 " (run `halo-train experiment register` before `run`)"))
    stages = runner.records.stages()
    commits = sorted({s.get("commit") or "?" for s in stages if s.get("event") == "start"})
    if commits:
        click.echo(f"stages ran at: {', '.join(c[:12] for c in commits)}")
    last = next((s for s in reversed(stages) if s.get("event") in ("start", "end")), None)
    if last is not None and last["event"] == "start":
        # A stopped runner records no end (its stage is stopped with it, and `run` resumes it).
        click.echo(f"last stage: {last['stage']}, started {last['at']}; no end recorded: running, or stopped")
    elif last is not None:
        click.echo(f"last stage: {last['stage']}, ended {last['at']} (exit {last.get('rc')})")
    held = holder(runner.root)
    click.echo(f"now: `experiment {held.get('command', '?')}` is running (pid {held.get('pid', '?')}, since "
               f"{held.get('since', '?')})" if held is not None else "now: no `experiment run` or `pack` holds this root")


@experiment.command("stop")
@protocol_argument
@root_option
@click.option("--timeout", type=click.IntRange(min=1), default=120, show_default=True,
              help="Seconds to wait for the runner to let go of the root.")
@run_cli
def stop_command(protocol: str, root: str | None, timeout: int) -> None:
    """Stop the `run` that holds the root, as Ctrl-C would (SIGTERM: its running stage stops with it), and wait until
    it has let go; the next `run` goes on from where it stopped."""
    runner = _setup(protocol, root)
    held = holder(runner.root)
    if held is None:
        click.echo(f"nothing holds {runner.root}: nothing to stop")
        return
    if held.get("command") != "run" or not isinstance(held.get("pid"), int):
        raise ExperimentError(f"{runner.root} is held by `experiment {held.get('command', '?')}` (pid "
                              f"{held.get('pid', '?')}): let it finish")
    os.kill(held["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while holder(runner.root) is not None:
        if time.monotonic() > deadline:
            raise ExperimentError(f"`experiment run` (pid {held['pid']}) still holds {runner.root} after {timeout} s")
        time.sleep(0.5)
    click.echo(f"stopped `experiment run` (pid {held['pid']}, since {held.get('since', '?')}); `halo-train experiment "
               f"run` goes on from where it stopped")


@experiment.command("pack")
@protocol_argument
@root_option
@click.option("--to", "dest", required=True, help="The pack's folder: new, or an earlier pack of this root (updated in place).")
@click.option("--dry-run", is_flag=True, help="Write nothing: say what the pack would write and remove in the folder.")
@run_cli
def pack_command(protocol: str, root: str | None, dest: str, dry_run: bool) -> None:
    """Copy what `run` needs to go on into a folder (to keep in version control or object storage while no machine
    holds the root): the lake without its screenshots, the records and logs, the adapters without superseded
    checkpoints and versions, a finished arm's weights in float16. Stop `run` first. It says what the folder gained
    and lost since the last pack: what a commit of the folder carries."""
    from halo_train.experiment.pack import pack

    m = pack(_setup(protocol, root), dest, dry_run=dry_run)
    c = m["change"]
    since = f"the pack of {c['since']}" if c["since"] else "an empty folder"
    change = (f"{c['written']['files']} files written ({c['written']['bytes'] / 2**20:.1f} MiB; "
              f"{c['replaced']['files']} of them over a file of {c['replaced']['bytes'] / 2**20:.1f} MiB in all), "
              f"{c['removed']['files']} removed ({c['removed']['bytes'] / 2**20:.1f} MiB) against {since}")
    states = m["optimizer_states_kept"]
    if states:
        change += (f"; it holds {len(states)} optimizer state(s) of arms still training "
                   f"({sum(states.values()) / 2**20:.1f} MiB), which the pack after their training removes")
    if dry_run:
        click.echo(f"a pack now would hold {m['files']} files ({m['bytes'] / 2**20:.1f} MiB) in {dest}: {change}; "
                   f"nothing written")
        return
    left = sum(r["bytes"] for r in m["omitted"].values())
    click.echo(f"packed {m['files']} files ({m['bytes'] / 2**20:.1f} MiB) into {dest}: {change}; left out "
               f"{left / 2**20:.1f} MiB: " + (", ".join(f"{r['files']} {why}" for why, r in m["omitted"].items()) or "nothing"))


@experiment.command("unpack")
@protocol_argument
@root_option
@click.option("--from", "src", required=True, help="A folder written by `halo-train experiment pack`.")
@run_cli
def unpack_command(protocol: str, root: str | None, src: str) -> None:
    """Make the root again of a pack, into an empty folder at the root's own path; `run` then goes on from it."""
    from halo_train.experiment.pack import unpack

    runner = _setup(protocol, root)
    done = unpack(src, runner.root)
    repaired = ", ".join(f"{n} {table} files" for table, n in done["repaired"].items()) or "nothing"
    click.echo(f"unpacked {done['files']} files ({done['bytes'] / 2**20:.1f} MiB) into {runner.root}; the lake forgot "
               f"the files the pack left out: {repaired}")


@experiment.command("screen")
@protocol_argument
@root_option
@click.option("--tasks", default=None, help="Only these candidates, comma-separated (default: screening.candidates).")
@click.option("--arms", default="first_pages,random,heuristic,zero_shot", show_default=True,
              help="What to measure: first_pages (environment resets), random, heuristic, zero_shot (the base model).")
@click.option("--seeds", type=click.IntRange(min=1), default=None, help="Dev seeds per task for the arms (default: screening.dev_seeds).")
@click.option("--output", default=None, help="The screening's JSON (default: results/NAME/screening.json, beside the protocol or its protocols/ folder).")
@run_cli
def screen_command(protocol: str, root: str | None, tasks: str | None, arms: str, seeds: int | None, output: str | None) -> None:
    """Candidate tasks on dev seeds: distinct first pages, training-sample overlap, random / heuristic / zero-shot
    success, and the protocol's screening rules. Merged into the output file; resumable."""
    from halo_train.experiment.screen import SCREEN_ARMS, screen, table

    runner = _setup(protocol, root, enforce=False)
    runner.p.check_prompt_version()
    wanted = tuple(a for a in arms.split(",") if a)
    unknown = [a for a in wanted if a not in ("first_pages", *SCREEN_ARMS)]
    if unknown:
        raise click.UsageError(f"unknown screening arm(s) {', '.join(unknown)}: use first_pages, {', '.join(SCREEN_ARMS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the engine and the running rollout stop with it
    _logging()
    out = Path(output) if output else _results(runner, None) / "screening.json"
    data = screen(runner, out, tasks=[t for t in (tasks or "").split(",") if t] or None, arms=wanted, seeds=seeds,
                  echo=click.echo)
    click.echo(table(data))
    click.echo(f"screening: {out}")


@experiment.command("export")
@protocol_argument
@root_option
@click.option("--results", default=None, help="The results folder (default: results/NAME, beside the protocol or its protocols/ folder).")
@run_cli
def export_command(protocol: str, root: str | None, results: str | None) -> None:
    """episodes.parquet, timing.json, evidence.json, meta.json (with every stage's commit) and the first training
    seed's adapters."""
    from halo_train.experiment.export import export

    runner = _setup(protocol, root)
    click.echo(export(runner, _results(runner, results)))


@experiment.command("report")
@protocol_argument
@root_option
@click.option("--results", default=None, help="The results folder (default: results/NAME, beside the protocol or its protocols/ folder).")
@run_cli
def report_command(protocol: str, root: str | None, results: str | None) -> None:
    """Success per arm and split, pooled and per seed, with the protocol's intervals, from episodes.parquet."""
    from halo_train.experiment.report import report

    runner = _setup(protocol, root)
    click.echo(report(runner.p, _results(runner, results)))
