"""The one hash rule that places a record: in a split (beam/split.py), in a shard
(shards.py), in the tuning split (components/detector/holdout.py). Stable across processes,
machines and Python's hash seed."""

from __future__ import annotations

import hashlib


def stable_fraction(key: str, seed: int = 0) -> float:
    """A number in [0, 1) fixed by `key` and `seed`, the same in every process.

    >>> stable_fraction("a") == stable_fraction("a")
    True
    """
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
