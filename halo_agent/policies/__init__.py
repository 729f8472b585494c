"""HALO policies, loaded by name so each can land and import on its own.

A policy module either defines ``make_policy(**options) -> Policy`` or the class
named here; either is called with keyword options ``model``, ``adapter``,
``temperature``, ``seed`` and whatever the run's ``policy_options`` hold
(``base_url``, ``use_screenshot``, ``max_tokens``, ...). Policies implement
``halo_agent.types.Policy``.
"""

from __future__ import annotations

import inspect
from typing import Any

from halo_agent.plugins import import_registered
from halo_agent.types import Policy

# name -> (module, class)
POLICIES: dict[str, tuple[str, str]] = {
    "random": ("halo_agent.policies.random_policy", "RandomPolicy"),
    "openai": ("halo_agent.policies.openai_policy", "OpenAIPolicy"),
    "hf": ("halo_agent.policies.hf_policy", "HFPolicy"),
    "hierarchy": ("halo_agent.hierarchy.orchestrator", "HierarchicalPolicy"),
    "goal_match": ("halo_agent.policies.goal_match_policy", "GoalMatchPolicy"),
}


class PolicyUnavailable(ValueError):
    """The named policy is unknown or its module is not installed."""


def _factory(name: str):
    module, class_name = import_registered("policy", name, POLICIES, PolicyUnavailable)
    factory = getattr(module, "make_policy", None) or getattr(module, class_name, None)
    if factory is None:
        raise PolicyUnavailable(f"{module.__name__} defines neither make_policy nor {class_name}")
    return factory


def check_policy(name: str) -> None:
    """Raise ``PolicyUnavailable`` now (in the parent process) rather than in every worker."""
    _factory(name)


def make_policy(name: str, **options: Any) -> Policy:
    """Build the policy registered under ``name`` with keyword options (unknown ones are dropped
    when the factory does not take ``**kwargs``)."""
    factory = _factory(name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        options = {k: v for k, v in options.items() if k in params}
    return factory(**options)


__all__ = ["POLICIES", "PolicyUnavailable", "check_policy", "make_policy"]
