"""``halo-agent``: run browser agents into a HALO lake. Thin over ``halo_agent.rollout``.

    halo-agent tasks --env miniwob
    halo-agent rollout --env miniwob --tasks click-button,enter-text --rollouts-per-task 4 --lake lake
    halo-agent rollout --run-id demo --resume ...            # complete a killed run
    halo-agent eval --modes random,gpt4o_baseline --subset smoke --rollouts-per-task 2
    halo-agent search --tasks click-button-sequence --simulations 16 --expansions 4 --critic progress
    halo-agent verify-exploration --task click-button --temperature-a 0 --temperature-b 0.7
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click

from halo_data import prompts
from halo_data.cli_support import (CONTEXT_SETTINGS, LAKE_OPTION, fail, key_values, run_cli, script_command,
                                   short_openmp_spin, version_option)


def _split_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _parse_options(pairs: tuple[str, ...], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values parse as JSON where they can (numbers, true/false), else stay text."""
    try:
        return key_values(pairs)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=flag) from None


@click.group(context_settings=CONTEXT_SETTINGS)
@version_option()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Run browser agents on MiniWoB++ (offline) and REAL, into a HALO lake."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HALO_LOG_LEVEL", logging.getLevelName(level))
    short_openmp_spin()  # before a local policy imports torch


# ------------------------------------------------------------------------------------------ tasks

ENV_NAMES = ["miniwob", "real", "os"]
TASK_FILE_HELP = "os: tasks from this file (HALO YAML, or LifelongAgentBench os_interaction JSON) instead of HALO's set."


