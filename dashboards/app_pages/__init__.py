"""Streamlit page scripts of the dashboard (run by st.navigation in dashboards/app.py, not imported)."""
