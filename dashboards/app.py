"""HALO dashboard: rewards, zero-std fractions and screenshot replay over a lake.

    halo-data dashboard --lake lake/ [--port 8501] [--host 127.0.0.1]
    python -m dashboards --lake lake/ [--port 8501] [--host 127.0.0.1]

Reads only the lake, through the same tables and views as ``halo-data query``.
"""

from __future__ import annotations


import streamlit as st

from dashboards import data


st.set_page_config(page_title="HALO", page_icon="🛰", layout="wide")

st.session_state[data.LAKE_ROOT_KEY] = data.lake_root_from_argv()

pages = [
    st.Page("app_pages/overview.py", title="Overview", default=True),
    st.Page("app_pages/rewards.py", title="Rewards"),
    st.Page("app_pages/grpo.py", title="GRPO health"),
    st.Page("app_pages/replay.py", title="Replay"),
    st.Page("app_pages/training.py", title="Training"),
    st.Page("app_pages/search.py", title="Search trees"),
    st.Page("app_pages/errors.py", title="Errors"),
    st.Page("app_pages/compare.py", title="Compare"),
    st.Page("app_pages/experiments.py", title="Experiments"),
    st.Page("app_pages/sql.py", title="SQL"),
]
page = st.navigation(pages)

with st.sidebar:
    st.caption(f"Lake: `{st.session_state[data.LAKE_ROOT_KEY]}`")
    if st.button("Refresh", help="Read the newest table versions now (otherwise every few seconds)."):
        data.refresh()

page.run()
