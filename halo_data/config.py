"""Configuration shared by writers, views and exports: reward weights and view parameters.

Reward components are stored raw on every step; the weights here only decide the
shaped reward that views compute, so re-weighting needs no new rollouts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

from halo_data.errors import LakeError
from halo_data.schema import REWARD_COMPONENTS, TABLES


@dataclasses.dataclass
class RewardWeights:
    progress: float = dataclasses.field(default=1.0, metadata={"help": "Weight of the dense progress reward."})
    novelty: float = dataclasses.field(default=0.05, metadata={"help": "Weight of the novelty bonus."})
    loop: float = dataclasses.field(default=0.1, metadata={"help": "Weight of the loop penalty (components are <= 0)."})
    validity: float = dataclasses.field(default=0.05, metadata={"help": "Weight of validity shaping."})
    success: float = dataclasses.field(default=1.0, metadata={"help": "Weight of the environment's success reward."})
    task_progress: float = dataclasses.field(default=3.0, metadata={"help": "Weight of task-aware progress (the share of the task's expectations met)."})

    def as_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in REWARD_COMPONENTS}

    def shaped(self, components: dict[str, float]) -> float:
        return sum(float(components.get(k) or 0.0) * w for k, w in self.as_dict().items())


@dataclasses.dataclass
class ViewParams:
    """Parameters the SQL views read through DuckDB variables (``getvariable('halo_gamma')``)."""

    gamma: float = dataclasses.field(default=0.9, metadata={"help": "Discount for step-level returns in grpo_groups."})
    omega: float = dataclasses.field(default=1.0, metadata={"help": "Weight of the anchor-state advantage: A = A_episode + omega * A_step."})
    top_percent: float = dataclasses.field(default=50.0, metadata={"help": "Top-percent cut of progress_ranking used by bc_rows (0 < p <= 100)."})
    dpo_pairing: str = dataclasses.field(default="best_vs_worst", metadata={"help": "best_vs_worst | all: which episode pairs of a prompt become DPO pairs."})
    dpo_scope: str = dataclasses.field(default="lake", metadata={"help": "lake | run: pair a prompt's episode steps across every run, or within each run only."})
    group_scope: str = dataclasses.field(default="lake", metadata={"help": "lake | run: a grpo_groups group holds a task seed's attempts by one policy_version from every run, or from one run only."})
    weights: RewardWeights = dataclasses.field(default_factory=RewardWeights)

    def __post_init__(self) -> None:
        if not 0 < float(self.top_percent) <= 100:
            raise ValueError(f"top_percent must be in (0, 100], got {self.top_percent}")
        if not 0 <= float(self.gamma) <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.dpo_pairing not in ("best_vs_worst", "all"):
            raise ValueError(f"dpo_pairing must be best_vs_worst or all, got {self.dpo_pairing!r}")
        for name in ("dpo_scope", "group_scope"):
            if getattr(self, name) not in ("lake", "run"):
                raise ValueError(f"{name} must be lake or run, got {getattr(self, name)!r}")
        if isinstance(self.weights, dict):
            self.weights = RewardWeights(**self.weights)

    def variables(self) -> dict[str, Any]:
        """DuckDB variable name -> value, as the views read them."""
        out: dict[str, Any] = {
            "halo_gamma": float(self.gamma),
            "halo_omega": float(self.omega),
            "halo_top_percent": float(self.top_percent),
            "halo_dpo_pairing": self.dpo_pairing,
            "halo_dpo_scope": self.dpo_scope,
            "halo_group_scope": self.group_scope,
        }
        for k, v in self.weights.as_dict().items():
            out[f"halo_w_{k}"] = v
        return out

    def override(self, **kw: Any) -> "ViewParams":
        weights = dataclasses.replace(self.weights)
        plain = {}
        for k, v in kw.items():
            if v is None:
                continue
            if k.startswith("w_") and hasattr(weights, k[2:]):
                setattr(weights, k[2:], float(v))
            elif k in {f.name for f in dataclasses.fields(self)} and k != "weights":
                plain[k] = type(getattr(self, k))(v)
            else:
                raise ValueError(f"unknown view parameter {k!r}: use {PARAM_NAMES}")
        return dataclasses.replace(self, weights=weights, **plain)


# The views' parameters by name, as the CLIs' help and errors list them; TEXT_PARAMS are words, the others numbers.
TEXT_PARAMS = tuple(f.name for f in dataclasses.fields(ViewParams) if f.type in (str, "str"))
PARAM_NAMES = ", ".join(f.name for f in dataclasses.fields(ViewParams) if f.name != "weights") + ", w_<component>"


def parse_params(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["gamma=0.95", "w_success=2"]`` -> dict, for ``--param`` options."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ValueError(f"bad parameter {p!r}: write NAME=VALUE, e.g. gamma=0.95")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def load_yaml_or_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    text = path.read_text()
    if path.suffix in (".json",):
        return json.loads(text)
    import yaml

    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping")
    return data


def parse_as_of(as_of: str | int | None) -> dict[str, Any] | dt.datetime | None:
    """``--as-of`` values: ``12`` (the steps table's version), ``steps=12,runs=3``, or an ISO time."""
    if as_of is None or as_of == "":
        return None
    if isinstance(as_of, int):
        return {"steps": as_of}
    text = str(as_of).strip()
    if text.isdigit():
        return {"steps": int(text)}
    if "=" in text:
        out: dict[str, Any] = {}
        for part in text.split(","):
            name, _, v = part.partition("=")
            name = name.strip()
            if name not in TABLES:
                raise LakeError(f"--as-of names unknown table {name!r}; tables are {', '.join(TABLES)}")
            if not v.strip().isdigit():
                raise LakeError(f"--as-of {name}={v!r}: a version is a non-negative integer")
            out[name] = int(v)
        return out
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise LakeError(
            f"--as-of {text!r} is not a version: give N (steps), TABLE=N[,TABLE=N] or an ISO time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when
