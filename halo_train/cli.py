"""``halo-train``: BC, DPO and GRPO jobs over the lake's views; merging adapters; a tiny test model.

    halo-train bc   --lake lake --base-model models/tiny --max-steps 5 --output-dir out/bc
    halo-train dpo  --lake lake --base-model models/tiny --max-steps 5 --output-dir out/dpo
    halo-train grpo --lake lake --base-model models/tiny --max-steps 5 --output-dir out/grpo
    halo-train merge --adapter out/dpo/final --output models/dpo-merged
    halo-train make-tiny-model models/tiny --warmup-lake lake

Each job's options come from its config dataclass (``halo_train.config``), and
``--config FILE.yaml`` loads the same names from a file; options given on the
command line win over the file.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
import typing
from typing import Any, Callable

import click

from halo_data.lake import LakeError
from halo_train.config import CONFIGS, TrainConfig, load_config


def fail(message: str, code: int = 1) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def run_cli(func: Callable) -> Callable:
    """Library errors a user can act on become one ``Error: ...`` line and exit code 1."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LakeError as e:
            fail(str(e))

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (click's test runner swaps it)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _setup_logging() -> None:
    for name in ("halo_train", "halo_data"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)


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
    if field.name == "params":
        return click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help=help_text)
    if base is bool:
        return click.option(f"{name}/--no-{field.name.replace('_', '-')}", default=None, help=help_text)
    choices = field.metadata.get("choices")
    if choices:
        return click.option(name, type=click.Choice(choices), default=None, help=help_text)
    click_type = {int: int, float: float}.get(base, str)
    return click.option(name, type=click_type, default=None, help=help_text)


def _job_command(job_type: str, train: Callable[[TrainConfig], Any]) -> click.Command:
    cls = CONFIGS[job_type]
    hints = typing.get_type_hints(cls)

    @run_cli
    def command(config: str | None, **options: Any) -> None:
        _setup_logging()
        if not options.get("params"):
            options.pop("params", None)
        cfg = load_config(cls, config, overrides=options)
        result = train(cfg)
        click.echo(f"run {result.run_id}: {result.global_step} steps on {result.rows} rows of {cfg.view}")
        click.echo(f"adapter: {result.final_adapter}")
        click.echo(f"serve:    {result.serve_command}")
        click.echo(f"evaluate: {result.eval_command}")
        click.echo(f"metrics:  halo-data query --lake {cfg.lake} \"select step, metric, value from train_metrics where run_id = '{result.run_id}'\"")

    command.__doc__ = cls.__doc__
    for field in reversed(dataclasses.fields(cls)):
        command = _option_for(field, hints[field.name])(command)
    command = click.option("--config", type=click.Path(dir_okay=False), default=None,
                           help="YAML (or JSON) file with these options; command-line options win.")(command)
    return click.command(job_type, help=cls.__doc__)(command)


@click.group()
@click.version_option(package_name="halo")
def main() -> None:
    """HALO training jobs: LoRA adapters from the lake's views, metrics back into the lake."""


def _train(job_type: str) -> Callable[[TrainConfig], Any]:
    def train(cfg: TrainConfig) -> Any:
        import halo_train

        return getattr(halo_train, f"train_{job_type}")(cfg)

    return train


for _job in ("bc", "dpo", "grpo"):
    main.add_command(_job_command(_job, _train(_job)))


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
@run_cli
def make_tiny_model_command(out: str, warmup_lake: str | None, steps: int, seed: int) -> None:
    """Build a tiny Qwen2-style model and tokenizer locally (seconds on CPU; no download)."""
    from halo_train.tiny_model import build_tiny_model

    _setup_logging()
    if steps < 1:
        raise LakeError(f"--steps must be at least 1, got {steps}")
    path = build_tiny_model(out, warmup_lake=warmup_lake, steps=steps, seed=seed)
    click.echo(f"tiny model: {path}")


if __name__ == "__main__":
    main()
