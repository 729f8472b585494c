"""Loading registered implementations (environments, policies) by name, lazily.

Each lives in its own module so it can be installed and imported on its own; a
missing module or dependency becomes one error line that says what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def import_registered(kind: str, name: str, registry: dict[str, tuple[str, str]], error: type[Exception]) -> tuple[ModuleType, str]:
    """The module registered under ``name`` and the class name it should define."""
    if name not in registry:
        raise error(f"unknown {kind} {name!r}: choose one of {', '.join(registry)}")
    module_name, class_name = registry[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise error(f"{kind} {name!r} is not available in this installation ({module_name} is missing)") from None
        raise error(f"{kind} {name!r} needs the package {e.name!r}: install HALO with `pip install -e .[agent]`") from None
    return module, class_name
