"""Deterministic train/val split by a hash of the image id."""

from __future__ import annotations

import hashlib

TRAIN, VAL = "train", "val"


def stable_fraction(key: str, seed: int = 0) -> float:
    """A number in [0, 1) fixed by `key` and `seed`, the same in every process.

    >>> stable_fraction("a") == stable_fraction("a")
    True
    """
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(image_id: str, val_fraction: float, seed: int = 0) -> str:
    return VAL if stable_fraction(image_id, seed) < val_fraction else TRAIN
