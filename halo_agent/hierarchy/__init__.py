"""The hierarchical agent: a worker policy under a manager model, a verified action cache, macros and recovery.

    from halo_agent.policies import make_policy
    policy = make_policy("hierarchy", worker="openai", model="qwen_worker_bc", manager={"model": "gpt-4o"},
                         cache=True, lake="lake", macros=True)

The parts:

- ``orchestrator``: ``HierarchicalPolicy``, which chooses each step's source of action;
- ``manager``: ``Manager`` (any OpenAI-compatible model) and ``parse_advice``;
- ``cache``: ``VerifiedActionCache``, read from the lake's ``verified_actions`` view as of one version;
- ``macros``: ``MACROS`` (log_in, search, fill_form, add_to_cart, close_modal) with their preconditions;
- ``recovery``: ``LoopDetector`` and ``Recovery`` (clear an obstruction, an alternative element, back, scroll).

Every step lands with its ``action_source``: worker, manager, cache, macro or recovery.
"""

from halo_agent.hierarchy.cache import CacheEntry, CacheHit, VerifiedActionCache, snapshot_version
from halo_agent.hierarchy.macros import MACROS, Macro, MacroPlan, MacroRefused, goal_fields
from halo_agent.hierarchy.manager import Advice, Manager, parse_advice
from halo_agent.hierarchy.orchestrator import HierarchicalPolicy
from halo_agent.hierarchy.recovery import LoopDetector, Recovery

__all__ = [
    "MACROS", "Advice", "CacheEntry", "CacheHit", "HierarchicalPolicy", "LoopDetector", "Macro", "MacroPlan",
    "MacroRefused", "Manager", "Recovery", "VerifiedActionCache", "goal_fields", "parse_advice", "snapshot_version",
]
