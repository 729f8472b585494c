"""``halo-train``: BC, DPO and GRPO jobs over the lake's views; merging adapters; a tiny test model.

    halo-train bc   --lake lake --base-model models/tiny --max-steps 5 --output-dir out/bc
    halo-train dpo  --lake lake --base-model models/tiny --max-steps 5 --output-dir out/dpo
    halo-train grpo --lake lake --base-model models/tiny --max-steps 5 --output-dir out/grpo
    halo-train merge --adapter out/dpo/final --output models/dpo-merged
    halo-train mcts --tasks click-button-sequence --base-model models/tiny --serve --output-dir out/mcts
    halo-train make-tiny-model models/tiny --warmup-lake lake
    halo-train make-tiny-model --vision models/tiny-vlm
    halo-train quickstart                    # rollouts -> lake -> views -> tiny model -> bc, dpo, grpo

Each job's options come from its config dataclass (``halo_train.config``), and
``--config FILE.yaml`` loads the same names from a file; options given on the
command line win over the file.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import types
import typing
from typing import Any, Callable

import click

from halo_data.cli_support import (CONTEXT_SETTINGS, LAKE_OPTION, fail, run_cli, script_command, short_openmp_spin,
                                   version_option)
from halo_data.lake import LakeError
from halo_train.serve import DEFAULT_STATE_DIR
from halo_train.config import CONFIGS, TrainConfig, load_config

log = logging.getLogger(__name__)


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (click's test runner swaps it), on a line
    of its own above a running progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def _setup_logging(level: int | None = None) -> None:
    """HALO's own lines on stderr while the command runs: INFO by default, DEBUG (each trainer
    log dict too) with -v. Undone when the command ends, for a caller in the same process."""
    root = click.get_current_context().find_root()
    if level is None:
        level = logging.DEBUG if root.params.get("verbose") else logging.INFO
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    for logger in (logging.getLogger("halo_train"), logging.getLogger("halo_data")):
        logger.addHandler(handler)
        root.call_on_close(functools.partial(_restore, logger, handler, logger.level))
        logger.setLevel(level)


def _restore(logger: logging.Logger, handler: logging.Handler, level: int) -> None:
    logger.removeHandler(handler)
    logger.setLevel(level)


def _option_for(field: dataclasses.Field, hint: Any) -> Callable:
    """A click option for one config field; every default is None so a --config file's values survive."""
    name = "--" + field.name.replace("_", "-")
    help_text = field.metadata.get("help", "")
    default = field.default if field.default is not dataclasses.MISSING else (
        field.default_factory() if field.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
    )
    if isinstance(default, list):
        default = ",".join(map(str, default))
    if default not in (None, "", {}):
        help_text += f"  [default: {default}]"
    origin_args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else (hint,)
    base = next((a for a in origin_args if a is not type(None)), str)
    if field.name == "params":  # --set, as in halo-data query and export (-p there is a SQL parameter)
        return click.option("--set", "params", multiple=True, metavar="NAME=VALUE", help=help_text)
    if field.name == "env_options":  # comma-separated, or repeated as halo-agent rollout takes them (--env-option K=V)
        return click.option(name, "--env-option", "env_options", multiple=True, metavar="KEY=VALUE[,KEY=VALUE]",
                            callback=lambda ctx, param, given: ",".join(given) if given else None, help=help_text)
    if base is bool:
        return click.option(f"{name}/--no-{field.name.replace('_', '-')}", default=None, help=help_text)
    choices = field.metadata.get("choices")
    if choices:
        return click.option(name, type=click.Choice(choices), default=None, help=help_text)
    click_type = {int: int, float: float}.get(base, str)
    return click.option(name, type=click_type, default=None, help=help_text)


