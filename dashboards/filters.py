"""Filters shared by pages: run, site, task and mode, applied to the `episodes` view in SQL."""

from __future__ import annotations

import dataclasses
from typing import Any

import streamlit as st

from dashboards.data import Snapshot

OPTIONS_SQL = "SELECT DISTINCT run_id, site, task_id, mode FROM steps"


@dataclasses.dataclass(frozen=True)
class EpisodeFilter:
    runs: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()

    def where(self, prefix: str = "") -> tuple[str, dict[str, Any]]:
        """A SQL condition over the episodes view's columns and its parameters (empty filter = all)."""
        parts, params = ["true"], {}
        for column, values, name in (
            ("run_id", self.runs, "f_runs"),
            ("site", self.sites, "f_sites"),
            ("task_id", self.tasks, "f_tasks"),
            ("mode", self.modes, "f_modes"),
        ):
            if values:
                parts.append(f"list_contains(${name}, {prefix}{column})")
                params[name] = list(values)
        return " AND ".join(parts), params


def _sorted(values) -> list[str]:
    return sorted({v for v in values if isinstance(v, str)})


def episode_filter(snap: Snapshot, key: str) -> EpisodeFilter:
    """Four multiselects (in the sidebar); an empty one means 'all'."""
    options = snap.df(OPTIONS_SQL)
    with st.sidebar:
        st.markdown("**Filters**")
        runs = st.multiselect("Run", _sorted(options.run_id), key=f"{key}_runs", placeholder="all runs")
        narrowed = options[options.run_id.isin(runs)] if runs else options
        sites = st.multiselect("Site", _sorted(narrowed.site), key=f"{key}_sites", placeholder="all sites")
        if sites:
            narrowed = narrowed[narrowed.site.isin(sites)]
        tasks = st.multiselect("Task", _sorted(narrowed.task_id), key=f"{key}_tasks", placeholder="all tasks")
        modes = st.multiselect("Mode", _sorted(narrowed["mode"]), key=f"{key}_modes", placeholder="all modes")
    return EpisodeFilter(tuple(runs), tuple(sites), tuple(tasks), tuple(modes))
