"""What every job shares: run ids, training arguments, checkpoints, the final adapter, the serving lines.

A job (bc.py, dpo.py, grpo.py) supplies two things — how to turn the view's
rows into a dataset, and how to build its trainer — and ``run_job`` does the
rest in the same order for all of them:

1. pin one snapshot of the lake (a resumed run reuses its original snapshot),
2. read the view, load the base model with fresh LoRA weights,
3. train, saving a resumable checkpoint (an adapter folder with
   ``training_stats.json``) every epoch and every ``--save-steps``,
4. save ``OUTPUT_DIR/final``, write metrics and the ``runs`` row to the lake,
5. return a ``TrainResult`` with the ``vllm serve`` line that serves the adapter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from halo_train.config import TrainConfig, TrainConfigError

log = logging.getLogger(__name__)

STATS_FILE = "training_stats.json"
FINAL_DIR = "final"
TRL_REF_ADAPTER = "ref"  # the adapter TRL's DPOTrainer adds to a PEFT model as its reference
# halo-agent eval modes (halo_agent/configs/modes.yaml) that request an adapter by its served name.
EVAL_MODES = {"qwen_worker_bc", "qwen_worker_dpo", "qwen3vl_bc", "qwen3vl_dpo", "qwen3vl_grpo"}


def quiet_hub() -> None:
    """HALO trains offline: no telemetry pings (HF_HUB_OFFLINE stays the user's choice)."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclasses.dataclass
class TrainResult:
    run_id: str
    job_type: str
    output_dir: Path
    final_adapter: Path
    checkpoints: list[Path]
    global_step: int
    rows: int
    dropped_rows: int
    metrics: dict[str, float]
    lineage: dict[str, int]
    policy_version: str
    serve_command: str
    eval_command: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def new_run_id(job_type: str) -> str:
    return f"train-{job_type}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%d-%H%M%S-%f')}"


def read_stats(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / STATS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def serve_command(base_model: str, adapter_name: str, adapter_dir: Path, lora_r: int) -> str:
    parts = ["vllm", "serve", base_model, "--enable-lora", "--lora-modules", f"{adapter_name}={adapter_dir}"]
    if lora_r > 16:  # vLLM refuses adapters above its --max-lora-rank (16 by default)
        parts += ["--max-lora-rank", str(lora_r)]
    return shlex.join(parts)


def eval_command(job_type: str, adapter_name: str) -> str:
    from halo_data.cli_support import script_command

    if job_type == "ppo":  # the os environment's mode for a served PPO adapter (modes.yaml: os_ppo)
        command = script_command("halo-agent", "eval", "--env", "os", "--modes", "os_ppo")
    elif adapter_name in EVAL_MODES:
        command = script_command("halo-agent", "eval", "--modes", adapter_name)
    else:
        command = script_command("halo-agent", "rollout", "--policy", "openai", "--model", adapter_name)
    return f"HALO_VLLM_URL=http://localhost:8000/v1 {command}"


def is_main_process() -> bool:
    """Rank 0 of a distributed launch (accelerate, torchrun, deepspeed set RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def use_bf16() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def common_training_args(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword arguments shared by SFTConfig, DPOConfig and TrainingArguments."""
    import torch

    gradient_checkpointing = cfg.gradient_checkpointing
    if gradient_checkpointing is None:
        gradient_checkpointing = torch.cuda.is_available()
    bf16 = use_bf16()
    return dict(
        output_dir=cfg.output_dir,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps if cfg.max_steps is not None else -1,
        learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        save_strategy="steps" if cfg.save_steps else "epoch",
        save_steps=cfg.save_steps or 500,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        bf16=bf16,
        fp16=torch.cuda.is_available() and not bf16,
        **activation_checkpointing(gradient_checkpointing),
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=False,
    )


def activation_checkpointing(on: bool) -> dict[str, bool]:
    """The training-arguments keyword for recomputing activations: transformers 5 renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` and warns on the old name."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": on}


class JobProgress(ProgressCallback):
    """The trainer's progress bar, named after the job, with the latest loss on it.

    transformers' own progress callback writes every log dict between the bar's lines
    (a wall of ``{'loss': …, 'grad_norm': …}``, thousands of characters a line in a log
    file); here each goes to the DEBUG log (``halo-train -v``). Every value is in
    ``train_metrics`` either way.
    """

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=state.max_steps, desc=self.label, dynamic_ncols=True)
        self.current_step = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        log.debug("%s step %d: %s", self.label, state.global_step, json.dumps(logs, default=str))
        loss = logs.get("loss")
        if self.training_bar is not None and isinstance(loss, (int, float)):
            self.training_bar.set_postfix(loss=f"{loss:.4g}", refresh=False)


def show_progress(trainer, label: str) -> None:
    """Replace the trainer's printing callbacks with one ``JobProgress`` bar."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(JobProgress(label))


class StatsCallback(TrainerCallback):
    """Writes training_stats.json into every checkpoint the trainer saves."""

    def __init__(self, describe: Callable[[Any], dict[str, Any]]):
        self.describe = describe
        self.saved: list[Path] = []

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.exists():
            (folder / STATS_FILE).write_text(json.dumps(self.describe(state), indent=2, default=str))
            self.saved.append(folder)


@dataclasses.dataclass
class JobSpec:
    """What a job adds to ``run_job``."""

    # (cfg, read, tokenizer) -> (train dataset, rows dropped, extra stats for training_stats.json)
    make_dataset: Callable[[TrainConfig, Any, Any], tuple[Any, int, dict[str, Any]]]
    # (cfg, model, tokenizer, dataset, callbacks) -> a transformers Trainer
    make_trainer: Callable[[TrainConfig, Any, Any, Any, list], Any]
    # (cfg, read) -> version of the weights training starts from (updates since the base model)
    start_version: Callable[[TrainConfig, Any], int] = lambda cfg, read: 0
    # SQL over the CTE `selected` (the filtered view); None reads the view's rows as they are
    sql: str | None = None
    # (model, tokenizer or processor) -> None, called once the base model is loaded
    on_load: Callable[[Any, Any], None] | None = None


def run_job(cfg: TrainConfig, spec: JobSpec) -> TrainResult:
    from halo_data.lake import Lake
    from halo_train import backends
    from halo_train.config import base_model_path
    from halo_train.data import read_for
    from halo_train.metrics import LakeMetricsCallback, record_run

    quiet_hub()
    resumed = read_stats(cfg.resume_from) if cfg.resume_from else {}
    run_id = cfg.run_id or resumed.get("run_id") or new_run_id(cfg.job_type)
    from halo_data.ids import check_run_id

    try:
        check_run_id(run_id)
    except ValueError as e:
        raise TrainConfigError(str(e)) from None
    # A resumed run reads exactly the rows the original run read.
    read = read_for(cfg, lineage=resumed.get("lineage"), sql=spec.sql)
    lake = Lake.open(cfg.lake)
    loaded = backends.load_for_training(cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    if spec.on_load is not None:
        spec.on_load(model, tokenizer)
    dataset, dropped, extra = spec.make_dataset(cfg, read, tokenizer)
    if len(dataset) == 0:
        raise TrainConfigError(
            f"no {cfg.job_type} rows left to train on from {read.source} (read {read.table.num_rows}, dropped {dropped}): "
            "raise --max-length or collect more episodes"
        )
    start_version = spec.start_version(cfg, read)
    base_model = base_model_path(cfg.base_model)
    started_at = dt.datetime.fromisoformat(resumed["started_at"]) if resumed.get("started_at") else dt.datetime.now(dt.timezone.utc)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(sys.argv) if sys.argv and "halo-train" in Path(sys.argv[0]).name else None

    def describe(state) -> dict[str, Any]:
        return {
            "job_type": cfg.job_type,
            "run_id": run_id,
            "base_model": base_model,
            "adapter_name": cfg.adapter_name,
            "backend": loaded.backend,
            "global_step": state.global_step,
            "epoch": state.epoch,
            "policy_version": str(start_version + state.global_step),
            "source_view": read.view,
            "where": read.where,
            "view_params": read.view_params,
            "runs": read.runs,
            "lineage": read.lineage,
            "rows": len(dataset),
            "dropped_rows": dropped,
            "started_at": started_at.isoformat(),
            "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "metrics": metrics_cb.last_logs,
            "log_history": state.log_history,
            "config": cfg.to_dict(),
            **extra,
        }

    metrics_cb = LakeMetricsCallback(lake, run_id)
    stats_cb = StatsCallback(describe)
    run_fields = dict(
        run_id=run_id, job_type=cfg.job_type, base_model=base_model, config_json=cfg.to_json(),
        source_view=read.source, lineage=read.lineage, output_dir=str(output_dir.resolve()),
        started_at=started_at, adapter=cfg.adapter_name, command=command,
    )
    # Under `accelerate launch` every process runs this job; rank 0 alone writes the lake and the folders.
    main = is_main_process()
    record = functools.partial(record_run, lake, **run_fields) if main else (lambda **fields: None)
    record(status="running", policy_version=None)
    trainer = spec.make_trainer(cfg, model, tokenizer, dataset, [metrics_cb, stats_cb] if main else [])
    show_progress(trainer, cfg.job_type)
    status = "failed"
    try:
        trainer.train(resume_from_checkpoint=cfg.resume_from)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        metrics_cb.flush()
        state = trainer.state
        policy_version = str(start_version + state.global_step)
        if status != "finished":
            record(status=status, ended_at=dt.datetime.now(dt.timezone.utc), policy_version=policy_version)
    final = output_dir / FINAL_DIR
    if main:
        # TRL's DPO copies the starting adapter as "ref" (its reference policy); the final adapter is the trained one.
        trained = [name for name in getattr(trainer.model, "peft_config", {}) if name != TRL_REF_ADAPTER]
        trainer.model.save_pretrained(final, **({"selected_adapters": trained} if trained else {}))
        tokenizer.save_pretrained(final)
        (final / STATS_FILE).write_text(json.dumps(describe(state), indent=2, default=str))
    record(status="finished", ended_at=dt.datetime.now(dt.timezone.utc), policy_version=policy_version)
    result = TrainResult(
        run_id=run_id,
        job_type=cfg.job_type,
        output_dir=output_dir,
        final_adapter=final,
        checkpoints=sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])),
        global_step=state.global_step,
        rows=len(dataset),
        dropped_rows=dropped,
        metrics=dict(metrics_cb.last_logs),
        lineage=read.lineage,
        policy_version=policy_version,
        serve_command=serve_command(base_model, cfg.adapter_name or f"halo-{cfg.job_type}", final.resolve(), cfg.lora_r),
        eval_command=eval_command(cfg.job_type, cfg.adapter_name or f"halo-{cfg.job_type}"),
        extra=extra,
    )
    log.info("%s run %s: %d steps, final adapter %s", cfg.job_type, run_id, state.global_step, final)
    log.debug("serve it: %s", result.serve_command)
    log.debug("evaluate it: %s", result.eval_command)
    return result
