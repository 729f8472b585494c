"""HALO environments, loaded by name so each can land and import on its own.

``miniwob`` (offline MiniWoB++) lives in ``halo_agent.envs.miniwob``; ``real``
(REAL tasks through agisdk) in ``halo_agent.envs.real``. Both implement
``halo_agent.envs.base.Environment``.
"""

from __future__ import annotations

import importlib

from halo_agent.envs.base import EnvError, Environment, PageState, StepOutcome, TaskSpec, UnknownTaskError

# name -> (module, class)
ENVIRONMENTS: dict[str, tuple[str, str]] = {
    "miniwob": ("halo_agent.envs.miniwob", "MiniWoBEnv"),
    "real": ("halo_agent.envs.real", "RealEnv"),
}


class EnvironmentUnavailable(ValueError):
    """The named environment is unknown or its module is not installed."""


def environment_class(name: str) -> type:
    """The environment class registered under ``name`` (imported lazily)."""
    if name not in ENVIRONMENTS:
        raise EnvironmentUnavailable(f"unknown environment {name!r}: choose one of {', '.join(ENVIRONMENTS)}")
    module_name, class_name = ENVIRONMENTS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise EnvironmentUnavailable(
                f"environment {name!r} is not available in this installation ({module_name} is missing)"
            ) from None
        raise EnvironmentUnavailable(f"environment {name!r} needs {e.name}: install HALO with `pip install -e .[agent]`") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise EnvironmentUnavailable(f"{module_name} defines no {class_name}")
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
