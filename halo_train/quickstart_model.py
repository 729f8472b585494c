"""The main job with a real pretrained model, by name: zero-shot rollouts → BC on its own successes → held-out eval.

    halo-train quickstart --model smollm2-135m-instruct       # lake/ and out/quickstart-smollm2-135m-instruct/

1. HALO's chat server serves the model (converted once into the model cache, ``halo-train models``); the model plays
   MiniWoB++ tasks zero-shot on train task seeds, its answers constrained to the page's actions (``--policy openai
   --policy-option constrain_actions=true --observation elements``, temperature 1), every step into the lake.
2. BC (rejection sampling): a LoRA adapter trained on the steps of the successful episodes only (``bc_rows`` of
   that run, ``success``).
3. The chat server loads the adapter; the adapter, the zero-shot model and the random policy each play the same
   held-out task seeds (a range the train seeds never reach), each an eval run in the lake.
4. A summary: held-out success per task and policy, pooled with 95% intervals, and whether the adapter beats
   zero-shot (and zero-shot random) beyond chance; the same as data in ``OUTPUT_DIR/summary.json``.

The default task comes from learning-v2 (docs/learning.md): the train task where one round of BC on the model's own
successes moved it most. Its first page (a collapsed section) repeats across seeds, so some held-out seeds start on
pages the zero-shot run has seen; the summary counts how many held-out first pages and steps the training run had. Re-running resumes every run (nothing collected twice) and trains again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from halo_data.cli_support import script_command

log = logging.getLogger(__name__)

# learning-v2's train task where one round of BC on the model's own successes helped most, in the samples its
# bc_filtered arm draws on train seeds between rounds (64 episodes a round, temperature 1): click-collapsible, 23%
# in round 0 (the base model), 50% in round 1. On choose-list, whose pages are new on every seed, the same round
# left the samples where they were (31%, then 30%).
MODEL_TASKS = ("miniwob.click-collapsible",)
EVAL_SEED_START = 100_000  # held-out task seeds; train seeds are 0 ... task_seeds - 1
ADAPTER_NAME = "quickstart-bc"
_LABEL = {"bc": "BC adapter"}
REQUEST_TIMEOUT_S = 900.0


@dataclasses.dataclass
class ModelQuickstartConfig:
    model: str = dataclasses.field(default="smollm2-135m-instruct", metadata={"help": "A known model name (halo-train models) or a model folder."})
    lake: str = dataclasses.field(default="lake", metadata={"help": "Lake root (created if missing)."})
    output_dir: str = dataclasses.field(default="", metadata={"help": "Where the adapter and the engine log go (out/quickstart-MODEL by default)."})
    tasks: tuple[str, ...] = dataclasses.field(default=MODEL_TASKS, metadata={"help": "MiniWoB++ tasks."})
    task_seeds: int = dataclasses.field(default=32, metadata={"help": "Train task seeds per task (0 ... N-1)."})
    rollouts_per_task: int = dataclasses.field(default=4, metadata={"help": "Zero-shot attempts per task and train seed."})
    eval_seeds: int = dataclasses.field(default=32, metadata={"help": "Held-out task seeds per task (from 100000)."})
    eval_attempts: int = dataclasses.field(default=2, metadata={"help": "Attempts per held-out task seed and policy."})
    max_steps: int = dataclasses.field(default=4, metadata={"help": "Steps per episode."})
    temperature: float = dataclasses.field(default=1.0, metadata={"help": "Sampling temperature of rollouts and eval."})
    train_steps: int = dataclasses.field(default=32, metadata={"help": "BC optimizer steps."})
    lr: float = dataclasses.field(default=2e-4, metadata={"help": "BC learning rate."})
    lora_r: int = dataclasses.field(default=16, metadata={"help": "LoRA rank (on q, k, v and o)."})
    workers: int = dataclasses.field(default=2, metadata={"help": "Rollout worker processes (the chat server batches their requests)."})
    seed: int = dataclasses.field(default=0, metadata={"help": "Seed of sampling and training."})
    run_id: str = dataclasses.field(default="", metadata={"help": "Prefix of the run ids (quickstart-MODEL by default)."})
    progress: bool = True

    def __post_init__(self) -> None:
        label = Path(self.model).name
        self.output_dir = self.output_dir or f"out/quickstart-{label}"
        self.run_id = self.run_id or f"quickstart-{label}"


@dataclasses.dataclass
class ModelQuickstartSummary:
    runs: dict[str, str]  # phase -> run id
    success: dict[str, dict[str, tuple[int, int]]]  # policy -> task -> (successes, episodes) on held-out seeds
    train_successes: tuple[int, int]
    bc: dict[str, Any]
    seconds: float
    seen_in_training: dict[str, int]  # the zero-shot eval's episodes and steps whose state the training run had


def run_model_quickstart(cfg: ModelQuickstartConfig, echo: Callable[[str], None] = print) -> ModelQuickstartSummary:
    from halo_agent.serving import EngineClient
    from halo_data.lake import Lake
    from halo_train.config import BCConfig, TrainConfigError, resolve_base_model
    from halo_data.lake import LakeError
    from halo_train import train_bc
    from halo_train.served import _chat_server

    t0 = time.perf_counter()
    folder = resolve_base_model(cfg.model, TrainConfigError)  # converts a known model once, before anything starts
    out = Path(cfg.output_dir)
    lake = Lake.init(cfg.lake)
    runs = {"zero-shot": f"{cfg.run_id}-zero-shot", "eval random": f"{cfg.run_id}-eval-random",
            "eval zero-shot": f"{cfg.run_id}-eval-zero-shot", "eval bc": f"{cfg.run_id}-eval-bc"}
    n_tasks = len(cfg.tasks)
    echo(f"[1/3] {cfg.model} served by HALO's chat server ({folder}); zero-shot on {n_tasks} tasks x {cfg.task_seeds} "
         f"seeds x {cfg.rollouts_per_task} attempts -> {cfg.lake}")
    with _chat_server(folder, out / "engine.log") as url:
        engine = EngineClient(url)
        engine.wait_ready(timeout=600)
        base_name = next(name for name, card in engine.models().items() if not card.get("parent"))
        rollout = _rollout(cfg, lake, runs["zero-shot"], "openai", base_name, url, task_seed=0, task_seeds=cfg.task_seeds,
                           attempts=cfg.rollouts_per_task, kind="rollout")
        train_ok = _successes(lake, runs["zero-shot"])
        ok, n = (sum(v[0] for v in train_ok.values()), sum(v[1] for v in train_ok.values()))
        echo(f"      {ok}/{n} episodes succeeded ({_per_task(train_ok)}), {rollout.steps} steps at "
             f"{rollout.steps_per_second:.2f} steps/s")

        echo(f"[2/3] BC on the successful episodes' steps: {cfg.train_steps} steps of LoRA r {cfg.lora_r}")
        bc_cfg = BCConfig(
            lake=cfg.lake, base_model=folder, output_dir=str(out / "bc"), where=f"run_id = '{runs['zero-shot']}' AND success",
            top_percent=100, max_steps=cfg.train_steps, lr=cfg.lr, lora_r=cfg.lora_r, lora_alpha=2 * cfg.lora_r,
            lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], seed=cfg.seed, adapter_name=ADAPTER_NAME,
        )
        try:
            trained = train_bc(bc_cfg)
        except LakeError as e:  # no success to learn from: the eval still compares zero-shot with random
            trained, bc = None, {"skipped": str(e)}
            echo(f"      skipped: {e}")
        else:
            loss = trained.metrics.get("train_loss", trained.metrics.get("loss"))
            bc = {"run_id": trained.run_id, "rows": trained.rows, "steps": trained.global_step,
                  "adapter": str(trained.final_adapter), "loss": None if loss is None else float(loss)}
            echo(f"      {trained.global_step} steps on {trained.rows} rows, loss {_round(bc['loss'])} -> {trained.final_adapter}")

        phases = [("eval zero-shot", "openai", None), ("eval random", "random", None)]
        if trained is not None:
            engine.swap_adapter(ADAPTER_NAME, str(Path(trained.final_adapter).resolve()))
            phases.insert(0, ("eval bc", "openai", ADAPTER_NAME))
        echo(f"[3/3] held-out task seeds {EVAL_SEED_START}...{EVAL_SEED_START + cfg.eval_seeds - 1} x "
             f"{cfg.eval_attempts} attempts: {', '.join(p.removeprefix('eval ') for p, _, _ in phases)}")
        for phase, policy, adapter in phases:
            _rollout(cfg, lake, runs[phase], policy, base_name, url, task_seed=EVAL_SEED_START, task_seeds=cfg.eval_seeds,
                     attempts=cfg.eval_attempts, kind="eval", adapter=adapter)
    success = {phase.removeprefix("eval "): _successes(lake, runs[phase]) for phase, _, _ in phases}
    result = ModelQuickstartSummary(runs=runs, success=success, train_successes=(ok, n), bc=bc,
                                    seconds=time.perf_counter() - t0,
                                    seen_in_training=_seen_in_training(lake, runs["zero-shot"], runs["eval zero-shot"]))
    _print_summary(cfg, result, echo, _write_summary(cfg, result))
    return result


def _rollout(cfg: ModelQuickstartConfig, lake, run_id: str, policy: str, base_name: str, url: str, task_seed: int,
             task_seeds: int, attempts: int, kind: str, adapter: str | None = None):
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.runs import existing_run

    # A loaded CPU answers slowly: wait for it rather than time out and send the same request again behind it.
    options = {"base_url": url, "constrain_actions": True, "timeout_s": REQUEST_TIMEOUT_S}
    through_engine = dict(model=base_name, adapter=adapter, policy_options=options) if policy == "openai" else {}
    summary = run_rollouts(RolloutConfig(
        env="miniwob", tasks=list(cfg.tasks), rollouts_per_task=attempts, policy=policy, **through_engine,
        temperature=cfg.temperature, seed=cfg.seed + task_seed, task_seed=task_seed, task_seeds=task_seeds,
        observation="elements", max_steps=cfg.max_steps, workers=cfg.workers, lake=cfg.lake, run_id=run_id,
        resume=existing_run(lake, run_id) is not None, kind=kind, progress=cfg.progress,
        command="halo-train quickstart --model",
    )).stop_if_interrupted()  # Ctrl-C or SIGTERM: what finished is in the lake; a re-run resumes it
    return summary


def _successes(lake, run_id: str) -> dict[str, tuple[int, int]]:
    rows = lake.query_arrow(
        f"select task_id, count(*) filter (where success) ok, count(*) n from episodes where run_id = '{run_id}' "
        "group by task_id order by task_id"
    ).to_pylist()
    return {r["task_id"]: (int(r["ok"]), int(r["n"])) for r in rows}


def _seen_in_training(lake, train_run: str, eval_run: str) -> dict[str, int]:
    """Of the zero-shot eval's episodes, how many start on a page the training run saw, and of its steps, how many
    have a state it saw (a state is the prompt, hashed): held-out seeds are new pages only where these are 0."""
    from halo_data.novelty import seen_states

    tasks = seen_states(lake, [train_run], [eval_run]).get(eval_run, {}).values()
    return {"episodes": sum(t["episodes"] for t in tasks), "first_pages_seen": sum(t["first_state_seen"] for t in tasks),
            "steps": sum(t["steps"] for t in tasks), "steps_seen": sum(t["steps_seen"] for t in tasks)}


def _per_task(success: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{task.removeprefix('miniwob.')} {ok}/{n}" for task, (ok, n) in success.items())


def _round(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _pooled(by_task: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Successes and episodes over every task."""
    return sum(v[0] for v in by_task.values()), sum(v[1] for v in by_task.values())


