"""HALO's Streamlit dashboard over a lake."""
