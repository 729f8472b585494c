"""HALO environments, loaded by name so each can land and import on its own.

``miniwob`` (offline MiniWoB++) lives in ``halo_agent.envs.miniwob``; ``real``
(REAL tasks through agisdk) in ``halo_agent.envs.real``; ``os`` (bash tasks in a throwaway
sandbox) in ``halo_agent.envs.os_env``. All implement
``halo_agent.envs.base.Environment``.
"""

from __future__ import annotations

from halo_agent.envs.base import EnvError, Environment, PageState, StepOutcome, TaskSpec, UnknownTaskError
from halo_agent.plugins import import_registered

# name -> (module, class)
ENVIRONMENTS: dict[str, tuple[str, str]] = {
    "miniwob": ("halo_agent.envs.miniwob", "MiniWoBEnv"),
    "real": ("halo_agent.envs.real", "RealEnv"),
    "os": ("halo_agent.envs.os_env", "OSEnv"),
}


class EnvironmentUnavailable(ValueError):
    """The named environment is unknown or its module is not installed."""


def environment_class(name: str) -> type:
    """The environment class registered under ``name`` (imported lazily)."""
    module, class_name = import_registered("environment", name, ENVIRONMENTS, EnvironmentUnavailable)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise EnvironmentUnavailable(f"{module.__name__} defines no {class_name}")
    return cls


__all__ = [
    "ENVIRONMENTS",
    "EnvError",
    "Environment",
    "EnvironmentUnavailable",
    "PageState",
    "StepOutcome",
    "TaskSpec",
    "UnknownTaskError",
    "environment_class",
]
