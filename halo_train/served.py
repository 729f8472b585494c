"""What every loop over a served policy shares (online-grpo, mcts, ppo): its config, the engine, the run's record.

    from halo_train.served import ServedLoopConfig, open_engine, version_name
    with open_engine(cfg, Path("out/online")) as (engine, base_name):   # vLLM on a GPU, HALO's chat server on CPU
        engine.swap_adapter(version_name("online-20261206T120000", 1), "out/online/policy-1", retire=None)

A loop serves one policy version at a time under the name ``RUN-policy-{v}`` (``Served``, ``version_name``),
samples with it, trains, loads the new version and retires the old name. The run's id in the name keeps runs that
share one engine (``--engine-url``) from replacing each other's versions. ``open_engine`` starts the engine for the run
(``--serve``) or connects to one already running (``--engine-url``); ``start_record`` opens the run's
``runs`` row (a new run, or the one ``--resume`` continues, with the iterations it recorded);
``record_iteration`` adds an iteration to it and its metrics to ``train_metrics``; ``marks_status`` ends the
row finished, interrupted or failed. An update is ``learner_update`` (the persistent learner) or
``job_update`` (a training job, ``--learner jobs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

from halo_data.cli_support import key_values
from halo_data.lake import Lake
from halo_data.runs import RunRecord, existing_run, redact_mapping, upsert_runs, utc_now
from halo_train.config import LearnerOptions, TrainConfigError, _field, _looks_like_local_path, resolve_base_model

log = logging.getLogger(__name__)

LEARNERS = ("persistent", "jobs")  # one learner across the run's updates | a training job per update
_LEARNER = LearnerOptions()  # the persistent learner's defaults, one place for the CLI and the library


class OnlineError(TrainConfigError):
    """A loop over a served policy (an online run) that cannot start or go on as configured; one line that says what to do."""


@dataclasses.dataclass
class ServedLoopConfig:
    """What every loop over a served policy shares (online-grpo, mcts): the model, the engine, the tasks, the lake."""

    # What a --resume may give anew: how far the run goes, its engine, its progress bars, and where its lake and
    # folder are (it is found there). Every other option makes the run's data or its updates: a resumed run keeps
    # the ones it started with (start_record refuses others).
    RESUME_MAY_CHANGE: ClassVar[frozenset[str]] = frozenset({
        "iterations", "engine_url", "engine_wait", "serve", "engine", "vllm_args", "progress", "lake", "output_dir",
        "resume", "run_id"})

    base_model: str = _field("", "Base model folder, known model name (halo-train models) or hub id the engine serves and the updates train on.")
    env: str = _field("miniwob", "Environment (miniwob).")
    tasks: list = _field(["click-button"], "Tasks to train on, comma-separated.")
    iterations: int = _field(2, "Iterations (sample, update, reload) in all, counting those a resumed run already did.")
    engine_url: str | None = _field(None, "An OpenAI-compatible engine already running (vLLM with runtime LoRA, or HALO's chat server).")
    engine_wait: float = _field(60.0, "Seconds to wait for the engine to answer at the start.")
    serve: bool = _field(False, "Start the engine (--engine) on 127.0.0.1 for the run, wait until it serves, and stop it at the end.")
    engine: str = _field("auto", "The engine --serve starts: vllm (`vllm serve BASE --enable-lora ...`, a GPU) | chat (HALO's chat server, CPU) | auto (vllm where its command and a CUDA GPU are present, else chat).", choices=("auto", "chat", "vllm"))
    vllm_args: str = _field("", "More `vllm serve` options for --serve with vLLM, e.g. \"--max-model-len 8192 --gpu-memory-utilization 0.8\".")
    learner: str = _field(
        "persistent", "persistent: one learner keeps the model, adapter, optimizer, schedule and RNG across iterations and "
        "trains each update on every row it reads, --epochs-per-update times, checkpointed with each version "
        "(halo_train.learner). jobs: each update a separate training job from the newest adapter (a fresh "
        "optimizer, --train-steps steps, 2 by default, of --batch-size rows, the learning rate decaying to 0 inside it).",
        choices=LEARNERS)
    train_steps: int | None = _field(None, "A cap on each update's optimizer steps (default: none, every row is trained on; --learner jobs: 2).")
    epochs_per_update: int = _field(_LEARNER.epochs_per_update, "Persistent learner: passes over every row of an update.")
    mini_batch_size: int = _field(_LEARNER.mini_batch_size, "Persistent learner: rows per optimizer step (--mini-batch-size / --batch-size forward passes, gradients accumulated).")
    warmup_steps: int = _field(_LEARNER.warmup_steps, "Persistent learner: linear learning-rate warm-up over the run's first optimizer steps, then constant.")
    share_prompts: bool = _field(_LEARNER.share_prompts, "Persistent learner: keep a state's rows in one minibatch and run its prompt once for all of them (the same gradient, less work).")
    target_kl: float | None = _field(_LEARNER.target_kl, "Persistent learner: end an update early, before the step of the first minibatch whose approximate KL(current || sampling policy) passes 1.5 x this (Stable-Baselines3's target_kl; GRPO updates); 0: none, every row is trained on.")
    init_adapter: str | None = _field(None, "Warm start: a PEFT adapter folder (e.g. SFT) served as RUN-policy-0 and trained on.")
    lora_r: int = _field(16, "LoRA rank of a fresh adapter (a warm start keeps its own).")
    lora_alpha: int = _field(32, "LoRA alpha of a fresh adapter (scale = alpha / r; a warm start keeps its own).")
    batch_size: int = _field(_LEARNER.batch_size, "Rows per forward pass (the persistent learner accumulates --mini-batch-size of them per optimizer step; an update job, mcts: rows per optimizer step).")
    lora_dropout: float = _field(0.0, "Dropout on the LoRA branch during each update (0: the update's importance ratios compare the function that sampled, not a dropped-out one).")
    temperature: float = _field(1.0, "Sampling temperature (1 keeps the stored logprobs those of the sampling policy).")
    max_tokens: int = _field(64, "Most tokens an action may take.")
    coordinate_scale: float | None = _field(
        None, "A vision-language base model's coordinate grid (1000 for Qwen3-VL's 0..1000); pixels by default."
    )
    env_options: list = _field([], "Environment options, KEY=VALUE, comma-separated or repeated (--env-option KEY=VALUE, as halo-agent rollout takes them), e.g. success=full.")
    train_seed_start: int = _field(0, "First train task seed: iteration k trains on train_seed_start + k * N ... (online-grpo, N = --seeds-per-iteration), + k * task_seeds on (mcts).")
    seed: int = _field(0, "Seed of sampling and training.")
    lake: str = _field("lake", "Lake root.")
    progress: bool = _field(True, "Show progress bars.")

    def check_served_loop(self, error: type[Exception]) -> None:
        """The shared checks; ``error`` carries the line that says what to change."""
        if isinstance(self.tasks, str):
            self.tasks = [t.strip() for t in self.tasks.split(",") if t.strip()]
        if not self.base_model:
            raise error("give --base-model (a local model folder, a known model name or a hub id)")
        self.base_model = resolve_base_model(self.base_model, error)
        if not self.tasks:
            raise error("give --tasks, e.g. --tasks click-button")
        if isinstance(self.env_options, str):
            self.env_options = [o.strip() for o in self.env_options.split(",") if o.strip()]
        try:
            self.environment_options()
        except ValueError as e:
            raise error(f"--env-options {e}") from None
        if bool(self.engine_url) == bool(self.serve):
            raise error("give exactly one of --engine-url URL (an engine already running) or --serve (start one)")
        if self.engine_url and self.engine != "auto":
            raise error(f"--engine {self.engine} picks the engine --serve starts; --engine-url uses one already running: drop one of them")
        if self.serve and self.engine == "vllm":
            from halo_train.serve import ServeError, check_engine

            try:
                check_engine(self.engine)
            except ServeError as e:
                raise error(str(e)) from None
        if (self.serve or _looks_like_local_path(self.base_model)) and not Path(self.base_model).expanduser().is_dir():
            raise error(f"base model folder {self.base_model} does not exist: build one with `halo-train make-tiny-model {self.base_model}`")
        for name in ("iterations", "train_steps", "max_tokens", "batch_size"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.lora_dropout < 1:
            raise error(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.init_adapter and not (Path(self.init_adapter).expanduser() / "adapter_config.json").exists():
            raise error(f"--init-adapter {self.init_adapter} is not a PEFT adapter folder (no adapter_config.json)")
        if self.learner not in LEARNERS:
            raise error(f"--learner must be one of {', '.join(LEARNERS)}, got {self.learner!r}")
        try:
            self.target_kl = self.learner_options().target_kl  # --target-kl 0 is None, no guard, in the run's record
        except TrainConfigError as e:
            raise error(str(e)) from None

    def environment_options(self) -> dict[str, Any]:
        """--env-options as the environment's keyword options (success=full -> {"success": "full"})."""
        return key_values(self.env_options)

    def learner_options(self) -> LearnerOptions:
        """How the persistent learner trains each update of this loop (--epochs-per-update, --mini-batch-size, ...)."""
        return LearnerOptions(epochs_per_update=self.epochs_per_update, mini_batch_size=self.mini_batch_size,
                              batch_size=self.batch_size, max_steps=self.train_steps, warmup_steps=self.warmup_steps,
                              share_prompts=self.share_prompts, target_kl=self.target_kl)

    def job_steps(self) -> int | None:
        """An update's optimizer steps: the --train-steps cap (the persistent learner: none by default), 2 for a job."""
        return self.train_steps or (2 if self.learner == "jobs" else None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def version_name(run_id: str, version: int) -> str:
    """The name the engine serves run ``run_id``'s version ``version`` under (its folder is ``OUTPUT/policy-{v}``):
    unique to the run, so two runs on one engine never load, serve or unload each other's versions."""
    return f"{run_id}-policy-{version}"


@dataclasses.dataclass
class Served:
    """What the engine serves now: the request name (None: the base model) and its version."""

    name: str | None
    version: int
    path: str | None = None

    @classmethod
    def version_of(cls, run_id: str, version: int, path: str | Path) -> "Served":
        """Version ``version`` of run ``run_id``, its adapter in ``path``, under the run's name for it."""
        return cls(version_name(run_id, version), version, str(path))


@dataclasses.dataclass
class OnlineSummary:
    run_id: str
    iterations: list[dict[str, Any]]
    served: str | None  # the engine's name for the version served at the end (None: the base model)
    seconds: float
    served_path: str | None = None  # that version's adapter folder

    def describe(self, engine_url: str | None) -> str:
        """The run's last line: its iterations and the version it ends with, where the engine still serves it
        (``--engine-url``) or served it last (``--serve`` stops the engine with the run)."""
        version = f"{self.served} ({self.served_path})" if self.served else "the base model"
        where = f"{engine_url} serves" if engine_url else "last served"
        count = f"{len(self.iterations)} iteration{'' if len(self.iterations) == 1 else 's'}"
        return f"run {self.run_id}: {count}; {where} {version}"


@contextlib.contextmanager
def marks_status(lake: Lake, latest: Callable[[], RunRecord]) -> Iterator[None]:
    """The run's row (``latest()``, as it stands when the body ends) ends finished, interrupted (Ctrl-C) or failed."""
    status = "failed"
    try:
        yield
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        upsert_runs(lake, [latest().replace(status=status, ended_at=utc_now())])


def record_iteration(lake: Lake, record: RunRecord, cfg, iterations: list[dict[str, Any]], it: dict[str, Any], served: Served) -> RunRecord:
    """Add iteration ``it`` to the run's ``runs`` row (with the version served after it) and its metrics to ``train_metrics``."""
    iterations.append(it)
    record = record.replace(adapter=served.name, policy_version=str(served.version),
                            config={**cfg.to_dict(), "iterations": iterations}, lineage=it.get("lineage") or record.lineage)
    upsert_runs(lake, [record])
    _write_metrics(lake, record.run_id, it["iteration"], it["metrics"])
    return record


def _write_metrics(lake: Lake, run_id: str, step: int, metrics: dict[str, float]) -> None:
    """The iteration's metrics, once: a resumed run that recorded them already writes nothing."""
    from halo_data.writer import append_rows
    from halo_train.metrics import metric_rows

    have = lake.query_arrow("select count(*) from train_metrics where run_id = $r and step = $s", {"r": run_id, "s": step})
    if have.column(0)[0].as_py():
        return
    append_rows(lake, "train_metrics", metric_rows(run_id, step, None, metrics))


# ---------------------------------------------------------------------------------------- starting and resuming

STATE_FILE = "online_run.json"  # OUTPUT/online_run.json: the loop's run id, so --resume finds the run


def loop_run_id(cfg, out: Path, prefix: str, error: type[Exception]) -> str:
    """The run's id: ``--run-id``, the one ``OUTPUT/online_run.json`` names (``--resume``), or ``PREFIX-<UTC time>``."""
    state = out / STATE_FILE
    if cfg.resume and cfg.run_id is None:
        if not state.exists():
            raise error(f"nothing to resume in {out}: no {STATE_FILE} (start the run without --resume)")
        return json.loads(state.read_text())["run_id"]
    if not cfg.resume and any(out.glob("policy-*")):
        # A new run would adopt another run's saved versions as its own.
        raise error(f"{out} already holds policy-* adapters of another run: pass --resume, or choose another --output-dir")
    return cfg.run_id or f"{prefix}-{utc_now().strftime('%Y%m%dT%H%M%S')}"


def start_record(cfg, lake: Lake, run_id: str, job_type: str, source_view: str,
                 error: type[Exception]) -> tuple[RunRecord, list[dict[str, Any]]]:
    """The run's ``runs`` row, marked running, and the iterations it has recorded (none for a new run); once the run
    is known good, ``OUTPUT/online_run.json`` names it for a later ``--resume``."""
    existing = existing_run(lake, run_id)
    if existing is not None and not cfg.resume:
        raise error(f"run {run_id!r} already exists in {cfg.lake}: pass --resume to continue it, or choose another --run-id")
    if existing is None and cfg.resume:
        raise error(f"run {run_id!r} is not in {cfg.lake}: start it without --resume")
    if existing is not None:
        _check_resumed_options(cfg, json.loads(existing.get("config") or "{}"), run_id, error)
    iterations = json.loads(existing.get("config") or "{}").get("iterations", []) if existing else []
    for it in iterations:  # a recorded adapter that is gone cannot be served or continued from
        path = it["served_after"]["path"]
        if path and not Path(path).exists():
            raise error(f"iteration {it['iteration']}'s adapter {path} is gone: restore it, or start a new run")
    record = RunRecord(
        run_id=run_id, kind="train", mode=job_type, job_type=job_type, env=cfg.env, policy="openai",
        base_model=cfg.base_model, model=cfg.base_model, config={**cfg.to_dict(), "iterations": iterations},
        command=list(sys.argv), status="running", output_dir=str(Path(cfg.output_dir).resolve()),
        started_at=existing["started_at"] if existing else utc_now(), source_view=source_view,
    )
    upsert_runs(lake, [record])
    (Path(cfg.output_dir) / STATE_FILE).write_text(json.dumps({"run_id": run_id, "lake": str(cfg.lake)}))
    if iterations:  # killed after recording the iteration and before writing its metrics: write them now
        _write_metrics(lake, run_id, iterations[-1]["iteration"], iterations[-1]["metrics"])
    return record, iterations


def _check_resumed_options(cfg, recorded: dict[str, Any], run_id: str, error: type[Exception]) -> None:
    """A resumed run goes on as it started: each option outside ``RESUME_MAY_CHANGE`` that the run's record holds
    (a record older than an option holds none of it) must be the recorded value."""
    given = json.loads(json.dumps(redact_mapping(cfg.to_dict()), sort_keys=True, default=str))  # as the record stores it
    changed = [name for name in sorted(recorded)
               if name in given and name not in cfg.RESUME_MAY_CHANGE and given[name] != recorded[name]]
    if changed:
        shown = ", ".join(f"{_as_option(name, given[name])} (it started with {_as_option(name, recorded[name])})"
                          for name in changed)
        raise error(f"--resume continues run {run_id!r} with the options it started with: {shown}; give those, or start a new run")


def _as_option(name: str, value: Any) -> str:
    """An option's value as the command line gives it: ``--group-size 4``, ``--no-share-prompts``, ``no --train-steps``."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    if value is None:  # --target-kl's "none" is 0 on the command line (its default is a target)
        return f"--{flag} 0" if name == "target_kl" else f"no --{flag}"
    return f"--{flag} {','.join(map(str, value)) if isinstance(value, list) else value}"


def _warm_start(cfg: ServedLoopConfig, run_id: str) -> Served | None:
    return Served.version_of(run_id, 0, Path(cfg.init_adapter).expanduser().resolve()) if cfg.init_adapter else None


def serve_start(engine, cfg, run_id: str, iterations: list[dict[str, Any]], error: type[Exception]) -> Served:
    """Load the version to sample with first: the last one served by a resumed run, else the warm start, else the base."""
    if iterations:
        last = iterations[-1]["served_after"]
        start = Served(last["name"], int(last["version"]), last["path"])
    else:
        start = _warm_start(cfg, run_id) or Served(None, 0)
    if start.name and start.name not in engine.models():
        swap = engine.swap_adapter(start.name, start.path)
        if not swap.loaded:
            raise error(swap.message)
    return start


def resumed_line(run_id: str, iterations: list[dict[str, Any]], total: int, served: Served) -> str:
    """What a --resume goes on from: the iterations recorded (a kill may have come before the last one's line was
    printed) and the version it samples with."""
    done = len(iterations)
    todo = f"{total - done} more to do" if total > done else f"none more to do at --iterations {total}"
    return (f"resuming run {run_id}: iterations 0-{done - 1} recorded, {todo}, "
            f"serving {served.name or 'the base model'}")


def latest_adapter(cfg, run_id: str, iterations: list[dict[str, Any]]) -> Served:
    """The newest trained version: what the next update starts from."""
    for it in reversed(iterations):
        if it.get("adapter"):
            version = int(Path(it["adapter"]).name.rsplit("-", 1)[1])
            return Served.version_of(run_id, version, it["adapter"])
    return _warm_start(cfg, run_id) or Served(None, 0)


# ---------------------------------------------------------------------------------------- the engine


@contextlib.contextmanager
def open_engine(cfg: ServedLoopConfig, out: Path) -> Iterator[tuple[Any, str]]:
    """An engine client and the base model's served name; with --serve, the engine --engine picks (vLLM on a GPU,
    HALO's chat server on CPU) started and stopped here, its output in ``OUTPUT/engine.log``."""
    from halo_agent.serving import EngineClient, EngineError

    with contextlib.ExitStack() as stack:
        url = cfg.engine_url or stack.enter_context(_started_engine(cfg, out / "engine.log"))
        engine = EngineClient(url)
        try:
            engine.wait_ready(timeout=cfg.engine_wait)
            cards = engine.models()
        except EngineError as e:
            raise OnlineError(str(e)) from None
        bases = [name for name, card in cards.items() if not card.get("parent")]
        if not bases:
            raise OnlineError(f"the engine at {url} lists no base model")
        yield engine, bases[0]


VLLM_START_SECONDS = 900.0  # vLLM loads the model and captures CUDA graphs before it answers: give it minutes


@contextlib.contextmanager
def _started_engine(cfg, log_path: Path) -> Iterator[str]:
    """The engine --serve starts (``--engine``; loops without the option get HALO's chat server); yields its URL."""
    from halo_train import serve

    engine = serve.pick_engine(getattr(cfg, "engine", "chat"))
    try:
        serve.check_engine(engine)
    except serve.ServeError as e:
        raise OnlineError(str(e)) from None
    if engine != "vllm":
        with _chat_server(cfg.base_model, log_path) as url:
            yield url
        return
    with _vllm_server(cfg, log_path) as url:
        yield url


def vllm_spec(cfg, port: int) -> Any:
    """The ``vllm serve`` an online loop needs: no adapter preloaded, room for two loaded at runtime (the next
    version is loaded before the serving one is unloaded), ranks up to the fresh adapter's --lora-r or the
    warm start's own, and --vllm-args."""
    import shlex

    from halo_train.serve import ServeSpec, adapter_rank

    ranks = [int(getattr(cfg, "lora_r", 16))]
    init = getattr(cfg, "init_adapter", None)
    if init:
        ranks.append(adapter_rank(str(Path(init).expanduser())))
    return ServeSpec(str(cfg.base_model), {}, port=port, engine="vllm", runtime_loras=2, runtime_ranks=tuple(ranks),
                     extra_args=tuple(shlex.split(getattr(cfg, "vllm_args", "") or "")))


@contextlib.contextmanager
def _vllm_server(cfg, log_path: Path) -> Iterator[str]:
    """``vllm serve`` on 127.0.0.1 (a free port) in its own process group with runtime LoRA updating on; yields its
    URL once GET /v1/models answers, and ends that process group after."""
    from halo_train import serve

    spec = vllm_spec(cfg, serve.free_port())
    try:
        with serve.running(spec, log_path, wait=max(float(cfg.engine_wait), VLLM_START_SECONDS)) as state:
            yield state["url"]
    except serve.ServeError as e:
        raise OnlineError(str(e)) from None


@contextlib.contextmanager
def _chat_server(base_model: str, log_path: Path) -> Iterator[str]:
    """HALO's chat server on 127.0.0.1 (a free port) in a child process; yields its URL, stops it after."""
    from halo_train.serve import chat_server_command

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as errors:
        proc = subprocess.Popen(
            chat_server_command(base_model, {}, 0, parent_pid=os.getpid()),  # a loop killed with -9 leaves no server behind
            stdout=subprocess.PIPE, stderr=errors, text=True,
        )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if " at " not in line:
            proc.wait(timeout=30)
            tail = log_path.read_text(errors="replace").strip().splitlines()
            raise OnlineError(f"the chat server did not start: {tail[-1] if tail else f'exit code {proc.returncode}'}")
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def learner_update(cfg: ServedLoopConfig, lake: Lake, train: Any, trained: Served, final: Path, source_view: str) -> None:
    """Update v+1 with the run's persistent learner (``halo_train.learner``) on what ``train`` (a GRPOConfig or a
    DPOConfig) reads; the adapter, its learner state and training_stats.json into ``final``, renamed in when complete.

    ``update_seconds`` is wall time, ``update_cpu_seconds`` this process's CPU time over the same span. The
    update's own run (``train.run_id``) is recorded before its version folder exists: its lineage (the table
    versions it read) and one metrics row per optimizer step. A kill in between retrains the same update from the
    same learner state, and writes nothing twice."""
    import datetime as dt
    import time

    from halo_data.writer import append_rows
    from halo_train.config import base_model_path
    from halo_train.learner import held_learner
    from halo_train.metrics import metric_rows, record_run
    from halo_train.trainer_utils import STATS_FILE

    t0, cpu0 = time.perf_counter(), time.process_time()
    options = cfg.learner_options()
    template = dataclasses.replace(train, init_adapter=None, seed=cfg.seed, run_id=None, runs=None, where=None)
    learner, load_seconds = held_learner(str(Path(cfg.output_dir).resolve()), template, options, trained.version, trained.path)
    started = dt.datetime.now(dt.timezone.utc)
    result = learner.update(train)
    t1 = time.perf_counter()
    metrics = {**result.metrics, "update_load_seconds": load_seconds,
               **{k: float(result.extra[k]) for k in ("anchor_groups_with_spread", "step_advantage_share") if k in result.extra}}
    stats = {
        "job_type": train.job_type, "learner": "persistent", "run_id": train.run_id, "policy_version": str(learner.version),
        "source_view": source_view, "where": train.where, "view_params": train.view_params(), "runs": train.scoped_runs(),
        "learner_step": learner.step, "lineage": result.lineage, "rows": result.rows, "optimizer_steps": result.optimizer_steps,
        "config": train.to_dict(), "metrics": result.metrics, "update_metrics": metrics, **result.extra,
    }
    record_run(lake, run_id=train.run_id, job_type=train.job_type, base_model=base_model_path(cfg.base_model),
               config_json=train.to_json(), source_view=source_view, lineage=result.lineage, output_dir=str(final.resolve()),
               started_at=started, adapter=final.name, policy_version=str(learner.version), status="finished",
               ended_at=dt.datetime.now(dt.timezone.utc))
    have = lake.query_arrow("select count(*) from train_metrics where run_id = $r", {"r": train.run_id}).column(0)[0].as_py()
    if not have:
        first = learner.step - len(result.step_log) + 1
        append_rows(lake, "train_metrics", [row for i, entry in enumerate(result.step_log)
                                            for row in metric_rows(train.run_id, first + i, None, entry)])

    def final_stats() -> str:  # once the adapter and learner state are written: the folder appears with its seconds
        metrics["update_save_seconds"] = time.perf_counter() - t1
        metrics["update_seconds"] = time.perf_counter() - t0
        # CPU seconds of this process (every thread): what the update cost, whatever else the machine was doing.
        metrics["update_cpu_seconds"] = time.process_time() - cpu0
        stats.update(update_seconds=metrics["update_seconds"], update_metrics=metrics)
        return json.dumps(stats, indent=2, default=str)

    learner.save(final, {STATS_FILE: final_stats})


def update_version(cfg: ServedLoopConfig, lake: Lake, train: Any, trained: Served, final: Path, source_view: str,
                   error: type[Exception]) -> dict[str, Any]:
    """Version v+1 into ``final`` from ``trained`` on what ``train`` reads, by ``--learner`` (``learner_update`` or
    ``job_update``); a folder a killed run already saved is adopted, not trained again. Its training_stats.json;
    a folder another run trained is refused with ``error``."""
    from halo_train.trainer_utils import STATS_FILE

    if not (final / STATS_FILE).exists():
        if cfg.learner == "persistent":
            learner_update(cfg, lake, train, trained, final, source_view)
        else:
            job_update(train, final)
    stats = json.loads((final / STATS_FILE).read_text())
    if stats.get("run_id") != train.run_id:
        raise error(f"{final} was trained by {stats.get('run_id')}, not by this run: choose another --output-dir")
    return stats


def job_update(train: Any, final: Path) -> None:
    """``--learner jobs``: one training job (``halo-train grpo`` for a GRPOConfig, ``halo-train dpo`` for a DPOConfig)
    from the newest adapter, its final adapter renamed to ``final`` with what the update did in training_stats.json
    (``update_metrics``: the rows it trained, its optimizer steps, how far it moved the adapter, its seconds), as the
    persistent learner reports it."""
    import shutil
    import time

    from halo_train.learner import adapter_lora_weights, displacement
    from halo_train.trainer_utils import STATS_FILE

    if train.job_type == "dpo":
        from halo_train.dpo import train_dpo as run
    else:
        from halo_train.grpo import train_grpo as run
    staging = Path(train.output_dir)
    t0, cpu0 = time.perf_counter(), time.process_time()
    run(train)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    stats = json.loads((staging / "final" / STATS_FILE).read_text())
    now = adapter_lora_weights(staging / "final")
    before = adapter_lora_weights(train.init_adapter) if train.init_adapter else None
    steps = int(stats.get("global_step") or 0)
    stats["update_seconds"] = seconds
    stats["update_metrics"] = {
        "update_seconds": seconds,
        "update_cpu_seconds": cpu_seconds,
        "rows_trained": float(min(int(stats.get("rows") or 0), steps * train.batch_size * train.gradient_accumulation_steps)),
        "optimizer_steps": float(steps),
        "displacement_from_base": displacement(now),
        "displacement_from_previous": displacement(now, before) if before else displacement(now),
        **{k: float(stats[k]) for k in ("anchor_groups_with_spread", "step_advantage_share") if k in stats},
    }
    (staging / "final" / STATS_FILE).write_text(json.dumps(stats, indent=2, default=str))
    # A rename is atomic: policy-{v} exists only once it is complete, which is what --resume trusts.
    (staging / "final").rename(final)
    shutil.rmtree(staging, ignore_errors=True)