def _job_command(job_type: str, train: Callable[[TrainConfig], Any], cls: type[TrainConfig] | None = None) -> click.Command:
    cls = cls or CONFIGS[job_type]
    hints = typing.get_type_hints(cls)

    @run_cli
    def command(config: str | None, old_params: tuple[str, ...], **options: Any) -> None:
        _setup_logging()
        if old_params:
            log.warning("--param is deprecated: write --set %s", " --set ".join(old_params))
            options["params"] = (*options.get("params", ()), *old_params)
        if not options.get("params"):
            options.pop("params", None)
        cfg = load_config(cls, config, overrides=options)
        result = train(cfg)
        from halo_train.trainer_utils import is_main_process  # imports transformers: only once a job has run

        if not is_main_process():  # `accelerate launch`: rank 0 reports for all
            return
        metrics_sql = f"select step, metric, value from train_metrics where run_id = '{result.run_id}'"
        click.echo(f"run {result.run_id}: {result.global_step} steps on {result.rows} rows of {cfg.view}")
        click.echo(f"adapter: {result.final_adapter}")
        click.echo(f"serve:    {result.serve_command}")
        click.echo(f"evaluate: {result.eval_command}")
        click.echo(f"metrics:  {script_command('halo-data', 'query', metrics_sql, '--lake', cfg.lake)}")

    command.__doc__ = cls.__doc__
    for field in reversed(dataclasses.fields(cls)):
        command = _option_for(field, hints[field.name])(command)
    command = click.option("--param", "old_params", multiple=True, hidden=True)(command)  # the old name of --set
    command = click.option("--config", type=click.Path(dir_okay=False), default=None,
                           help="YAML (or JSON) file with these options; command-line options win.")(command)
    return click.command(job_type, help=cls.__doc__)(command)


@click.group(context_settings=CONTEXT_SETTINGS)
@version_option()
@click.option("-v", "--verbose", is_flag=True, help="Show every trainer log line (they are always in train_metrics).")
def main(verbose: bool) -> None:
    """HALO training jobs: LoRA adapters from the lake's views, metrics back into the lake."""
    short_openmp_spin()  # before a job imports torch


def _train(job_type: str) -> Callable[[TrainConfig], Any]:
    def train(cfg: TrainConfig) -> Any:
        import halo_train

        return getattr(halo_train, f"train_{job_type}")(cfg)

    return train


for _job in ("bc", "dpo", "grpo"):
    main.add_command(_job_command(_job, _train(_job)))


def _train_ppo(cfg: TrainConfig) -> Any:
    from halo_train.ppo import train_ppo

    return train_ppo(cfg)


def _ppo_command() -> click.Command:
    from halo_train.ppo import PPOConfig

    return _job_command("ppo", _train_ppo, PPOConfig)


main.add_command(_ppo_command())


@main.command("merge")
@click.option("--adapter", required=True, type=click.Path(), help="Adapter folder (OUTPUT_DIR/final or a checkpoint).")
@click.option("--output", required=True, type=click.Path(), help="Folder for the merged model (new or empty).")
@click.option("--base-model", default=None, help="Base model; the one named in adapter_config.json by default.")
@run_cli
def merge_command(adapter: str, output: str, base_model: str | None) -> None:
    """Merge a LoRA adapter into its base model and save a plain model folder."""
    from halo_train.merge import merge_adapter

    _setup_logging()
    out = merge_adapter(adapter, output, base_model)
    click.echo(f"merged model: {out}")
    click.echo(f"serve:    vllm serve {out}")


@main.command("make-tiny-model")
@click.argument("out", type=click.Path())
@click.option("--warmup-lake", default=None, help="Fine-tune briefly on this lake's bc_rows so outputs parse as actions.")
@click.option("--steps", default=60, show_default=True, help="Warm-up optimizer steps.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights.")
@click.option("--hidden-size", type=click.IntRange(min=8), default=64, show_default=True, help="Width of the model (heads: 4).")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="Transformer layers.")
@click.option("--vocab-size", type=click.IntRange(min=300), default=512, show_default=True, help="BPE vocabulary size.")
@click.option("--warmup-top-percent", type=click.FloatRange(min=0, min_open=True, max=100), default=None,
              help="bc_rows' top-percent cut for the warm-up (100: every valid step, whatever the outcome).")