def _comparison(success: dict[str, dict[str, tuple[int, int]]]) -> dict[str, Any]:
    """Each policy's pooled success with its 95% Wilson interval, and the differences that say whether training
    helped (the BC adapter against zero-shot, zero-shot against random) with Newcombe's 95% interval: on a few
    dozen episodes most differences are within what chance gives, and the verdict says so."""
    from halo_data.stats import newcombe, wilson

    pooled = {}
    for policy in ("bc", "zero-shot", "random"):
        ok, n = _pooled(success.get(policy, {}))
        if n:
            lo, hi = wilson(ok, n)
            pooled[policy] = {"successes": ok, "episodes": n, "rate": ok / n, "low": lo, "high": hi}
    differences = []
    for a, b in (("bc", "zero-shot"), ("zero-shot", "random")):
        if a in pooled and b in pooled:
            d, lo, hi = newcombe(pooled[a]["successes"], pooled[a]["episodes"], pooled[b]["successes"], pooled[b]["episodes"])
            name = _LABEL.get(a, a)
            verdict = (f"{name} is better" if lo > 0 else f"{name} is worse" if hi < 0
                       else f"{pooled[a]['episodes'] + pooled[b]['episodes']} episodes cannot tell them apart")
            differences.append({"policy": a, "against": b, "difference": d, "low": lo, "high": hi, "verdict": verdict})
    return {"pooled": pooled, "differences": differences}


