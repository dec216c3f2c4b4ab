"""Label maps: class name → 1-based id, as in TF OD API label maps."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def derive_label_map(class_names: Iterable[str]) -> dict[str, int]:
    """A stable label map: names sorted, ids from 1.

    >>> derive_label_map(["dog", "cat", "dog"])
    {'cat': 1, 'dog': 2}
    """
    return {name: index for index, name in enumerate(sorted(set(class_names)), start=1)}


def write_label_map(label_map: dict[str, int], path: Path) -> None:
    path.write_text(json.dumps(label_map, indent=2, sort_keys=True) + "\n")


def read_label_map(path: Path) -> dict[str, int]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise ValueError(f"{path}: a label map is a JSON object of class name -> integer id")
    return data