@click.option("--vision", is_flag=True, help="A tiny Qwen2-VL-style vision-language model and processor instead.")
@run_cli
def make_tiny_model_command(out: str, warmup_lake: str | None, steps: int, seed: int, hidden_size: int, layers: int,
                            vocab_size: int, warmup_top_percent: float | None, vision: bool) -> None:
    """Build a tiny Qwen2-style model (or, with --vision, Qwen2-VL-style VLM) and its tokenizer locally (seconds on CPU; no download)."""
    from halo_train.tiny_model import build_tiny_model

    _setup_logging()
    if steps < 1:
        raise LakeError(f"--steps must be at least 1, got {steps}")
    if vision:
        from halo_train.tiny_vlm import build_tiny_vlm

        if warmup_lake is not None:
            raise LakeError("--warmup-lake warms up the text model only: train the VLM with `halo-train bc` instead")
        click.echo(f"tiny VLM: {build_tiny_vlm(out, seed=seed)}")
        return
    if hidden_size % 4:
        raise LakeError(f"--hidden-size must be a multiple of 4 (the model has 4 heads), got {hidden_size}")
    path = build_tiny_model(out, warmup_lake=warmup_lake, steps=steps, seed=seed, hidden_size=hidden_size, layers=layers,
                            vocab_size=vocab_size, top_percent=warmup_top_percent)
    click.echo(f"tiny model: {path}")


@main.command("models")
@click.option("--fetch", "fetch", multiple=True, metavar="NAME",
              help="Convert this known model into the cache now (once; later uses load the folder). Repeatable; 'all' for every one.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model instead of a table.")
@run_cli
def models_command(fetch: tuple[str, ...], as_json: bool) -> None:
    """Known models by name (--base-model / --model NAME): source, licence, size, and whether each is cached and where."""
    import json

    from halo_agent.models import KNOWN_MODELS, describe_models, ensure_model

    names = list(KNOWN_MODELS) if "all" in fetch else list(dict.fromkeys(fetch))
    unknown = [n for n in names if n not in KNOWN_MODELS]
    if unknown:
        fail(f"unknown model {unknown[0]!r}: known models are {', '.join(KNOWN_MODELS)}")
    if names:
        _setup_logging()
    for name in names:
        ensure_model(KNOWN_MODELS[name])
    rows = describe_models()
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    table = [("NAME", "SOURCE", "LICENCE", "SIZE", "CACHED")]
    for row in rows:
        cached = f"yes: {row['folder']} ({row['folder_bytes'] / 1e6:.0f} MB)" if row["cached"] else f"no (would go to {row['folder']})"
        table.append((row["name"], row["source"], row["licence"], f"{row['download_bytes'] / 1e6:.0f} MB", cached))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


@main.command()
@LAKE_OPTION
@click.option("--output-dir", default="out/quickstart", show_default=True, help="Where the tiny model and adapters go.")
@click.option("--tasks", "task_list", default=None,
              help="Comma-separated MiniWoB++ tasks (default: six click/focus tasks; with --model: click-collapsible).")
