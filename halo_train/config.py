"""One configuration dataclass per training job, with help text, checks and YAML loading.

    cfg = BCConfig(lake="lake", base_model="models/tiny", output_dir="out/bc", max_steps=5)
    cfg = load_config(DPOConfig, "dpo.yaml", overrides={"beta": 0.2})

The CLI builds its options from these fields (``--lora-r`` for ``lora_r``), so a
field's ``metadata["help"]`` is its documentation in both places. Cross-field
checks live in ``__post_init__`` and raise ``TrainConfigError`` with a message
that says what to change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

from halo_data.config import PARAM_NAMES
from halo_data.lake import LakeError


class TrainConfigError(LakeError):
    """A training option a user can fix; the CLI prints it as one ``Error: ...`` line."""


JOB_TYPES = ("bc", "dpo", "grpo")
BACKENDS = ("auto", "peft", "unsloth")
REPORT_TO = ("none", "tensorboard")
# Views that read the top-percent cut of progress_ranking.
TOP_PERCENT_VIEWS = ("bc_rows", "progress_ranking")
# TRL's DPO loss names (trl.DPOConfig.loss_type).
DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
    "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)
# The sources of dpo_pairs' rows (its `source` column), and all of them.
DPO_SOURCES = ("all", "episodes", "candidates", "mcts")
# TRL's GRPO loss names (trl.GRPOConfig.loss_type) that make sense without generation.
GRPO_LOSS_TYPES = ("dr_grpo", "grpo", "bnpo")
# What a GRPO group is, and the view its rows come from: attempts of one task seed (grpo_groups), or the
# candidates sampled and scored at one visited state (state_groups).
GRPO_GROUP_VIEWS = {"episode": "grpo_groups", "state": "state_groups"}
GRPO_GROUP_BY = tuple(GRPO_GROUP_VIEWS)
STATE_BASELINES = ("mean", "min")
SCALE_REWARDS = ("none", "group", "batch")
# Served adapter names that halo-agent's shipped eval modes (halo_agent/configs/modes.yaml) request: the text
# modes for a text base model, the screenshot modes (qwen3vl_*) for a vision-language one. The text GRPO
# adapter has no mode of its own.
DEFAULT_ADAPTER_NAMES = {"bc": "qwen_worker_bc", "dpo": "qwen_worker_dpo", "grpo": "halo-grpo", "ppo": "halo-ppo"}
VLM_ADAPTER_NAMES = {"bc": "qwen3vl_bc", "dpo": "qwen3vl_dpo", "grpo": "qwen3vl_grpo"}


def _field(default: Any = dataclasses.MISSING, help: str = "", choices: tuple[str, ...] | None = None, **kw: Any) -> Any:
    metadata: dict[str, Any] = {"help": help}
    if choices:
        metadata["choices"] = choices
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata, **kw)
    return dataclasses.field(default=default, metadata=metadata, **kw)


def _split_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def resolve_base_model(name: str, error: type[Exception]) -> str:
    """A known model's name (``halo-train models``) → its converted folder; anything else unchanged."""
    from halo_agent.models import ModelResolveError, resolve_model

    try:
        return resolve_model(name)
    except ModelResolveError as e:
        raise error(str(e)) from None


def base_model_path(name: str) -> str:
    """Local folders (a known model's converted one too) as absolute paths, so adapter_config.json points at the
    base from anywhere."""
    name = resolve_base_model(name, TrainConfigError)
    p = Path(name).expanduser()
    return str(p.resolve()) if p.exists() else name


def _looks_like_local_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; anything else (absolute, relative with ./ or ../, ~, deeper) is a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


SCOPES = ("runs", "lake")