def _comparison_lines(comparison: dict[str, Any]) -> list[str]:
    cells = [f"{_LABEL.get(policy, policy)} {100 * p['rate']:.0f}% [{100 * p['low']:.0f}, {100 * p['high']:.0f}]"
             for policy, p in comparison["pooled"].items()]
    lines = ["95% intervals        " + ", ".join(cells)]
    for d in comparison["differences"]:
        lines.append(f"{_LABEL.get(d['policy'], d['policy'])} - {d['against']}: {100 * d['difference']:+.0f} points "
                     f"[{100 * d['low']:+.0f}, {100 * d['high']:+.0f}]: {d['verdict']}")
    return lines


def _write_summary(cfg: ModelQuickstartConfig, s: ModelQuickstartSummary) -> Path:
    """The summary as data, ``OUTPUT_DIR/summary.json``: what the run printed, for scripts and benchmarks."""
    from halo_data.query import written_whole

    path = Path(cfg.output_dir) / "summary.json"
    record = {
        "model": cfg.model, "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "progress"},
        "runs": s.runs, "train_successes": list(s.train_successes), "bc": s.bc, "seconds": s.seconds,
        "seen_in_training": s.seen_in_training,
        "success": {policy: {task: list(v) for task, v in by_task.items()} for policy, by_task in s.success.items()},
        **_comparison(s.success),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as partial:
        partial.write_text(json.dumps(record, indent=2) + "\n")
    return path


def _print_summary(cfg: ModelQuickstartConfig, s: ModelQuickstartSummary, echo: Callable[[str], None], saved: Path) -> None:
    tasks = sorted({t for by_task in s.success.values() for t in by_task})
    width = max(len(t.removeprefix("miniwob.")) for t in tasks) if tasks else 4
    echo("")
    echo(f"Summary: held-out success of {cfg.model} (temperature {cfg.temperature:g}, at most {cfg.max_steps} steps)")
    echo(f"  {'task':<{width}}  {'BC adapter':>10}  {'zero-shot':>10}  {'random':>10}")
    for task in [*tasks, "all"]:
        cells = []
        for policy in ("bc", "zero-shot", "random"):
            by_task = s.success.get(policy, {})
            ok, n = by_task.get(task, (0, 0)) if task != "all" else _pooled(by_task)
            cells.append(f"{ok}/{n}")
        echo(f"  {task.removeprefix('miniwob.'):<{width}}  {cells[0]:>10}  {cells[1]:>10}  {cells[2]:>10}")
    for line in _comparison_lines(_comparison(s.success)):
        echo("  " + line)
    seen = s.seen_in_training
    echo(f"  seen in training     held-out first pages {seen['first_pages_seen']}/{seen['episodes']} episodes, states "
         f"{seen['steps_seen']}/{seen['steps']} steps (zero-shot eval against the zero-shot run)")
    if "skipped" in s.bc:
        echo(f"  BC                   skipped: {s.bc['skipped']}")
    else:
        echo(f"  BC                   {s.bc['steps']} steps on {s.bc['rows']} rows of the {s.train_successes[0]}/"
             f"{s.train_successes[1]} successful zero-shot episodes, run {s.bc['run_id']}, adapter {s.bc['adapter']}")
    echo(f"  took                 {s.seconds:.0f} s; the summary as data: {saved}")
    echo("")
    echo("Next:")
    runs = ", ".join(f"'{r}'" for phase, r in s.runs.items() if phase == "zero-shot" or phase.removeprefix("eval ") in s.success)
    echo("  " + script_command("halo-data", f"select run_id, task_id, count(*) episodes, avg(success::int) success_rate "
                               f"from episodes where run_id in ({runs}) group by all order by all", "--lake", cfg.lake))
