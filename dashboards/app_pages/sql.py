"""SQL: read-only ad-hoc queries over the lake's tables and views, refused like `halo-data query`."""

from __future__ import annotations

import time

import streamlit as st

from dashboards import data
from halo_data.lake import LakeError
from halo_data.query import check_read_only, run_query
from halo_data.views import all_views

MAX_ROWS_SHOWN = 10_000

st.title("SQL")
snap = data.current_snapshot()
if snap is not None:
    with st.expander("Tables and views"):
        from halo_data import schema as S

        st.markdown("\n".join(f"- `{name}`: {spec.doc}" for name, spec in S.TABLES.items()))
        st.markdown("\n".join(f"- `{v.name}`: {v.description}" for v in all_views()))
    sql = st.text_area("Read-only SQL (SELECT, DESCRIBE, SHOW, EXPLAIN)", "SELECT * FROM reward_stats", height=150, key="sql_text")
    if st.button("Run", key="sql_run", type="primary"):
        try:
            check_read_only(sql)
            started = time.perf_counter()
            # Pinned to the snapshot the other pages show.
            result = run_query(snap.lake, sql, as_of=dict(snap.versions))
            seconds = time.perf_counter() - started
        except LakeError as e:  # QueryError (refused or failed SQL) included
            st.error(str(e))
        else:
            shown = result.slice(0, MAX_ROWS_SHOWN).to_pandas()
            note = f" (first {MAX_ROWS_SHOWN:,} shown)" if result.num_rows > MAX_ROWS_SHOWN else ""
            st.caption(f"{result.num_rows:,} rows in {seconds * 1000:.0f} ms{note}")
            st.dataframe(shown, hide_index=True, width="stretch")
            st.download_button("Download CSV", shown.to_csv(index=False), "query.csv", "text/csv", key="sql_download")
