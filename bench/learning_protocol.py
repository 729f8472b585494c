"""A learning experiment's protocol (bench/protocols/NAME.yaml) and the plan it fixes.

The plan is a list of stages, each named by the run id or folder it writes, so what is done can be read from
the lake and the output folders alone (``bench/learning.py`` does the reading and the running):

- ``sample`` — the base model's episodes on train task seeds (the data of bc_filtered and dpo), one per seed;
- ``train`` — a trained arm's adapter for one training seed (online_grpo samples its own episodes);
- ``eval`` — one (arm, training seed, split) cell of evaluation episodes; test seeds only after training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

PROTOCOLS = Path(__file__).resolve().parent / "protocols"
SPLITS = ("test_seeds", "heldout_tasks", "dev")
ARM_KINDS = ("model", "policy", "trained")
TRAINED_ARMS = ("bc_filtered", "dpo", "online_grpo")


class ProtocolError(ValueError):
    """The protocol file is missing a field or contradicts itself; the message names the field."""


@dataclasses.dataclass(frozen=True)
class EvalCell:
    """One (arm, training seed, split) cell: its tasks and task seeds, and the version it evaluates."""

    arm: str
    training_seed: int
    split: str
    tasks: tuple[str, ...]
    first_seed: int
    seeds: int
    attempts: int
    run_id: str
    version: int | None = None  # online_grpo's served version on the curve (None: the arm's final policy)

    @property
    def episodes(self) -> int:
        return len(self.tasks) * self.seeds * self.attempts


@dataclasses.dataclass(frozen=True)
class Protocol:
    name: str
    version: int
    base_model: str
    interface: dict[str, Any]
    train_tasks: tuple[str, ...]
    heldout_tasks: tuple[str, ...]
    splits: dict[str, Any]
    arms: dict[str, dict[str, Any]]
    training_seeds: tuple[int, ...]
    budget: dict[str, Any]
    hyperparameters: dict[str, Any]
    raw: dict[str, Any]
    path: Path

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path) -> "Protocol":
        path = Path(path)
        if not path.exists() and not path.suffix:
            path = PROTOCOLS / f"{path}.yaml"
        if not path.exists():
            raise ProtocolError(f"no protocol at {path}: pass a file or a name under {PROTOCOLS}")
        raw = yaml.safe_load(path.read_text()) or {}
        try:
            p = cls(
                name=str(raw["name"]), version=int(raw["version"]), base_model=str(raw["base_model"]),
                interface=dict(raw["interface"]), train_tasks=tuple(raw["tasks"]["train"]),
                heldout_tasks=tuple(raw["tasks"]["heldout"]), splits=dict(raw["splits"]), arms=dict(raw["arms"]),
                training_seeds=tuple(int(s) for s in raw["training_seeds"]), budget=dict(raw["budget"]),
                hyperparameters=dict(raw["hyperparameters"]), raw=raw, path=path,
            )
        except (KeyError, TypeError) as e:
            raise ProtocolError(f"{path}: missing or malformed field {e}") from None
        p.check()
        return p

    def check(self) -> None:
        overlap = set(self.train_tasks) & set(self.heldout_tasks)
        if overlap:
            raise ProtocolError(f"held-out tasks are trained on: {sorted(overlap)}")
        for arm, spec in self.arms.items():
            if spec.get("kind") not in ARM_KINDS:
                raise ProtocolError(f"arm {arm}: kind must be one of {ARM_KINDS}, got {spec.get('kind')!r}")
            if spec["kind"] == "trained" and arm not in TRAINED_ARMS:
                raise ProtocolError(f"arm {arm}: trained arms are {TRAINED_ARMS}")
        test, dev = self.splits["test"], self.splits["dev"]
        last_train = max(self.training_seeds) * self.seed_stride + self.train_seeds_used
        if not last_train <= int(dev["first"]) < int(test["first"]):
            raise ProtocolError(f"splits overlap: train seeds end at {last_train}, dev starts at {dev['first']}, "
                                f"test at {test['first']} (they must come in that order)")
        if int(dev["curve_first"]) + int(dev["curve_seeds"]) > int(test["first"]):
            raise ProtocolError("the dev curve seeds run into the test seeds")

    # ------------------------------------------------------------------ derived figures
    @property
    def seed_stride(self) -> int:
        return int(self.splits["train"]["seed_stride"])

    @property
    def train_seeds_used(self) -> int:
        """Task seeds one training seed consumes (sampling, or online_grpo's iterations)."""
        online = self.hyperparameters.get("online_grpo", {})
        return max(int(self.budget["sample"]["task_seeds"]),
                   int(online.get("iterations", 0)) * int(online.get("seeds_per_iteration", 1)))

    def train_seed_start(self, training_seed: int) -> int:
        return training_seed * self.seed_stride

    @property
    def prefix(self) -> str:
        """Run ids of this protocol start with it (learning-v1 -> lv1)."""
        return "".join(word[:1] for word in self.name.split("-v")[0].split("-")) + f"v{self.version}"

    def arm_seeds(self, arm: str) -> tuple[int, ...]:
        return self.training_seeds if self.arms[arm]["kind"] == "trained" else (0,)

    def tasks(self, tasks: tuple[str, ...]) -> tuple[str, ...]:
        env = self.interface["env"]
        return tuple(t if t.startswith(f"{env}.") else f"{env}.{t}" for t in tasks)

    # ------------------------------------------------------------------ run ids and cells
    def sample_run(self, training_seed: int) -> str:
        return f"{self.prefix}-sample-s{training_seed}"

    def online_run(self, training_seed: int) -> str:
        return f"{self.prefix}-online_grpo-s{training_seed}"

    def curve_versions(self) -> tuple[int, ...]:
        online = self.hyperparameters.get("online_grpo", {})
        every = int(self.hyperparameters.get("curve", {}).get("online_grpo_every", 0))
        return tuple(range(every, int(online.get("iterations", 0)) + 1, every)) if every else ()

    def eval_cells(self, arm: str, training_seed: int) -> list[EvalCell]:
        """The evaluation cells of one arm and training seed: test seeds of the train tasks, test seeds of the
        held-out tasks, and (first training seed, or the non-learned zero_shot) the dev curve's final point."""
        test, dev = self.splits["test"], self.splits["dev"]
        attempts = int(test.get("attempts", 1))
        run = f"{self.prefix}-eval-{arm}-s{training_seed}"
        cells = [
            EvalCell(arm, training_seed, "test_seeds", self.tasks(self.train_tasks), int(test["first"]),
                     int(test["train_tasks_seeds"]), attempts, f"{run}-test_seeds"),
            EvalCell(arm, training_seed, "heldout_tasks", self.tasks(self.heldout_tasks), int(test["first"]),
                     int(test["heldout_tasks_seeds"]), attempts, f"{run}-heldout_tasks"),
        ]
        on_curve = arm == "zero_shot" or (self.arms[arm]["kind"] == "trained" and arm != "online_grpo")
        if on_curve and training_seed == self.arm_seeds(arm)[0]:
            cells.append(EvalCell(arm, training_seed, "dev", self.tasks(self.heldout_tasks), int(dev["curve_first"]),
                                  int(dev["curve_seeds"]), 1, f"{run}-dev"))
        return cells

    def policy_seed(self, training_seed: int) -> int:
        return training_seed


def load(name_or_path: str | Path) -> Protocol:
    return Protocol.load(name_or_path)