@click.option("--rollouts-per-task", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--run-id", default="quickstart", show_default=True, help="Rollout run id (resumed when it exists).")
@click.option("--warmup-steps", type=click.IntRange(min=1), default=60, show_default=True,
              help="SFT warm-up steps of the tiny model.")
@click.option("--train-steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Optimizer steps of each training job.")
@click.option("--jobs", default="bc,dpo,grpo", show_default=True, help="Training jobs to run.")
@click.option("--model", default=None, help="A real model instead (a known name, see `halo-train models`, or a folder): "
              "its zero-shot rollouts, BC on its successes, the adapter on held-out seeds beside zero-shot and random.")
@click.option("--task-seeds", type=click.IntRange(min=1), default=None, help="With --model: train task seeds per task (default 32).")
@click.option("--eval-seeds", type=click.IntRange(min=1), default=None, help="With --model: held-out task seeds per task (default 32).")
@click.pass_context
@run_cli
def quickstart(ctx: click.Context, lake_path: str, task_list: str | None, jobs: str, model: str | None, task_seeds: int | None,
               eval_seeds: int | None, **options: Any) -> None:
    """The main job, offline: MiniWoB++ rollouts -> lake -> views -> a short training run -> a summary."""
    from halo_train.quickstart import DEFAULT_TASKS, QuickstartConfig, run_quickstart

    if model is not None:
        return _model_quickstart(ctx, model, lake_path, task_list, task_seeds, eval_seeds, options)
    if task_seeds is not None or eval_seeds is not None:
        fail("--task-seeds and --eval-seeds go with --model")
    job_names = tuple(j.strip() for j in jobs.split(",") if j.strip())
    unknown = [j for j in job_names if j not in ("bc", "dpo", "grpo")]
    if unknown:
        fail(f"unknown training job(s) {', '.join(unknown)}: use bc, dpo and/or grpo")
    verbose = bool(ctx.find_root().params.get("verbose"))
    _setup_logging(logging.DEBUG if verbose else logging.WARNING)
    if not verbose:
        _quiet_libraries()
    tasks = tuple(t.strip() for t in (task_list or "").split(",") if t.strip()) or DEFAULT_TASKS
    cfg = QuickstartConfig(lake=lake_path, tasks=tasks, jobs=job_names, **options)
    run_quickstart(cfg, echo=click.echo)


def _model_quickstart(ctx: click.Context, model: str, lake_path: str, task_list: str | None, task_seeds: int | None,
                      eval_seeds: int | None, options: dict[str, Any]) -> None:
    """``quickstart --model``: the options given on the command line; the real model's own defaults for the rest."""
    from halo_train.quickstart_model import ModelQuickstartConfig, run_model_quickstart

    given = {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    for name in ("warmup_steps", "jobs"):
        if name in given:
            fail(f"--{name.replace('_', '-')} belongs to the tiny model's quickstart: with --model it trains BC on the model's successes")
    chosen = {k: v for k, v in options.items() if k in given}
    if task_list:
        chosen["tasks"] = tuple(t.strip() for t in task_list.split(",") if t.strip())
    chosen.update({k: v for k, v in (("task_seeds", task_seeds), ("eval_seeds", eval_seeds)) if v is not None})
    verbose = bool(ctx.find_root().params.get("verbose"))
    _setup_logging(logging.DEBUG if verbose else logging.WARNING)
    if not verbose:
        _quiet_libraries()
    run_model_quickstart(ModelQuickstartConfig(model=model, lake=lake_path, **chosen), echo=click.echo)


def _loop_command(name: str, config_cls: type, run: Callable[..., Any], help_text: str) -> click.Command:
    """A command for a loop over the served policy (online-grpo, mcts): options from its config dataclass."""
    hints = typing.get_type_hints(config_cls)

    @click.pass_context
    @run_cli
    def command(ctx: click.Context, **options: Any) -> None:
        verbose = bool(ctx.find_root().params.get("verbose"))
        _setup_logging(logging.DEBUG if verbose else logging.WARNING)
        if not verbose:
            _quiet_libraries()
        cfg = config_cls(**{k: v for k, v in options.items() if v is not None})
        summary = run(cfg, echo=click.echo)
        metrics_sql = f"select step, metric, value from train_metrics where run_id = '{summary.run_id}' order by step, metric"
        click.echo(summary.describe(cfg.engine_url))
        click.echo(f"metrics:  {script_command('halo-data', 'query', metrics_sql, '--lake', cfg.lake)}")

    for field in reversed(dataclasses.fields(config_cls)):
        command = _option_for(field, hints[field.name])(command)
    return click.command(name, help=help_text)(command)


def _online_command() -> click.Command:
    from halo_train.online import OnlineConfig, run_online

    return _loop_command("online-grpo", OnlineConfig, run_online, ONLINE_HELP)


def _mcts_command() -> click.Command:
    from halo_train.mcts import MCTSConfig, run_mcts

    return _loop_command("mcts", MCTSConfig, run_mcts, MCTS_HELP)


ONLINE_HELP = """Online GRPO: sample with the served policy version, land the steps in the lake, update from
grpo_groups (dr_grpo), save OUTPUT/policy-{v+1}, reload it into the engine as RUN-policy-{v+1}, repeat.

Iteration k trains on task seeds --train-seed-start + k * N ... (N = --seeds-per-iteration); held-out
seeds start at --eval-seed-start and must lie past them (checked). --group-by episode (default): a group is the --group-size
attempts of one task seed. --group-by state: at each visited state the policy samples
--candidates-per-state actions (8) in one call, each is executed from the state restored by replay
and scored with the dense reward, and the update reads these per-state groups (state_groups); a
state that does not reproduce is left out. --serve starts the engine and stops it at the end:
`vllm serve BASE --enable-lora --max-loras 2 --max-lora-rank R` (runtime LoRA updating on) where
a GPU and vLLM are present, else HALO's chat server (--engine picks). --pipeline overlaps
iteration k+1's rollout with iteration k's update."""


MCTS_HELP = """The Agent Q loop: search every task seed with the served policy version (MCTS, K candidates per
call, critic progress, policy or a served model), whole trees into mcts_nodes; DPO on the run's
mcts pairs (stored generation logprobs as the reference); save OUTPUT/policy-{v+1}, reload it into
the engine as RUN-policy-{v+1}, search again. --serve starts the engine (--engine: vLLM on a GPU, HALO's chat server on CPU)."""


def _quiet_libraries() -> None:
    """The quickstart's output is its progress bars, one line per job and the summary: the
    libraries' own progress bars, notices and warnings about their internals are not."""
    import os
    import warnings

    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


main.add_command(_online_command())
main.add_command(_mcts_command())


def _experiment_group() -> click.Group:
    from halo_train.experiment.cli import experiment

    return experiment


main.add_command(_experiment_group())


@main.command("serve", context_settings={"ignore_unknown_options": False})
@click.option("--base-model", default=None, help="Base model folder, known model name (halo-train models) or hub id the engine serves.")
@click.option("--adapters", "adapters", multiple=True, metavar="NAME=DIR [NAME=DIR ...]",
              help="LoRA adapter folders, served (and selected by requests) under NAME.")
@click.argument("more_adapters", nargs=-1, metavar="")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="vLLM's bind address (0.0.0.0 for other machines).")
@click.option("--engine", type=click.Choice(["auto", "vllm", "chat"]), default="auto", show_default=True,
              help="auto: vllm where it is installed and a GPU is present, else HALO's chat server.")
@click.option("--vllm-args", default="", help="More `vllm serve` options, e.g. \"--max-model-len 8192\".")
@click.option("--wait", type=float, default=600, show_default=True, help="Seconds to wait for the engine to answer.")
@click.option("--state-dir", default=str(DEFAULT_STATE_DIR), show_default=True,
              help="Where the pid file and log of each port's engine go.")
@click.option("--dry-run", is_flag=True, help="Print the engine's command line and exit.")
@click.option("--stop", is_flag=True, help="End the engine started on --port (only that one).")
@run_cli
def serve_command(base_model: str | None, adapters: tuple[str, ...], more_adapters: tuple[str, ...], port: int, host: str,
                  engine: str, vllm_args: str, wait: float, state_dir: str, dry_run: bool, stop: bool) -> None:
    """Serve a base model and LoRA adapters in the background: vLLM on a GPU, HALO's chat server on CPU."""
    import shlex

    from halo_train import serve

    if stop:
        click.echo(serve.stop(port, state_dir))
        return
    if not base_model:
        fail("--base-model is required (or --stop)")
    if more_adapters and not adapters:
        fail(f"unexpected argument {more_adapters[0]!r}: adapters follow --adapters")
    from halo_train.config import resolve_base_model

    spec = serve.ServeSpec(resolve_base_model(base_model, serve.ServeError), serve.parse_adapters([*adapters, *more_adapters]), port, host, engine,
                           tuple(shlex.split(vllm_args)))
    if dry_run:
        name, command, _ = serve.engine_process(spec)
        prefix = "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True " if name == "vllm" else ""
        click.echo(prefix + shlex.join(command))
        return
    _setup_logging()
    state = serve.start(spec, state_dir, wait=wait)
    served = ", ".join(n for n in state["models"] if n in spec.adapters) or "none"
    click.echo(f"serving {base_model} with {state['engine']} at {state['url']} (adapters: {served}; pid {state['pid']}, "
               f"log {state['log']})")
    click.echo(f"export HALO_VLLM_URL={state['url']}")
    stop_args = ["serve", "--stop", "--port", str(port)]
    if state_dir != str(DEFAULT_STATE_DIR):
        stop_args += ["--state-dir", state_dir]
    click.echo(f"stop it: {script_command('halo-train', *stop_args)}")


if __name__ == "__main__":
    main()
