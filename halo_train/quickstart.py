"""The main job on the embedded default, end to end and offline:

MiniWoB++ rollouts with the random policy → the lake → its views → a tiny model
built locally → short BC, DPO and GRPO runs on the views → a summary.

    halo-train quickstart                    # lake/ and out/quickstart/
    halo-train quickstart --lake /tmp/lake --rollouts-per-task 2 --train-steps 2

Re-running it resumes the same rollout run (nothing is collected twice) and trains again.
It lives in halo_train because it trains: a trainer may drive the agent, never the reverse.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from halo_data.cli_support import script_command

log = logging.getLogger(__name__)

# Tasks on which a random policy both succeeds and fails, so groups have reward spread
# and DPO finds pairs.
DEFAULT_TASKS = (
    "miniwob.click-test",
    "miniwob.click-test-2",
    "miniwob.click-button",
    "miniwob.click-link",
    "miniwob.click-dialog",
    "miniwob.focus-text",
)


@dataclasses.dataclass
class QuickstartConfig:
    lake: str = dataclasses.field(default="lake", metadata={"help": "Lake root (created if missing)."})
    output_dir: str = dataclasses.field(default="out/quickstart", metadata={"help": "Where the tiny model and adapters go."})
    tasks: tuple[str, ...] = dataclasses.field(default=DEFAULT_TASKS, metadata={"help": "MiniWoB++ tasks to roll out."})
    rollouts_per_task: int = dataclasses.field(default=6, metadata={"help": "Attempts per task (a GRPO group)."})
    max_steps: int = dataclasses.field(default=8, metadata={"help": "Steps per episode."})
    workers: int = dataclasses.field(default=1, metadata={"help": "Rollout worker processes."})
    seed: int = dataclasses.field(default=0, metadata={"help": "Seed of rollouts and training."})
    run_id: str = dataclasses.field(default="quickstart", metadata={"help": "Run id of the rollout run (resumed when it exists)."})
    warmup_steps: int = dataclasses.field(default=60, metadata={"help": "SFT warm-up steps of the tiny model on bc_rows."})
    train_steps: int = dataclasses.field(default=5, metadata={"help": "Optimizer steps of each training job."})
    jobs: tuple[str, ...] = dataclasses.field(default=("bc", "dpo", "grpo"), metadata={"help": "Training jobs to run."})
    progress: bool = True


@dataclasses.dataclass
class QuickstartSummary:
    rollout: dict[str, Any]
    views: dict[str, int]
    reward_stats: list[dict[str, Any]]
    model_dir: str
    jobs: dict[str, dict[str, Any]]
    seconds: float


def _count(lake, sql: str) -> int:
    return int(lake.query_arrow(sql).column(0)[0].as_py())


def run_quickstart(cfg: QuickstartConfig, echo: Callable[[str], None] = print) -> QuickstartSummary:
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake

    t0 = time.perf_counter()
    lake = Lake.init(cfg.lake)
    resume = cfg.run_id in _run_ids(lake)

    echo(f"[1/4] MiniWoB++ rollouts: {len(cfg.tasks)} tasks x {cfg.rollouts_per_task} attempts, random policy -> {cfg.lake}")
    summary = run_rollouts(
        RolloutConfig(
            env="miniwob",
            tasks=list(cfg.tasks),
            rollouts_per_task=cfg.rollouts_per_task,
            policy="random",
            seed=cfg.seed,
            max_steps=cfg.max_steps,
            workers=cfg.workers,
            lake=cfg.lake,
            run_id=cfg.run_id,
            resume=resume,
            progress=cfg.progress,
            command="halo-train quickstart",
        )
    )
    rollout = summary.as_dict()
    echo(
        f"      {summary.episodes_written} episodes written ({summary.skipped_episodes} already there), "
        f"{summary.steps} steps at {summary.steps_per_second:.1f} steps/s"
        + ("" if summary.lake_share is None else f", lake share {summary.lake_share:.1%}")
    )

    echo("[2/4] views")
    where = f"run_id = '{cfg.run_id}'"
    views = {
        "episodes": _count(lake, f"select count(*) from episodes where {where}"),
        "successes": _count(lake, f"select count(*) from episodes where {where} and success"),
        "bc_rows": _count(lake, f"select count(*) from bc_rows where {where}"),
        "dpo_pairs": _count(lake, f"select count(*) from dpo_pairs where {where}"),
        "grpo_groups (episode level)": _count(
            lake, f"select count(distinct group_key) from grpo_groups where level = 'episode' and {where}"
        ),
        "grpo_groups (anchor states)": _count(
            lake, f"select count(distinct group_key) from grpo_groups where level = 'step' and group_size > 1 and {where}"
        ),
    }
    reward_stats = lake.query_arrow(
        "select run_id, n_episodes, n_groups, n_trainable_groups, round(reward_mean, 4) reward_mean, "
        "round(frac_reward_zero_std, 4) frac_reward_zero_std, round(success_rate, 4) success_rate "
        f"from reward_stats where scope = 'run' and {where}"
    ).to_pylist()
    for k, v in views.items():
        echo(f"      {k:<28} {v}")

    out = Path(cfg.output_dir)
    echo(f"[3/4] tiny Qwen-style model, warmed up on bc_rows -> {out / 'tiny-model'}")
    from halo_train import build_tiny_model

    model_dir = build_tiny_model(out / "tiny-model", warmup_lake=cfg.lake, steps=cfg.warmup_steps, seed=cfg.seed)

    echo(f"[4/4] training {', '.join(cfg.jobs)} for {cfg.train_steps} steps each")
    jobs = _train_jobs(cfg, str(model_dir), echo)

    result = QuickstartSummary(
        rollout=rollout,
        views=views,
        reward_stats=reward_stats,
        model_dir=str(model_dir),
        jobs=jobs,
        seconds=time.perf_counter() - t0,
    )
    _print_summary(cfg, result, echo)
    return result


def _run_ids(lake) -> set[str]:
    return set(lake.query_arrow("select run_id from runs", views=False).column("run_id").to_pylist())


def _train_jobs(cfg: QuickstartConfig, model_dir: str, echo: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    from halo_data.lake import LakeError
    from halo_train import BCConfig, DPOConfig, GRPOConfig, train_bc, train_dpo, train_grpo

    runners = {
        "bc": (BCConfig, train_bc),
        "dpo": (DPOConfig, train_dpo),
        "grpo": (GRPOConfig, train_grpo),
    }
    results: dict[str, dict[str, Any]] = {}
    for job in cfg.jobs:
        config_cls, train = runners[job]
        job_cfg = config_cls(
            lake=cfg.lake,
            base_model=model_dir,
            output_dir=str(Path(cfg.output_dir) / job),
            max_steps=cfg.train_steps,
            seed=cfg.seed,
            where=f"run_id = '{cfg.run_id}'",
        )
        try:
            r = train(job_cfg)
        except LakeError as e:  # e.g. no DPO pairs in a tiny run: say so and go on
            echo(f"      {job}: skipped — {e}")
            results[job] = {"status": "skipped", "reason": str(e)}
            continue
        results[job] = {
            "status": "trained",
            "run_id": r.run_id,
            "steps": r.global_step,
            "rows": r.rows,
            "adapter": str(r.final_adapter),
            "metrics": {k: v for k, v in r.metrics.items() if isinstance(v, (int, float))},
            "serve": r.serve_command,
        }
        loss = r.metrics.get("train_loss", r.metrics.get("loss"))
        echo(f"      {job}: {r.global_step} steps on {r.rows} rows, loss {loss if loss is None else round(float(loss), 4)} -> {r.final_adapter}")
    return results


def _print_summary(cfg: QuickstartConfig, s: QuickstartSummary, echo: Callable[[str], None]) -> None:
    echo("")
    echo("Summary")
    echo(f"  lake                 {os.path.abspath(cfg.lake)}")
    echo(f"  rollout run          {cfg.run_id}: {s.views['episodes']} episodes, {s.views['successes']} successes")
    for st in s.reward_stats:
        echo(
            f"  reward_stats         mean shaped return {st['reward_mean']}, frac_reward_zero_std {st['frac_reward_zero_std']}, "
            f"{st['n_trainable_groups']}/{st['n_groups']} trainable groups"
        )
    for job, j in s.jobs.items():
        if j["status"] == "trained":
            echo(f"  {job:<20} run {j['run_id']}, adapter {j['adapter']}")
        else:
            echo(f"  {job:<20} skipped: {j['reason']}")
    echo(f"  took                 {s.seconds:.0f} s")
    echo("")
    echo("Next:")
    metrics_sql = "select run_id, metric, step, value from train_metrics order by run_id, step"
    echo("  " + script_command("halo-data", "select * from reward_stats", "--lake", cfg.lake))
    echo("  " + script_command("halo-data", metrics_sql, "--lake", cfg.lake))
    echo("  " + script_command("halo-data", "dashboard", "--lake", cfg.lake))
    served = next((j["serve"] for j in s.jobs.values() if j.get("serve")), None)
    if served:
        echo(f"  {served}    # on a GPU host with vLLM (pip install 'halo[gpu]')")
