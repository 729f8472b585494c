"""HALO's data layer: the lake (Delta tables of Parquet), its DuckDB views and the ``halo-data`` CLI."""

__version__ = "0.1.0"

from halo_data.lake import Lake, LakeError  # noqa: E402

__all__ = ["Lake", "LakeError", "__version__"]
