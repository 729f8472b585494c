"""HALO's data layer: the lake (Delta tables of Parquet), its DuckDB views and the ``halo-data`` CLI."""

from halo_data._version import __version__
from halo_data.lake import Lake, LakeError

__all__ = ["Lake", "LakeError", "__version__"]
