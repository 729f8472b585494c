"""The Agent Q loop: search with the served policy → trees in the lake → step-level pairs → DPO → reload → search again.

    halo-train mcts --env miniwob --tasks click-button-sequence --iterations 3 --simulations 16 --expansions 4 \\
        --base-model models/tiny --output-dir out/mcts --serve

    from halo_train.mcts import MCTSConfig, run_mcts
    summary = run_mcts(MCTSConfig(base_model="models/tiny", tasks=["click-button-sequence"], serve=True))  # an OnlineSummary

Iteration k:

1. ``halo_agent.search`` runs one search run ``RUN-k{k}`` with the served version as its
   policy (K samples in one call, with their generation logprobs), ``--task-seeds`` trees per
   task on task seeds ``--train-seed-start + k * task_seeds ...``; whole trees land in ``mcts_nodes``;
2. ``dpo_pairs`` rows with ``source = 'mcts'`` of that run (``mcts_pairs``: siblings whose Q
   differ by more than θ) train the newest adapter with DPO's sigmoid loss, the stored generation
   logprobs as the reference where both sides have them (as ``halo-train dpo --source mcts``), into
   ``OUTPUT/policy-{v+1}``: the run's persistent learner (``halo_train.learner``, as online GRPO's: one
   model, adapter and AdamW across iterations, every pair trained ``--epochs-per-update`` times in
   minibatches of ``--mini-batch-size``), or with ``--learner jobs`` a ``halo-train dpo`` job per update;
3. the engine loads it as ``RUN-policy-{v+1}`` and retires the old name (the online loop's
   engine and swap: ``halo_train.served.open_engine``, ``halo_agent.serving``);
4. the iteration (search run, trees solved, pairs, adapter, reload) is recorded in the run's
   ``runs`` row, its metrics in ``train_metrics`` (step = k).

An iteration whose trees give no pair is recorded without an update; the version stays.

Resume. An iteration is complete once its record is in the ``runs`` row. ``--resume`` (the run id from
``OUTPUT/online_run.json``) loads the version served after the last complete one and redoes the rest of the
interrupted iteration: its search run searches only the trees the lake lacks (a tree lands whole or not at all),
and a version folder already saved but not yet recorded is adopted, not trained again. The persistent learner
continues from that folder's ``learner_state.pt``: the same optimizer state, step and generators.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

from halo_agent.search.config import SearchOptions
from halo_data.lake import Lake
from halo_data.runs import existing_run
from halo_train.config import DPOConfig, TrainConfigError, _field
from halo_train.served import (
    OnlineSummary, Served, ServedLoopConfig, latest_adapter, loop_run_id, marks_status, open_engine, record_iteration,
    resumed_line, serve_start, start_record, update_version,
)

log = logging.getLogger(__name__)


class MCTSError(TrainConfigError):
    """An MCTS run that cannot start as configured; one line that says what to do."""


@dataclasses.dataclass
class MCTSConfig(ServedLoopConfig, SearchOptions):
    """The search options (``halo_agent.search.SearchOptions``), the served loop's, and the DPO update's."""

    output_dir: str = _field("out/mcts", "Where policy-{v} adapter folders go.")
    tasks: list = _field(["click-button-sequence"], "Tasks to search, comma-separated.")
    task_seeds: int = _field(2, "Trees per task in each iteration (new task seeds every iteration).")
    max_tokens: int = _field(32, "Most tokens an action may take.")
    lr: float = _field(5e-5, "Learning rate of each DPO update.")
    beta: float = _field(0.1, "DPO beta.")
    run_id: str | None = _field(None, "Run id (default: mcts-<UTC time>; --resume reads it from OUTPUT).")
    resume: bool = _field(False, "Continue the run in OUTPUT from its last complete iteration, with the options it started with (--iterations and the engine may change).")

    def __post_init__(self) -> None:
        self.check_served_loop(MCTSError)
        self.check_search_options(MCTSError)
        if int(self.task_seeds) < 1:
            raise MCTSError(f"--task-seeds must be at least 1, got {self.task_seeds}")


def run_mcts(cfg: MCTSConfig, echo: Callable[[str], None] = print) -> OnlineSummary:
    """Run (or resume) the Agent Q loop; one line per iteration through ``echo``."""
    t0 = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lake = Lake.init(cfg.lake)
    run_id = loop_run_id(cfg, out, "mcts", MCTSError)
    record, iterations = start_record(cfg, lake, run_id, "mcts", "dpo_pairs", MCTSError)
    with marks_status(lake, lambda: record), open_engine(cfg, out) as (engine, base_name):
        served = serve_start(engine, cfg, run_id, iterations, MCTSError)
        if iterations:
            echo(resumed_line(run_id, iterations, cfg.iterations, served))
        trained = latest_adapter(cfg, run_id, iterations)
        for k in range(len(iterations), cfg.iterations):
            it, served, trained = _iteration(cfg, lake, engine, base_name, run_id, k, served, trained)
            record = record_iteration(lake, record, cfg, iterations, it, served)
            echo(_describe(it))
    return OnlineSummary(run_id, iterations, served.name, time.perf_counter() - t0, served.path)


def _iteration(cfg: MCTSConfig, lake: Lake, engine, base_name: str, run_id: str, k: int, served: Served,
               trained: Served) -> tuple[dict[str, Any], Served, Served]:
    """Search with ``served`` (the run ``RUN-k{k}``, resumed where the lake holds it), then update ``trained``, the
    newest version, on its pairs and load the result."""
    search_run = f"{run_id}-k{k}"
    summary = _search(cfg, lake, engine, base_name, served, search_run, cfg.train_seed_start + k * cfg.task_seeds)
    if summary.status == "interrupted":
        raise KeyboardInterrupt  # the run is marked interrupted; --resume searches the trees still missing
    trees, pairs = _search_figures(lake, search_run), _count_pairs(lake, search_run)
    metrics: dict[str, float] = {
        "policy_version": served.version, "trees": trees["trees"], "solved_rate/search": trees["solved"] / max(trees["trees"], 1),
        "nodes": trees["nodes"], "unreproducible_nodes": trees["unreproducible"], "env_steps": summary.env_steps, "pairs": pairs,
    }
    it: dict[str, Any] = {"iteration": k, "search_run": search_run, "sampled_version": served.version, "update": "skipped: no pairs"}
    if pairs:
        trained, train = _update(cfg, lake, search_run, trained, run_id)
        it.update(adapter=trained.path, train_run=train["run_id"], lineage=train["lineage"], update="trained")
        metrics.update(train["metrics"])
        swap = engine.swap_adapter(trained.name, trained.path, retire=served.name)
        metrics["reload_seconds"] = swap.seconds
        it["reload"] = swap.message
        if swap.loaded:
            served = trained
    it["served_after"] = {"name": served.name, "version": served.version, "path": served.path}
    it["metrics"] = {name: float(v) for name, v in metrics.items() if v is not None}
    return it, served, trained


def _search(cfg: MCTSConfig, lake: Lake, engine, base_name: str, served: Served, run_id: str, task_seed: int):
    """One search run with the served version: every tree of the iteration's task seeds (the missing ones, where a
    killed run left some in the lake)."""
    from halo_agent.search import SearchConfig, run_search

    critic_url = engine.base_url if cfg.critic not in ("progress", "policy") else None
    return run_search(SearchConfig(
        env=cfg.env, tasks=list(cfg.tasks), policy="openai", model=base_name, adapter=served.name,
        policy_version=str(served.version), policy_options={"base_url": engine.base_url, "max_tokens": cfg.max_tokens},
        temperature=cfg.temperature, seed=cfg.seed + task_seed, task_seed=task_seed, task_seeds=cfg.task_seeds,
        simulations=cfg.simulations, expansions=cfg.expansions, c_exp=cfg.c_exp, alpha=cfg.alpha, max_depth=cfg.max_depth,
        critic=cfg.critic, critic_base_url=critic_url, theta=cfg.theta, widen=cfg.widen, lake=cfg.lake, run_id=run_id,
        env_options=cfg.environment_options(), progress=cfg.progress, command="halo-train mcts",
        resume=existing_run(lake, run_id) is not None,
    ))


def _search_figures(lake: Lake, search_run: str) -> dict[str, int]:
    """The search run's trees as the lake holds them (those a killed run wrote before, too): trees, solved trees (a
    reproducible terminal node with a positive reward), nodes, and nodes that did not reproduce."""
    row = lake.query_arrow(
        "select count(distinct tree_id) as trees, count(*) as nodes, count(*) filter (where not reproducible) as unreproducible, "
        "count(distinct tree_id) filter (where terminal and reproducible and reward > 0) as solved "
        "from mcts_nodes where run_id = $r", {"r": search_run}, views=False).to_pylist()[0]
    return {name: int(value or 0) for name, value in row.items()}


def _count_pairs(lake: Lake, search_run: str) -> int:
    table = lake.query_arrow("select count(*) from dpo_pairs where source = 'mcts' and run_id = $r", {"r": search_run})
    return int(table.column(0)[0].as_py() or 0)


def _update(cfg: MCTSConfig, lake: Lake, search_run: str, trained: Served, run_id: str) -> tuple[Served, dict[str, Any]]:
    """DPO of the newest adapter on the search run's pairs into ``OUTPUT/policy-{v+1}`` (renamed in when complete):
    by the run's persistent learner (``--learner persistent``), or a ``halo-train dpo`` job (``--learner jobs``).
    A version folder a killed run already saved is adopted, not trained again."""
    version = trained.version + 1
    staging = Path(cfg.output_dir) / "updates" / f"update-{version}"
    final = Path(cfg.output_dir) / f"policy-{version}"
    dpo = DPOConfig(
        lake=cfg.lake, base_model=cfg.base_model, init_adapter=trained.path, output_dir=str(staging),
        run_id=f"{run_id}-u{version}", source="mcts", where=f"run_id = '{search_run}'", max_steps=cfg.job_steps(),
        lr=cfg.lr, beta=cfg.beta, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        batch_size=cfg.batch_size, seed=cfg.seed + version,
    )
    stats = update_version(cfg, lake, dpo, trained, final, "dpo_pairs", MCTSError)
    metrics = {**(stats.get("metrics") or {}), **(stats.get("update_metrics") or {})}  # the trainer's loss, margins; the update's figures
    kept = ("loss", "rewards/margins", "rewards/accuracies", "rows_trained", "optimizer_steps", "displacement_from_previous",
            "update_seconds")
    return (Served.version_of(run_id, version, final.resolve()),
            {"run_id": dpo.run_id, "lineage": stats.get("lineage"), "metrics": {m: metrics[m] for m in kept if m in metrics}})


def _describe(it: dict[str, Any]) -> str:
    m = it["metrics"]
    text = (f"iteration {it['iteration']}: searched with v{it['sampled_version']}: {int(m['trees'])} trees, "
            f"{m['solved_rate/search']:.0%} solved, {int(m['nodes'])} nodes ({int(m['unreproducible_nodes'])} unreproducible), "
            f"{int(m['pairs'])} pairs")
    if it["update"] != "trained":
        return text + f"; no update ({it['update']})"
    text += f"; DPO -> {Path(it['adapter']).name}"
    return text + (f", reload {m['reload_seconds']:.2f} s" if it["served_after"]["path"] == it["adapter"] else f"; {it['reload']}")
