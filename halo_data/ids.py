"""Deterministic ids and content hashes.

Ids are derived from what identifies a thing, never from time or randomness, so
a resumed run knows exactly which episodes are missing and a retried write can be
recognised.
"""

from __future__ import annotations

import hashlib
import re

from halo_data.schema import STATE_HASH_VERSION

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    """Run ids become partition folder names, so they are restricted to a safe alphabet."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' or '-' (at most 128, not starting with a symbol)"
        )
    return run_id


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def episode_id(run_id: str, task_id: str, task_seed: int, attempt_idx: int) -> str:
    """The id of one planned episode: the same inputs always give the same id."""
    return sha256_hex(f"episode\x1f{run_id}\x1f{task_id}\x1f{int(task_seed)}\x1f{int(attempt_idx)}")[:24]


def _normalise_url(url: str) -> str:
    # Fragments and trailing slashes do not change the page state a policy sees.
    url = (url or "").split("#", 1)[0]
    return url.rstrip("/")


_BID_ATTR = re.compile(r"\[\d+\]|\bbid=\S+")
_WHITESPACE = re.compile(r"\s+")


def state_hash(url: str, observation: str) -> str:
    """Identity of the page state an action was chosen on.

    Version 1: sha256 of the normalised URL and the observation text with
    BrowserGym element ids removed and whitespace collapsed — element ids are
    assigned per page load and would make the same state look different across
    attempts.
    """
    text = _BID_ATTR.sub("", observation or "")
    text = _WHITESPACE.sub(" ", text).strip()
    return sha256_hex(f"state-v{STATE_HASH_VERSION}\x1f{_normalise_url(url)}\x1f{text}")[:32]


def image_hash(image: bytes) -> str:
    return sha256_hex(image)
