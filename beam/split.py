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


def read_split_file(path: str) -> dict[str, str]:
    """`{"train": [ids...], "val": [ids...]}` → {image id: split}; an id in both is an error."""
    import json

    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as handle:
        data = json.loads(handle.read())
    if not isinstance(data, dict) or set(data) - {TRAIN, VAL}:
        raise ValueError(f"{path}: a split file is a JSON object with lists under 'train' and 'val'")
    assignment: dict[str, str] = {}
    for split in (TRAIN, VAL):
        for image_id in data.get(split, []):
            if assignment.get(str(image_id), split) != split:
                raise ValueError(f"{path}: image id {image_id!r} is listed in both train and val")
            assignment[str(image_id)] = split
    return assignment
