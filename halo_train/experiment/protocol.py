"""An experiment's protocol (a YAML file) and the plan it fixes.

The plan is a list of stages, each named by the run id or folder it writes, so what is done can be read from
the lake and the output folders alone (``halo_train.experiment.runner`` does the reading and the running):

- ``sample`` — the base model's episodes on train task seeds (an offline arm's data), one per training seed;
- ``train`` — a trained arm's adapter for one training seed (online arms sample their own episodes; expert
  iteration samples with each round's adapter);
- ``eval`` — one (arm, seed, split, temperature) cell of evaluation episodes; test seeds only after training.

A trained arm's ``method`` says how it learns: ``bc`` (SFT on the successes of the base model's sample),
``expert_iteration`` (rounds of sample -> keep successes -> SFT), ``dpo`` (pairs of its own sample) or ``online``
(``halo-train online-grpo``, its hyperparameters passed as that command's options). learning-v1's arms name no
method: bc_filtered is ``bc``, dpo ``dpo`` and online_grpo ``online``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import yaml

SPLITS = ("test_seeds", "heldout_tasks", "dev")
TEST_SPLITS = ("test_seeds", "heldout_tasks")  # both evaluate on test seeds: once per cell, never twice
ARM_KINDS = ("model", "policy", "trained")
METHODS = ("bc", "expert_iteration", "dpo", "online")
DEFAULT_METHODS = {"bc_filtered": "bc", "dpo": "dpo", "online_grpo": "online"}  # learning-v1's arms
SAMPLED = ("bc", "dpo")  # methods that learn from the base model's sample of their training seed


class ProtocolError(ValueError):
    """The protocol file is missing a field or contradicts itself; the message names the field."""


@dataclasses.dataclass(frozen=True)
class EvalCell:
    """One (arm, seed, split, temperature) cell: its tasks and task seeds, and the version it evaluates."""

    arm: str
    training_seed: int
    split: str
    tasks: tuple[str, ...]
    first_seed: int
    seeds: int
    attempts: int
    run_id: str
    version: int | None = None  # an online arm's served version on the curve (None: the arm's final policy)
    temperature: float | None = None  # None: the interface's

    @property
    def episodes(self) -> int:
        return len(self.tasks) * self.seeds * self.attempts

    @property
    def is_test(self) -> bool:
        return self.split in TEST_SPLITS


def _search_paths(name: str) -> list[Path]:
    """Where a protocol given by name is looked for: bench/protocols of the working directory, then of HALO's
    own checkout."""
    here = Path(__file__).resolve().parents[2]
    return [Path.cwd() / "bench" / "protocols" / f"{name}.yaml", here / "bench" / "protocols" / f"{name}.yaml"]


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
            path = next((p for p in _search_paths(str(path)) if p.exists()), path)
        if not path.exists():
            raise ProtocolError(f"no protocol at {path}: pass a YAML file (or a name under bench/protocols/)")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ProtocolError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(raw, dict):
            raise ProtocolError(f"{path}: a protocol is a mapping of fields (name, version, tasks, splits, arms, ...)")
        try:
            p = cls(
                name=str(raw["name"]), version=int(raw["version"]), base_model=str(raw["base_model"]),
                interface=dict(raw["interface"]), train_tasks=tuple(raw["tasks"]["train"]),
                heldout_tasks=tuple(raw["tasks"]["heldout"]), splits=dict(raw["splits"]), arms=dict(raw["arms"]),
                training_seeds=tuple(int(s) for s in raw["training_seeds"]), budget=dict(raw["budget"]),
                hyperparameters=dict(raw.get("hyperparameters") or {}), raw=raw, path=path,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"{path}: missing or malformed field {e}") from None
        p.check()
        return p

    def check_prompt_version(self) -> None:
        """The interface's ``prompt_version``, where it names one, is the one this code renders its observation as:
        the prompts a protocol was registered with are the prompts its stages write."""
        from halo_data.prompts import PROMPT_VERSIONS

        named, observation = self.interface.get("prompt_version"), self.interface.get("observation", "axtree")
        rendered = PROMPT_VERSIONS.get(observation)
        if named is not None and named != rendered:
            other = next((o for o, v in PROMPT_VERSIONS.items() if v == named), None)
            fix = (f"a protocol with observation {other} renders it" if other else
                   f"run it at a commit that renders {named}")
            raise ProtocolError(f"{self.path}: interface.prompt_version is {named}, but this code renders the "
                                f"{observation} observation as {rendered}: {fix}")

    @property
    def sha256(self) -> str:
        """The protocol file's bytes, hashed: what registration records and every later stage checks."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def check(self) -> None:
        self.env_options()
        overlap = set(self.train_tasks) & set(self.heldout_tasks)
        if overlap:
            raise ProtocolError(f"held-out tasks are trained on: {sorted(overlap)}")
        for arm, spec in self.arms.items():
            if not isinstance(spec, dict) or spec.get("kind") not in ARM_KINDS:
                raise ProtocolError(f"arm {arm}: kind must be one of {ARM_KINDS}, got {(spec or {}).get('kind')!r}")
            if spec["kind"] == "trained" and self.method(arm) not in METHODS:
                raise ProtocolError(f"arm {arm}: a trained arm's method is one of {METHODS} "
                                    f"(learning-v1's arm names {tuple(DEFAULT_METHODS)} imply theirs)")
            if spec["kind"] == "trained" and arm not in self.hyperparameters:
                raise ProtocolError(f"arm {arm}: hyperparameters.{arm} is missing")
            if spec["kind"] == "policy" and not spec.get("policy"):
                raise ProtocolError(f"arm {arm}: a policy arm names its --policy")
        test, dev = self.splits["test"], self.splits["dev"]
        last_train = max(self.training_seeds) * self.seed_stride + self.train_seeds_used
        if not last_train <= int(dev["first"]) < int(test["first"]):
            raise ProtocolError(f"splits overlap: train seeds end at {last_train}, dev starts at {dev['first']}, "
                                f"test at {test['first']} (they must come in that order)")
        if int(dev.get("curve_first", dev["first"])) + int(dev.get("curve_seeds", 0)) > int(test["first"]):
            raise ProtocolError("the dev curve seeds run into the test seeds")
        screen = self.raw.get("screening") or {}
        if screen and int(screen.get("dev_first", dev["first"])) < int(dev["first"]):
            raise ProtocolError("screening uses dev seeds only: screening.dev_first lies before splits.dev.first")
        pages = screen.get("train_pages", "all")
        if pages != "all" and (isinstance(pages, bool) or not isinstance(pages, int) or pages < 1):
            raise ProtocolError(f"screening.train_pages is {pages!r}: give all (every train seed the plan uses) or a "
                                "positive number of train seeds")

    # ------------------------------------------------------------------ derived figures
    @property
    def seed_stride(self) -> int:
        return int(self.splits["train"]["seed_stride"])

    def method(self, arm: str) -> str | None:
        spec = self.arms[arm]
        return spec.get("method") or DEFAULT_METHODS.get(arm)

    def trained_arms(self) -> list[str]:
        return [a for a, s in self.arms.items() if s["kind"] == "trained"]

    def online_arms(self) -> list[str]:
        return [a for a in self.trained_arms() if self.method(a) == "online"]

    @property
    def sample_spec(self) -> dict[str, Any]:
        return dict(self.budget.get("sample") or {})

    @property
    def sample_episodes(self) -> int:
        s = self.sample_spec
        return len(self.train_tasks) * int(s.get("task_seeds", 0)) * int(s.get("attempts", 0))

    def rounds(self, arm: str) -> int:
        return int(self.hyperparameters[arm].get("rounds", 1)) if self.method(arm) == "expert_iteration" else 0

    def round_spec(self, arm: str) -> dict[str, int]:
        h = self.hyperparameters[arm]
        return {"task_seeds": int(h["task_seeds_per_round"]), "attempts": int(h["attempts"])}

    def round_episodes(self, arm: str) -> int:
        r = self.round_spec(arm)
        return len(self.train_tasks) * r["task_seeds"] * r["attempts"]

    def arm_episodes(self, arm: str) -> int:
        """Environment episodes a trained arm's training takes, as planned (the lake counts what it took)."""
        method, h = self.method(arm), self.hyperparameters[arm]
        if method in SAMPLED:
            return self.sample_episodes
        if method == "expert_iteration":
            return self.rounds(arm) * self.round_episodes(arm)
        return int(h["iterations"]) * int(h.get("seeds_per_iteration", 1)) * int(h["group_size"]) * len(self.train_tasks)

    @property
    def train_seeds_used(self) -> int:
        """Task seeds one training seed consumes (sampling, expert iteration's rounds, or online iterations)."""
        used = [int(self.sample_spec.get("task_seeds", 0))]
        for arm in self.trained_arms():
            h = self.hyperparameters.get(arm, {})
            if self.method(arm) == "online":
                used.append(int(h.get("iterations", 0)) * int(h.get("seeds_per_iteration", 1)))
            elif self.method(arm) == "expert_iteration":
                used.append(self.rounds(arm) * int(h.get("task_seeds_per_round", 0)))
        return max(used)

    def train_seed_start(self, training_seed: int) -> int:
        return training_seed * self.seed_stride

    @property
    def prefix(self) -> str:
        """Run ids of this protocol start with it (learning-v1 -> lv1)."""
        return "".join(word[:1] for word in self.name.split("-v")[0].split("-")) + f"v{self.version}"

    def arm_seeds(self, arm: str) -> tuple[int, ...]:
        """Training seeds of a trained arm; sampling seeds of the others (``seeds:`` in the arm, default one)."""
        if self.arms[arm]["kind"] == "trained":
            return self.training_seeds
        return tuple(int(s) for s in self.arms[arm].get("seeds", [0]))

    def env_options(self) -> dict[str, Any]:
        """The interface's environment options (``env_options: {success: full}``), passed to every rollout, search
        and online run as ``--env-option KEY=VALUE``; none by default."""
        options = self.interface.get("env_options") or {}
        if not isinstance(options, dict):
            raise ProtocolError(f"{self.path}: interface.env_options is a mapping of option to value, e.g. {{success: full}}")
        return {str(k): ("true" if v is True else "false" if v is False else v) for k, v in options.items()}

    def tasks(self, tasks: tuple[str, ...]) -> tuple[str, ...]:
        env = self.interface["env"]
        return tuple(t if t.startswith(f"{env}.") else f"{env}.{t}" for t in tasks)

    # ------------------------------------------------------------------ run ids and cells
    def sample_run(self, training_seed: int) -> str:
        return f"{self.prefix}-sample-s{training_seed}"

    def round_run(self, arm: str, training_seed: int, round_idx: int) -> str:
        return f"{self.prefix}-{arm}-s{training_seed}-r{round_idx}"

    def online_run(self, training_seed: int, arm: str = "online_grpo") -> str:
        return f"{self.prefix}-{arm}-s{training_seed}"

    def curve_versions(self, arm: str = "online_grpo") -> tuple[int, ...]:
        every = int(self.hyperparameters.get("curve", {}).get(f"{arm}_every", 0))
        return tuple(range(every, int(self.hyperparameters.get(arm, {}).get("iterations", 0)) + 1, every)) if every else ()

    @property
    def temperatures(self) -> tuple[float, ...]:
        """Evaluation temperatures: the first is the primary metric's (the interface's unless the split names them)."""
        return tuple(float(t) for t in self.splits["test"].get("temperatures", [self.interface["temperature"]]))

    def eval_cells(self, arm: str, training_seed: int) -> list[EvalCell]:
        """The evaluation cells of one arm and seed: test seeds of the train tasks and test seeds of the held-out
        tasks at each evaluation temperature (temperature 0 for model arms only, and only for the first seed of an
        untrained one), and (first seed, arms not on an online curve) the dev curve's final point."""
        test, dev = self.splits["test"], self.splits["dev"]
        attempts = int(test.get("attempts", 1))
        run = f"{self.prefix}-eval-{arm}-s{training_seed}"
        first = training_seed == self.arm_seeds(arm)[0]
        trained = self.arms[arm]["kind"] == "trained"
        cells = []
        for i, temperature in enumerate(self.temperatures):
            if temperature == 0 and (self.arms[arm]["kind"] == "policy" or not (trained or first)):
                continue  # greedy decoding of a fixed model is one result whatever its sampling seed; a policy arm
                          # (random, a rule) does not decode
            suffix = "" if i == 0 else f"-t{temperature:g}"
            for split, tasks, seeds in (("test_seeds", self.train_tasks, test["train_tasks_seeds"]),
                                        ("heldout_tasks", self.heldout_tasks, test["heldout_tasks_seeds"])):
                cells.append(EvalCell(arm, training_seed, split, self.tasks(tasks), int(test["first"]), int(seeds),
                                      attempts, f"{run}-{split}{suffix}",
                                      temperature=None if i == 0 and len(self.temperatures) == 1 else temperature))
        on_curve = arm == "zero_shot" or (trained and self.method(arm) != "online")
        if on_curve and first and int(dev.get("curve_seeds", 0)):
            cells.append(EvalCell(arm, training_seed, "dev", self.tasks(self.heldout_tasks), int(dev["curve_first"]),
                                  int(dev["curve_seeds"]), 1, f"{run}-dev"))
        return cells

    def all_cells(self) -> list[EvalCell]:
        return [c for arm in self.arms for seed in self.arm_seeds(arm) for c in self.eval_cells(arm, seed)]

    def policy_seed(self, training_seed: int) -> int:
        return training_seed


def load(name_or_path: str | Path) -> Protocol:
    return Protocol.load(name_or_path)