@dataclasses.dataclass
class TrainConfig:
    """Options every training job shares."""

    lake: str | None = _field(None, "Lake root (a path or object-store URI); $HALO_LAKE, else ./lake, by default.")
    view: str = _field("", "View to read; the job's own view by default (bc_rows, dpo_pairs, grpo_groups).")
    where: str | None = _field(None, "SQL filter on the view's rows, e.g. \"task_id LIKE 'miniwob.%'\".")
    runs: list | None = _field(None, "Train on these runs, comma-separated: the view is computed over their rows alone "
                               "(read from their files alone), so its pairs, rankings and groups stay within them.")
    scope: str = _field("runs", "runs: a job that names its runs (--runs, or run_id = '...' / run_id IN (...) in --where) "
                        "computes its view over those runs only; lake: over the whole lake, pairing and grouping "
                        "across runs, then filtered.", choices=SCOPES)
    top_percent: float | None = _field(None, "Top-percent cut of progress_ranking that bc_rows keeps (view default 50).")
    params: dict = _field({}, f"View parameters NAME=VALUE ({PARAM_NAMES}).")
    as_of: str | None = _field(None, "Read the lake as of table versions (N, TABLE=N[,TABLE=N]) or an ISO time.")
    base_model: str = _field("", "Base model: a local folder, a known model name (halo-train models) or a hub id.")
    output_dir: str = _field("", "Folder for checkpoints and the final adapter; out/<job> by default.")
    run_id: str | None = _field(None, "Run id of the training run in the lake; derived from the job and time by default.")
    adapter_name: str | None = _field(None, "Name the adapter is served under (vllm --lora-modules NAME=DIR); by default halo-agent's eval mode names: qwen_worker_bc, qwen_worker_dpo (or halo-grpo), or for a vision-language base qwen3vl_bc, qwen3vl_dpo, qwen3vl_grpo.")
    backend: str = _field("auto", "auto | peft | unsloth: unsloth needs a CUDA GPU; auto picks it when present.", choices=BACKENDS)
    lora_r: int = _field(16, "LoRA rank.")
    lora_alpha: int = _field(32, "LoRA alpha (scale = alpha / r).")
    lora_dropout: float = _field(0.05, "Dropout on the LoRA branch.")
    target_modules: list = _field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Modules that get LoRA weights, comma-separated.",
    )
    epochs: float = _field(1.0, "Passes over the rows (fractional allowed); --max-steps wins when set.")
    max_steps: int | None = _field(None, "Stop after this many optimizer steps.")
    lr: float = _field(2e-4, "Peak learning rate (AdamW).")
    batch_size: int = _field(4, "Rows per device per forward pass.")
    gradient_accumulation_steps: int = _field(1, "Forward passes per optimizer step.")
    max_length: int | None = _field(2048, "Longest prompt+completion in tokens; longer rows are dropped (counted), never cut.")
    seed: int = _field(0, "Seed of LoRA initialisation, data order and dropout.")
    logging_steps: int = _field(1, "Log metrics every N optimizer steps.")
    save_steps: int | None = _field(None, "Also save a resumable checkpoint every N steps (checkpoints are saved every epoch).")
    gradient_checkpointing: bool | None = _field(None, "Recompute activations to save memory; on with a CUDA GPU by default.")
    report_to: str = _field("none", "none | tensorboard (written offline under OUTPUT_DIR/runs).", choices=REPORT_TO)
    resume_from: str | None = _field(None, "Continue from a checkpoint folder (OUTPUT_DIR/checkpoint-N) at its saved step.")
    init_adapter: str | None = _field(
        None, "Warm start: continue training this PEFT adapter folder (e.g. an SFT adapter) instead of fresh LoRA weights; "
        "its own rank and target modules apply."
    )

    job_type: typing.ClassVar[str] = ""
    default_view: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.lake = str(self.lake or os.environ.get("HALO_LAKE") or "lake")
        self.view = self.view or self.default_view
        self.output_dir = self.output_dir or f"out/{self.job_type}"
        self.target_modules = _split_list(self.target_modules) or []
        self.runs = _split_list(self.runs) or None
        if self.scope not in SCOPES:
            raise TrainConfigError(f"--scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.runs and self.scope == "lake":
            raise TrainConfigError("--runs computes the view over those runs: drop --scope lake, or filter with --where instead")
        if isinstance(self.params, (list, tuple)):
            from halo_data.config import parse_params

            self.params = parse_params(list(self.params))
        self.params = dict(self.params or {})
        if not self.base_model:
            raise TrainConfigError(f"{self.job_type}: give --base-model (a local model folder, a known model name or a hub id)")
        self.base_model = resolve_base_model(self.base_model, TrainConfigError)
        if _looks_like_local_path(self.base_model) and not Path(self.base_model).expanduser().exists():
            raise TrainConfigError(
                f"base model path {self.base_model} does not exist: build a test model with "
                f"`halo-train make-tiny-model {self.base_model}` or pass a hub id"
            )
        if not self.adapter_name:
            from halo_agent.vlm import is_vlm

            names = VLM_ADAPTER_NAMES if is_vlm(self.base_model, local_files_only=True) else DEFAULT_ADAPTER_NAMES
            self.adapter_name = names.get(self.job_type, f"halo-{self.job_type}")
        if self.backend not in BACKENDS:
            raise TrainConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.report_to not in REPORT_TO:
            raise TrainConfigError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {self.report_to!r}")
        for name in ("lora_r", "lora_alpha", "batch_size", "gradient_accumulation_steps", "logging_steps"):
            if int(getattr(self, name)) < 1:
                raise TrainConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.lora_dropout < 1:
            raise TrainConfigError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.target_modules:
            raise TrainConfigError("--target-modules is empty: name the modules that get LoRA weights, e.g. q_proj,v_proj")
        if self.lr <= 0:
            raise TrainConfigError(f"--lr must be positive, got {self.lr}")
        if self.epochs <= 0:
            raise TrainConfigError(f"--epochs must be positive, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise TrainConfigError(f"--max-steps must be at least 1, got {self.max_steps}")
        if self.save_steps is not None and self.save_steps < 1:
            raise TrainConfigError(f"--save-steps must be at least 1, got {self.save_steps}")
        if self.max_length is not None and self.max_length < 8:
            raise TrainConfigError(f"--max-length must be at least 8 tokens, got {self.max_length}")
        if self.top_percent is not None:
            if not 0 < self.top_percent <= 100:
                raise TrainConfigError(f"--top-percent must be in (0, 100], got {self.top_percent}")
            if self.view not in TOP_PERCENT_VIEWS:
                raise TrainConfigError(
                    f"--top-percent only changes the views {', '.join(TOP_PERCENT_VIEWS)}; {self.view} does not read it: "
                    "drop --top-percent or filter with --where"
                )
            if "top_percent" in self.params:
                raise TrainConfigError("top_percent is given both as --top-percent and --set: give it once")
        if self.where is not None and not self.where.strip():
            self.where = None
        if self.init_adapter is not None and not (Path(self.init_adapter).expanduser() / "adapter_config.json").exists():
            raise TrainConfigError(
                f"--init-adapter {self.init_adapter} is not a PEFT adapter folder (no adapter_config.json): "
                "pass the folder a training job saved (OUTPUT_DIR/final)"
            )
        if self.resume_from is not None:
            state = Path(self.resume_from) / "trainer_state.json"
            if not state.exists():
                raise TrainConfigError(
                    f"--resume-from {self.resume_from} is not a checkpoint (no trainer_state.json): "
                    f"pass an OUTPUT_DIR/checkpoint-N folder"
                )
            stats_path = Path(self.resume_from) / "training_stats.json"
            if stats_path.exists():
                job = json.loads(stats_path.read_text()).get("job_type")
                if job and job != self.job_type:
                    raise TrainConfigError(
                        f"--resume-from {self.resume_from} is a {job} checkpoint; resume it with `halo-train {job}`"
                    )

    def scoped_runs(self) -> list[str] | None:
        """The runs the job's view is computed over: --runs, else the runs --where pins (--scope runs); None: the lake."""
        if self.runs:
            return list(self.runs)
        if self.scope == "runs":
            from halo_data.reader import runs_named

            return runs_named(self.where)
        return None

    def view_params(self) -> dict[str, Any]:
        out = dict(self.params)
        if self.top_percent is not None:
            out["top_percent"] = self.top_percent
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


@dataclasses.dataclass
class BCConfig(TrainConfig):
    """Behavioural cloning: supervised fine-tuning on bc_rows (prompt -> completion), loss on the completion only."""

    job_type: typing.ClassVar[str] = "bc"
    default_view: typing.ClassVar[str] = "bc_rows"


@dataclasses.dataclass
class DPOConfig(TrainConfig):
    """DPO on dpo_pairs (prompt, chosen, rejected) against the base model (the adapter switched off)."""

    lr: float = _field(5e-6, "Peak learning rate (AdamW).")
    beta: float = _field(0.1, "DPO beta: higher keeps the policy closer to the base model.")
    loss_type: list = _field(["sigmoid"], "TRL DPO loss name(s), comma-separated: sigmoid, ipo, hinge, robust, ...")
    loss_weights: list | None = _field(None, "Weights of several --loss-type values, comma-separated.")
    source: str = _field(
        "all", "Pairs of one source of dpo_pairs only: episodes, candidates, mcts (search trees; their stored generation "
        "logprobs are the reference where both are present) or all.", choices=DPO_SOURCES,
    )

    job_type: typing.ClassVar[str] = "dpo"
    default_view: typing.ClassVar[str] = "dpo_pairs"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.loss_type = _split_list(self.loss_type) or []
        bad = [t for t in self.loss_type if t not in DPO_LOSS_TYPES]
        if bad or not self.loss_type:
            raise TrainConfigError(f"--loss-type {','.join(bad) or '(empty)'} is not a TRL DPO loss: use {', '.join(DPO_LOSS_TYPES)}")
        if self.loss_weights is not None:
            self.loss_weights = [float(w) for w in _split_list(self.loss_weights) or []]
            if len(self.loss_weights) != len(self.loss_type):
                raise TrainConfigError(
                    f"--loss-weights has {len(self.loss_weights)} value(s) for {len(self.loss_type)} --loss-type value(s): give one per loss"
                )
        if self.beta <= 0:
            raise TrainConfigError(f"--beta must be positive, got {self.beta}")
        if self.source not in DPO_SOURCES:
            raise TrainConfigError(f"--source must be one of {', '.join(DPO_SOURCES)}, got {self.source!r}")
        if self.source != "all":
            if self.view != "dpo_pairs":
                raise TrainConfigError(f"--source picks rows of dpo_pairs; --view {self.view} has no source column: drop one of them")
            only = f"source = '{self.source}'"
            self.where = only if not self.where else f"({self.where}) AND {only}"


@dataclasses.dataclass
class GRPOConfig(TrainConfig):
    """GRPO from the lake's stored groups (grpo_groups, or state_groups with --group-by state): no generation, advantages from the view."""

    lr: float = _field(1e-5, "Peak learning rate (AdamW).")
    group_by: str = _field(
        "episode",
        "episode: groups of attempts of one task seed (grpo_groups, GiGPO's step level included); state: the candidates "
        "sampled at one visited state, each scored from the restored state (state_groups; halo-agent rollout --candidates N).",
        choices=GRPO_GROUP_BY,
    )
    loss_type: str = _field(
        "dr_grpo",
        "TRL's loss names: dr_grpo (token sum / (batch x max_completion_length)), grpo (per-sequence mean), "
        "bnpo (mean over the batch's completion tokens).",
        choices=GRPO_LOSS_TYPES,
    )
    scale_rewards: str = _field(
        "none",
        "none: advantage = reward - group mean (Dr. GRPO); group: divided by the group's std; batch: by the std of all rewards read.",
        choices=SCALE_REWARDS,
    )
    state_baseline: str = _field(
        "mean",
        "With --group-by state: what a candidate's score is compared with. mean: its state group's mean (GRPO; for "
        "candidates the policy sampled). min: the group's lowest score, so no candidate is pushed down: for groups that "
        "enumerate the page's actions (online-grpo --cover-choices), where the mean would push every below-average "
        "action towards probability 0 and collapse the policy onto the action right most often.",
        choices=STATE_BASELINES,
    )
    choice_softmax: bool = _field(
        False,
        "With --group-by state: a candidate's probability is its share of its state's candidates, p(a) / sum of p(a') "
        "over the group's distinct completions: the distribution a guided-choice engine draws from (online-grpo "
        "--constrain-actions), where the raw sequence probability also counts text the page never offers. The ratio "
        "and the gradient are that distribution's, so raising one choice lowers the page's other choices; each "
        "batch holds --batch-size whole state groups.",
    )
    epsilon: float = _field(0.2, "Lower clip range of the importance ratio (used where behaviour logprobs are stored).")
    epsilon_high: float | None = _field(None, "Upper clip range; --epsilon by default (DAPO uses 0.28).")
    tis_cap: float | None = _field(
        None, "Truncated importance sampling for an engine/trainer mismatch (bf16 kernels, another attention path): each "
        "token-exact row's ratio is taken against the trainer's own score of the stored tokens before the update, and its "
        "loss weighted by min(pi_trainer / pi_engine, CAP) (verl's tis_imp_ratio_cap). The persistent learner "
        "(online-grpo) computes it; off by default (on CPU HALO's engine and trainer agree to float rounding).")
    max_completion_length: int = _field(256, "Completion tokens kept per row; dr_grpo's constant normaliser.")
    beta: float = _field(0.0, "KL coefficient against the reference (the base model: the adapter disabled); 0: no KL term, no reference pass.")
    policy_version: int | None = _field(
        None, "Version of the weights being trained (updates since the base model); the newest version in the rows by default."
    )
    max_staleness: int | None = _field(
        None, "Drop rows whose policy_version is more than this many updates older than --policy-version."
    )

    job_type: typing.ClassVar[str] = "grpo"
    default_view: typing.ClassVar[str] = "grpo_groups"

    def __post_init__(self) -> None:
        if self.group_by not in GRPO_GROUP_VIEWS:
            raise TrainConfigError(f"--group-by must be one of {', '.join(GRPO_GROUP_BY)}, got {self.group_by!r}")
        self.view = self.view or GRPO_GROUP_VIEWS[self.group_by]
        super().__post_init__()
        if self.loss_type not in GRPO_LOSS_TYPES:
            raise TrainConfigError(f"--loss-type must be one of {', '.join(GRPO_LOSS_TYPES)} for grpo, got {self.loss_type!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise TrainConfigError(f"--scale-rewards must be one of {', '.join(SCALE_REWARDS)}, got {self.scale_rewards!r}")
        if self.state_baseline not in STATE_BASELINES:
            raise TrainConfigError(f"--state-baseline must be one of {', '.join(STATE_BASELINES)}, got {self.state_baseline!r}")
        if self.state_baseline != "mean" and self.group_by != "state":
            raise TrainConfigError(f"--state-baseline {self.state_baseline} compares the candidates of a state: add --group-by state")
        if self.choice_softmax and self.group_by != "state":
            raise TrainConfigError("--choice-softmax normalises over a state's candidates: add --group-by state")
        if not 0 < self.epsilon < 1:
            raise TrainConfigError(f"--epsilon must be in (0, 1), got {self.epsilon}")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise TrainConfigError(f"--epsilon-high must be positive, got {self.epsilon_high}")
        if self.max_completion_length < 1:
            raise TrainConfigError(f"--max-completion-length must be at least 1, got {self.max_completion_length}")
        if self.beta < 0:
            raise TrainConfigError(f"--beta must be 0 (no KL) or positive, got {self.beta}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise TrainConfigError(f"--max-staleness must be 0 or more, got {self.max_staleness}")
        wanted = GRPO_GROUP_VIEWS[self.group_by]
        if self.view != wanted:
            other = [k for k, v in GRPO_GROUP_VIEWS.items() if v == self.view]
            raise TrainConfigError(
                f"grpo reads the {wanted} view (its group columns) with --group-by {self.group_by}; got --view {self.view}: "
                + (f"pass --group-by {other[0]} instead" if other else "filter with --where")
            )

    @property
    def omega(self) -> float:
        from halo_data.config import ViewParams

        return float(self.params.get("omega", ViewParams().omega))


CONFIGS: dict[str, type[TrainConfig]] = {"bc": BCConfig, "dpo": DPOConfig, "grpo": GRPOConfig}

ConfigT = TypeVar("ConfigT", bound=TrainConfig)


@dataclasses.dataclass
class LearnerOptions:
    """How the persistent learner trains each update (the rest, loss and data, comes from the update's GRPOConfig)."""

    epochs_per_update: int = 1
    mini_batch_size: int = 4  # rows per optimizer step (bench/protocols/learner-warmup.md)
    batch_size: int = 4  # rows per forward pass; mini_batch_size / batch_size passes are accumulated
    max_steps: int | None = None  # most optimizer steps per update (a cap); None: every row, epochs_per_update times
    warmup_steps: int = 16  # linear warm-up over the run's first optimizer steps, then constant
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    measure_rows: int = 16  # rows the KL and entropy after an update are measured on (a forward pass each); 0: none
    share_prompts: bool = True  # a state's rows share one minibatch and one forward pass of their prompt
    # Stop an update once a minibatch's approximate KL(current || sampling policy) passes 1.5 x this, before its step
    # (Stable-Baselines3's and CleanRL's target_kl); None (0 on the command line): every row is trained on. GRPO
    # updates (DPO has no ratios).
    target_kl: float | None = 0.02

    def __post_init__(self) -> None:
        for name in ("epochs_per_update", "mini_batch_size", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise TrainConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise TrainConfigError(f"--train-steps caps an update's optimizer steps: give 1 or more, not {self.max_steps}")
        if self.warmup_steps < 0:
            raise TrainConfigError(f"--warmup-steps must be 0 or more, got {self.warmup_steps}")
        if self.target_kl is not None and not self.target_kl >= 0:
            raise TrainConfigError(f"--target-kl must be positive, or 0 for no early stop, got {self.target_kl}")
        if self.target_kl == 0:
            self.target_kl = None


def config_fields(cls: type[TrainConfig]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls)]


def load_config(cls: type[ConfigT], path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> ConfigT:
    """A job config from a YAML (or JSON) file, with ``overrides`` (None values ignored) on top."""
    values: dict[str, Any] = {}
    if path is not None:
        from halo_data.config import load_yaml_or_json

        try:
            raw = load_yaml_or_json(path)
        except (FileNotFoundError, ValueError) as e:
            raise TrainConfigError(str(e)) from None
        # YAML keys may be written as on the command line (lora-r) or as fields (lora_r).
        values = {str(k).replace("-", "_"): v for k, v in raw.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TrainConfigError(
                f"{path}: unknown option(s) for {cls.job_type}: {', '.join(unknown)} (see `halo-train {cls.job_type} --help`)"
            )
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return cls(**values)
    except TypeError as e:
        raise TrainConfigError(f"bad {cls.job_type} options: {e}") from None
