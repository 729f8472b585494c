"""The verified action cache: actions that worked from a page state, read from the lake's ``verified_actions`` view.

    version = snapshot_version(lake)                      # recorded in the run's lineage
    cache = VerifiedActionCache.from_lake(lake, version)
    hit = cache.lookup(obs)                               # a CacheHit (entry + concrete action) or None
    cache.invalidate(hit.entry)                           # the replay failed: never offered again

The cache is read once, as of one version of ``steps``, so two runs on one lake
version replay the same actions. Element ids change between loads of one page
state, so an entry names its element by the text of its AXTree line and the
lookup finds that element's id on the current page (a miss when it is gone).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Iterable

from halo_agent.types import Observation

log = logging.getLogger(__name__)

SCOPES = ("task", "site")
_AXTREE_LINE = re.compile(r"^\s*\[([^\]]+)\]\s*(.*?)\s*$")


class CacheError(ValueError):
    """The cache cannot be read as configured; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    scope: str  # task | site
    key: str
    state_hash: str
    action: str
    action_template: str  # the action with its element id as <bid>
    target: str  # the element's AXTree line text; "" for actions without an element
    support: int
    tries: int
    success_rate: float
    action_rank: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "CacheEntry":
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class CacheHit:
    entry: CacheEntry
    action: str  # the entry's action on the current page's element ids


def snapshot_version(lake) -> int:
    """The version of ``steps`` a cache read now would see."""
    return int(lake.versions()["steps"])


def element_ids_by_line(axtree: str) -> dict[str, list[str]]:
    """AXTree line text (without its element id) -> the ids of the elements on such lines, in page order."""
    out: dict[str, list[str]] = {}
    for line in (axtree or "").splitlines():
        m = _AXTREE_LINE.match(line)
        if m:
            out.setdefault(m.group(2), []).append(m.group(1))
    return out


class VerifiedActionCache:
    """Entries by (scope, key, state_hash), best first; ``min_support`` and ``min_success_rate`` filter them."""

    def __init__(self, entries: Iterable[CacheEntry], scopes: Iterable[str] = ("task",), min_support: int = 1,
                 min_success_rate: float = 0.5, version: int | None = None):
        unknown = set(scopes) - set(SCOPES)
        if unknown:
            raise CacheError(f"cache scopes are {', '.join(SCOPES)}, got {', '.join(sorted(unknown))}")
        self.scopes = tuple(scopes)
        self.version = version
        self._entries: dict[tuple[str, str, str], list[CacheEntry]] = {}
        for e in sorted(entries, key=lambda e: e.action_rank):
            if e.support >= min_support and e.success_rate >= min_success_rate:
                self._entries.setdefault((e.scope, e.key, e.state_hash), []).append(e)
        self.invalidated: set[CacheEntry] = set()

    @classmethod
    def from_lake(cls, lake, version: int | None = None, **options: Any) -> "VerifiedActionCache":
        """The entries of ``verified_actions`` as of ``version`` of ``steps`` (default: the current one)."""
        version = snapshot_version(lake) if version is None else int(version)
        rows = lake.query_arrow("select * from verified_actions", as_of={"steps": version}, views="verified_actions").to_pylist()
        log.info("verified action cache: %d entries as of steps version %d", len(rows), version)
        return cls((CacheEntry.from_row(r) for r in rows), version=version, **options)

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def lookup(self, obs: Observation, state_hash: str) -> CacheHit | None:
        """The best entry for this page that is not invalidated and whose element is on the page."""
        lines = None
        for scope in self.scopes:
            key = obs.task_id if scope == "task" else obs.site
            for entry in self._entries.get((scope, key or "", state_hash), ()):
                if entry in self.invalidated:
                    continue
                if not entry.target:
                    return CacheHit(entry, entry.action)
                lines = element_ids_by_line(obs.axtree) if lines is None else lines
                ids = lines.get(entry.target)
                if ids:
                    return CacheHit(entry, entry.action_template.replace("<bid>", repr(ids[0]), 1))
        return None

    def invalidate(self, entry: CacheEntry) -> None:
        log.info("cache entry for state %s invalidated: %s failed", entry.state_hash[:12], entry.action)
        self.invalidated.add(entry)
