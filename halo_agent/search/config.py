"""What a search run is asked to do: the rollout's options (env, tasks, policy, lake) plus the search's own."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from halo_agent.rollout.config import RolloutConfig, RolloutError

BACKUPS = ("success", "progress")


class SearchError(RolloutError):
    """A search that cannot start as configured; the message says what to change."""


def _f(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class SearchOptions:
    """How a tree is searched (the paper's open choices): shared by ``halo-agent search`` and ``halo-train mcts``."""

    simulations: int = _f(32, "Simulations per tree (S).")
    expansions: int = _f(4, "Candidate actions sampled in one policy call at each expanded node (K).")
    c_exp: float = _f(1.0, "Exploration constant c of UCB1.")
    alpha: float = _f(0.5, "Q = alpha * Q_mcts + (1 - alpha) * Q_critic.")
    max_depth: int = _f(6, "Deepest node (actions from the root); simulations stop there too.")
    critic: str = _f("progress", "progress | policy (the policy's endpoint ranks its own candidates) | a model served at --critic-base-url.")
    theta: float = _f(0.1, "Smallest Q difference between sibling actions that makes a preference pair (stored for mcts_pairs).")
    widen: float = _f(0.0, "Progressive widening: a node gets K more candidates while it has fewer than K * (visits + 1) ** widen children (0: off, Agent Q's one expansion per node).")

    def check_search_options(self, error: type[Exception]) -> None:
        """Raise ``error`` with a line saying what to change, for the first option out of range."""
        for name in ("expansions", "simulations", "max_depth"):
            if int(getattr(self, name)) < 1:
                label = "--expansions (K)" if name == "expansions" else f"--{name.replace('_', '-')}"
                raise error(f"{label} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= float(self.alpha) <= 1.0:
            raise error(f"--alpha must be in [0, 1], got {self.alpha}")
        if min(float(self.c_exp), float(self.theta), float(self.widen)) < 0:
            raise error(f"--c-exp, --theta and --widen must be >= 0, got {self.c_exp}, {self.theta} and {self.widen}")
        if not str(self.critic or "").strip():
            raise error("--critic is empty: use progress, policy or a model name")


@dataclasses.dataclass
class SearchConfig(RolloutConfig, SearchOptions):
    """One tree per (task, task seed): ``task_seeds`` seeds from ``task_seed`` (or ``seed``) on."""

    critic_base_url: str | None = _f(None, "OpenAI-compatible endpoint of a model critic (default $HALO_VLLM_URL, $OPENAI_BASE_URL).")
    backup: str = _f("success", "success: back up the environment's reward; progress: plus the dense progress reached.")
    task_seeds: int = _f(1, "Trees per task: task seeds task_seed, task_seed+1, ...")
    max_env_steps: int | None = _f(None, "Stop a tree once it has taken this many environment steps (replays included).")
    stop_on_success: bool = _f(False, "Stop a tree at its first successful terminal node.")

    def __post_init__(self) -> None:
        if self.mode is None:
            self.mode = "mcts"
        super().__post_init__()
        self.check_search_options(SearchError)
        if self.backup not in BACKUPS:
            raise SearchError(f"--backup must be one of {', '.join(BACKUPS)}, got {self.backup!r}")
        if int(self.task_seeds) < 1:
            raise SearchError(f"--task-seeds must be at least 1, got {self.task_seeds}")
        if self.max_env_steps is not None and int(self.max_env_steps) < 1:
            raise SearchError(f"--max-env-steps must be at least 1, got {self.max_env_steps}")

    @property
    def effective_max_steps(self) -> int:
        return int(self.max_depth)

    def search_params(self) -> dict[str, Any]:
        """What the paper leaves open, stored with every tree in its run's row."""
        return {
            "alpha": float(self.alpha), "expansions": int(self.expansions), "c_exp": float(self.c_exp),
            "theta": float(self.theta), "max_depth": int(self.max_depth), "simulations": int(self.simulations), "widen": float(self.widen),
            "critic": self.critic, "backup": self.backup,
        }

    def to_json(self) -> str:
        data = json.loads(super().to_json())
        data["search"] = self.search_params()
        return json.dumps(data, sort_keys=True, default=str)
