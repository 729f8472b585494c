"""Estimated cost of a model call from a price table (``halo_agent/configs/prices.yaml``).

    estimate_cost("gpt-4o", prompt_tokens=1200, completion_tokens=20)   # 0.0032

The tokens are the ones the endpoint reported in its ``usage`` field; the table
gives prices per million input and output tokens, by model name (a dated
snapshot such as ``gpt-4o-2024-08-06`` is priced as its longest listed prefix).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from halo_data.config import load_yaml_or_json

PRICES_FILE = Path(__file__).parent / "configs" / "prices.yaml"
PRICES_ENV_VAR = "HALO_PRICES"


class PriceTableError(ValueError):
    """The price table is malformed; the message names the entry."""


def load_prices(path: str | None = None) -> dict[str, tuple[float, float]]:
    """Model name -> (input, output) USD per million tokens; the key ``""`` is the default."""
    return _load(str(path or os.environ.get(PRICES_ENV_VAR) or PRICES_FILE))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, tuple[float, float]]:
    source = Path(path)
    data = load_yaml_or_json(source)
    table = {"": _price(source, "default", data.get("default") or {})}
    for model, entry in (data.get("models") or {}).items():
        table[str(model)] = _price(source, str(model), entry)
    return table


def _price(source: Path, name: str, entry: object) -> tuple[float, float]:
    if not isinstance(entry, dict) or set(entry) - {"input", "output"}:
        raise PriceTableError(f"{source}: {name} needs input and output prices per million tokens")
    try:
        return float(entry.get("input", 0.0)), float(entry.get("output", 0.0))
    except (TypeError, ValueError):
        raise PriceTableError(f"{source}: {name}: prices must be numbers") from None


def estimate_cost(model: str | None, prompt_tokens: int | None, completion_tokens: int | None, path: str | None = None) -> float | None:
    """USD for one call, or None when the endpoint reported no usage."""
    if prompt_tokens is None and completion_tokens is None:
        return None
    prices = load_prices(path)
    name = model or ""
    match = max((m for m in prices if m and name.startswith(m)), key=len, default="")
    per_input, per_output = prices[match]
    return ((prompt_tokens or 0) * per_input + (completion_tokens or 0) * per_output) / 1_000_000