@main.command()
@click.option("--env", "env_name", type=click.Choice(ENV_NAMES), default="miniwob", show_default=True)
@click.option("--task-version", default=None, help="REAL task version (v2 by default).")
@click.option("--split", type=click.Choice(["train", "eval", "all"]), default="all", show_default=True)
@click.option("--subset", default=None, help="Only this named subset (or site).")
@click.option("--snapshot", type=click.Path(dir_okay=False), default=None, help="Write the task registry (ids, goals, sites, splits) to this JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON lines.")
@click.option("--task-file", type=click.Path(dir_okay=False, exists=True), default=None, help=TASK_FILE_HELP)
@click.option("--task-seed", type=int, default=None, help="os: show each task's instance of this seed (its goal as a fourth column).")
@run_cli
def tasks(env_name: str, task_version: str | None, split: str, subset: str | None, snapshot: str | None, as_json: bool, task_file: str | None,
          task_seed: int | None) -> None:
    """List an environment's tasks (and snapshot the registry)."""
    import datetime as dt

    from halo_agent.rollout import list_tasks, select_subset

    if task_seed is not None and env_name != "os":
        fail(f"--task-seed shows os task instances; {env_name} draws its instances at reset")
    specs = list_tasks(env_name, task_version=task_version, task_file=task_file, task_seed=task_seed)
    if split != "all":
        specs = [t for t in specs if t.split == split]
    if subset:
        specs = select_subset(env_name, subset, specs, task_file=task_file)
    if snapshot and env_name == "real":
        # A REAL snapshot carries its tasks' JSONs and eval scripts, so a rollout with
        # --task-registry runs exactly what was snapshotted.
        from halo_agent.registry import DEFAULT_TASK_VERSION, write_snapshot

        written = write_snapshot(snapshot, task_version or DEFAULT_TASK_VERSION, task_ids=[t.task_id for t in specs])
        click.echo(f"wrote {written['n_tasks']} tasks to {snapshot}", err=True)
        return
    if snapshot:
        payload = {
            "env": env_name,
            "task_version": task_version,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "tasks": [t.to_dict() for t in specs],
        }
        with open(snapshot, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
        click.echo(f"wrote {len(specs)} tasks to {snapshot}", err=True)
        return
    for t in specs:
        if as_json:
            click.echo(json.dumps(t.to_dict(), sort_keys=True))
        elif task_seed is not None:
            click.echo(f"{t.task_id}\t{t.site}\t{t.split}\t{t.goal}")
        else:
            click.echo(f"{t.task_id}\t{t.site}\t{t.split}")


# ------------------------------------------------------------------------------------------ rollout / eval


def _task_options(func):
    options = [
        click.option("--env", "env_name", type=click.Choice(ENV_NAMES), default="miniwob", show_default=True),
        click.option("--tasks", "task_ids", default=None, help="Comma-separated task ids."),
        click.option("--subset", default=None, help="Named task subset (miniwob: smoke, click, form, email, deterministic, all; os: short, files, permissions, processes, text, users; or a site)."),
        click.option("--sample-size", type=int, default=None, help="Sample this many tasks (seeded by --seed)."),
        click.option("--split", type=click.Choice(["train", "eval", "all"]), default="all", show_default=True, help="Only tasks of this registry split."),
        click.option("--task-version", default=None, help="REAL task version (v2 by default)."),
        click.option("--task-registry", type=click.Path(dir_okay=False), default=None, help="Task registry snapshot (JSON) to take tasks from."),
        click.option("--task-file", type=click.Path(dir_okay=False, exists=True), default=None, help=TASK_FILE_HELP),
        click.option("--rollouts-per-task", type=int, default=1, show_default=True, help="Attempts per task."),
        click.option("--temperature", type=float, default=1.0, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the policy's sampling."),
        click.option("--task-seed", type=int, default=None, help="Seed of the task instances (default: --seed)."),
        click.option("--task-seeds", type=int, default=1, show_default=True, help="Task seeds per task, from --task-seed on; each gets --rollouts-per-task attempts."),
        click.option("--max-steps", type=int, default=None, help="Steps per episode (default: 10 miniwob, 70 real, 5 os)."),
        click.option("--observation", type=click.Choice(list(prompts.OBSERVATION_FORMATS)), default="axtree", show_default=True,
                     help="The page in the prompt: the whole AXTree, or only the elements a policy may act on "
                          "(elements-v2: without descriptions of unnamed elements, as learning-v2 saw them)."),
        click.option("--workers", type=int, default=1, show_default=True, help="Parallel worker processes, each with its own browser."),
        click.option("--ray-address", default=None, help="Fan episodes out over a Ray cluster (auto, or HOST:PORT): --workers Ray workers, each with its own browser."),
        click.option("--pin-workers/--no-pin-workers", default=True, show_default=True, help="Keep each worker, with its browser, on one CPU (round robin)."),
        click.option("--run-id", default=None, help="Run id (default: <kind>-<env>-<UTC time>)."),
        click.option("--resume", is_flag=True, help="Complete the missing episodes of --run-id."),
        click.option("--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE", help="Extra policy option (repeatable)."),
        click.option("--env-option", "env_option", multiple=True, metavar="KEY=VALUE", help="Extra environment option (repeatable)."),
        click.option("--reward-config", type=click.Path(dir_okay=False), default=None, help="Reward rules and weights (YAML)."),
        click.option("--flush-episodes", type=int, default=32, show_default=True, help="Commit to the lake every this many episodes (and every 30 s)."),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
        click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON."),
        LAKE_OPTION,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _base_config(kind: str, **o: Any):
    from halo_agent.rollout import RolloutConfig

    return RolloutConfig(
        env=o["env_name"],
        tasks=_split_list(o["task_ids"]),
        subset=o["subset"],
        sample_size=o["sample_size"],
        rollouts_per_task=o["rollouts_per_task"],
        temperature=o["temperature"],
        seed=o["seed"],
        task_seed=o["task_seed"],
        task_seeds=o["task_seeds"],
        observation=o["observation"],
        max_steps=o["max_steps"],
        workers=o["workers"],
        pin_workers=o["pin_workers"],
        ray_address=o["ray_address"],
        lake=o["lake_path"],
        run_id=o["run_id"],
        resume=o["resume"],
        kind=kind,
        split=o["split"],
        task_version=o["task_version"],
        task_registry=o["task_registry"],
        policy_options=_parse_options(o["policy_option"], "--policy-option"),
        env_options={**_parse_options(o["env_option"], "--env-option"), **({"task_file": o["task_file"]} if o["task_file"] else {})},
        reward_config=o["reward_config"],
        flush_episodes=o["flush_episodes"],
        progress=not o["no_progress"],
    )


def _report(summary, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary.as_dict(), sort_keys=True))
        return
    click.echo(summary.describe())


@main.command()
@_task_options
@click.option("--policy", type=click.Choice(["random", "openai", "hf", "hierarchy", "goal_match"]), default="random", show_default=True,
              help="hierarchy: the orchestrator around the policy named by --policy-option worker=NAME (see docs/hierarchy.md); "
                   "goal_match: the rule that acts on the element the goal names (a non-learned baseline).")
@click.option("--model", default=None, help="Model name (OpenAI, vLLM-served model or LoRA name, local path for hf).")
@click.option("--adapter", default=None, help="LoRA adapter name or folder.")
@click.option("--policy-version", default=None, help="Version tag stored on every step.")
@click.option("--mode", default=None, help="Name of this policy configuration (default: the policy name).")
@click.option("--candidates", "candidates_per_state", type=int, default=0, show_default=True,
              help="At each step, sample N actions in the policy's call, execute each from the restored state and score it into `candidates` (0: off).")
@run_cli
def rollout(policy: str, model: str | None, adapter: str | None, policy_version: str | None, mode: str | None, candidates_per_state: int, **o: Any) -> None:
    """Run tasks x rollouts-per-task episodes into the lake (with --candidates, scored candidates at every state too)."""
    import dataclasses

    from halo_agent.rollout import run_rollouts

    config = dataclasses.replace(
        _base_config("rollout", **o), policy=policy, model=model, adapter=adapter, policy_version=policy_version, mode=mode,
        candidates_per_state=candidates_per_state,
    )
    summary = run_rollouts(config)
    _report(summary, o["as_json"])
    if summary.status == "interrupted":
        sys.exit(130)


@main.command("eval")
@_task_options
@click.option("--modes", "mode_names", default=None, help="Comma-separated mode names (see --list-modes).")
@click.option("--modes-file", type=click.Path(dir_okay=False), default=None, help="Extra modes (YAML), added to the shipped ones.")
@click.option("--list-modes", is_flag=True, help="List the known modes and exit.")
@run_cli
def eval_command(mode_names: str | None, modes_file: str | None, list_modes: bool, **o: Any) -> None:
    """Evaluate named modes on the same tasks; eval_matrix summarises the runs."""
    from halo_agent.rollout import load_modes, run_eval

    if list_modes:
        for name, mode in sorted(load_modes(modes_file).items()):
            policy = f"hierarchy({mode.policy})" if mode.hierarchical else mode.policy  # the policy is the worker
            click.echo(f"{name}\t{policy}\t{mode.model or ''}\t{mode.adapter or ''}\t{mode.description}")
        return
    names = _split_list(mode_names)
    if not names:
        raise ValueError("give --modes A,B (see --list-modes)")
    for summary in run_eval(names, _base_config("eval", **o), modes_file):
        _report(summary, o["as_json"])
        if summary.status == "interrupted":
            sys.exit(130)


@main.command("serve-tasks")
@click.option("--env", "env_name", type=click.Choice(["os"]), default="os", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (loopback by default).")
@click.option("--port", type=int, default=5000, show_default=True)
@click.option("--task-file", type=click.Path(dir_okay=False, exists=True), default=None, help=TASK_FILE_HELP)
@click.option("--max-rounds", type=int, default=5, show_default=True, help="Commands per sample before task_limit_reached.")
@click.option("--timeout", "timeout_s", type=float, default=20.0, show_default=True, help="Seconds per command; then its process group is killed.")
@click.option("--reward-map", default=None, help="Reward per outcome, e.g. correct=1,incorrect=-0.5,unknown=0 (the default).")
@click.option("--task-seed", type=int, default=0, show_default=True, help="Seed of the task instances served (names, paths, answers).")
@click.option("--idle-timeout", "idle_timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds an open sample may go without a request; then its sandbox is closed.")
@run_cli
def serve_tasks(env_name: str, host: str, port: int, task_file: str | None, max_rounds: int, timeout_s: float, reward_map: str | None,
                task_seed: int, idle_timeout_s: float) -> None:
    """Serve the os tasks over LifelongAgentBench's session protocol (/api/reset, /api/interact, ...)."""
    from halo_agent.envs.os_sandbox import check_host
    from halo_agent.task_server import build_service, serve

    check_host()
    service = build_service(task_file, max_rounds, reward_map, timeout_s, task_seed, idle_timeout_s)
    click.echo(f"serving {len(service.tasks)} {env_name} tasks on http://{host}:{port}/api (Ctrl-C stops)", err=True)
    serve(service, host, port)
@main.command()
@_task_options
@click.option("--policy", type=click.Choice(["random", "openai", "hf"]), default="random", show_default=True, help="Policy that expands (n = K) and simulates.")
@click.option("--model", default=None, help="Model name (OpenAI, vLLM-served model or LoRA name, local path for hf).")
@click.option("--adapter", default=None, help="LoRA adapter name or folder.")
@click.option("--policy-version", default=None, help="Version tag stored on every node.")
@click.option("--simulations", type=int, default=32, show_default=True, help="Simulations per tree (S).")
@click.option("--expansions", type=int, default=4, show_default=True, help="Candidate actions sampled in one call at each expanded node (K).")
@click.option("--c-exp", type=float, default=1.0, show_default=True, help="UCB1 exploration constant c.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="Q = alpha * Q_mcts + (1 - alpha) * Q_critic.")
@click.option("--max-depth", type=int, default=6, show_default=True, help="Deepest node; simulations stop there too.")
@click.option("--critic", default="progress", show_default=True, help="progress | policy | a model served at --critic-base-url.")
@click.option("--critic-base-url", default=None, help="OpenAI-compatible endpoint of a model critic (default $HALO_VLLM_URL).")
@click.option("--theta", type=float, default=0.1, show_default=True, help="Q margin between siblings that makes a pair (stored for mcts_pairs).")
@click.option("--widen", type=float, default=0.0, show_default=True, help="Progressive widening exponent: K more candidates while a node has fewer than K*(visits+1)**widen children (0: off).")
@click.option("--backup", type=click.Choice(["success", "progress"]), default="success", show_default=True, help="Back up the env reward, or it plus the dense progress reached.")
@click.option("--max-env-steps", type=int, default=None, help="Stop a tree after this many environment steps (replays included).")
@run_cli
def search(policy: str, model: str | None, adapter: str | None, policy_version: str | None, simulations: int, expansions: int,
           c_exp: float, alpha: float, max_depth: int, critic: str, critic_base_url: str | None, theta: float, widen: float, backup: str,
           max_env_steps: int | None, **o: Any) -> None:
    """Monte Carlo Tree Search per task seed (Agent Q); whole trees into mcts_nodes."""
    import dataclasses

    from halo_agent.search import SearchConfig, run_search

    base = dataclasses.asdict(_base_config("rollout", **o))
    base.update(policy=policy, model=model, adapter=adapter, policy_version=policy_version, max_steps=None)
    config = SearchConfig(
        **base, simulations=simulations, expansions=expansions, c_exp=c_exp, alpha=alpha, max_depth=max_depth, critic=critic,
        critic_base_url=critic_base_url, theta=theta, widen=widen, backup=backup, max_env_steps=max_env_steps,
    )
    summary = run_search(config)
    _report(summary, o["as_json"])
    if summary.status == "interrupted":
        sys.exit(130)


@main.command("verify-exploration")
@click.option("--env", "env_name", type=click.Choice(ENV_NAMES), default="miniwob", show_default=True)
@click.option("--task", "task_id", required=True, help="Task id.")
@click.option("--temperature-a", type=float, default=0.0, show_default=True)
@click.option("--temperature-b", type=float, default=0.7, show_default=True)
@click.option("--compare-steps", type=int, default=10, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--task-seed", type=int, default=None, help="Seed of the task instance (default: --seed).")
@click.option("--policy", type=click.Choice(["random", "openai", "hf"]), default="random", show_default=True)
@click.option("--model", default=None)
@click.option("--adapter", default=None)
@click.option("--task-version", default=None)
@click.option("--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE")
@click.option("--json", "as_json", is_flag=True)
@run_cli
def verify_exploration_command(env_name, task_id, temperature_a, temperature_b, compare_steps, seed, task_seed, policy, model, adapter, task_version, policy_option, as_json) -> None:
    """Do two temperatures give different action sequences for the same seeds?"""
    from halo_agent.rollout import RolloutConfig, verify_exploration

    base = RolloutConfig(
        env=env_name, seed=seed, task_seed=task_seed, policy=policy, model=model, adapter=adapter,
        task_version=task_version, policy_options=_parse_options(policy_option, "--policy-option"), progress=False,
    )
    report = verify_exploration(base, task_id, temperature_a, temperature_b, compare_steps)
    if as_json:
        click.echo(json.dumps({
            "task_id": report.task_id, "task_seed": report.task_seed,
            "temperature_a": report.temperature_a, "temperature_b": report.temperature_b,
            "actions_a": report.actions_a, "actions_b": report.actions_b,
            "differ": report.differ, "first_difference": report.first_difference,
        }, sort_keys=True))
    else:
        click.echo(f"{report.task_id} (task seed {report.task_seed}), up to {report.compared_steps} steps:")
        click.echo(f"  T={report.temperature_a:g}: {' ; '.join(report.actions_a)}")
        click.echo(f"  T={report.temperature_b:g}: {' ; '.join(report.actions_b)}")
        if report.differ:
            click.echo(f"differ: yes, from step {report.first_difference}")
        else:
            click.echo("differ: no — the two temperatures took the same actions")


@main.command(hidden=True, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def quickstart() -> None:
    """Moved to halo-train (the quickstart trains; an agent needs no trainer)."""
    fail(f"the quickstart is a halo-train command now: {script_command('halo-train', 'quickstart')}")


if __name__ == "__main__":
    main()
