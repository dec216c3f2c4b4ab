"""Label maps: class name → 1-based id, as in TF OD API label maps."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from beam.contract.manifest import LABEL_MAP_FILES


def derive_label_map(class_names: Iterable[str]) -> dict[str, int]:
    """A stable label map: names sorted, ids from 1.

    >>> derive_label_map(["dog", "cat", "dog"])
    {'cat': 1, 'dog': 2}
    """
    return {name: index for index, name in enumerate(sorted(set(class_names)), start=1)}


def extend_label_map(base: dict[str, int], class_names: Iterable[str]) -> dict[str, int]:
    """`base` restricted to the classes present, plus the new names (sorted) after its
    largest id: a class keeps its id from one dataset version to the next.

    >>> extend_label_map({"cat": 1, "dog": 2}, ["dog", "bird"])
    {'dog': 2, 'bird': 3}
    """
    names = set(class_names)
    kept = {name: index for name, index in base.items() if name in names}
    start = max(base.values(), default=0) + 1
    return {**kept, **{name: start + i for i, name in enumerate(sorted(names - set(base)))}}


def write_label_map(label_map: dict[str, int], path: Path) -> None:
    path.write_text(json.dumps(label_map, indent=2, sort_keys=True) + "\n")


def read_label_map(path: Path) -> dict[str, int]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise ValueError(f"{path}: a label map is a JSON object of class name -> integer id")
    return data


# One `item { ... }` block of a TF OD API label map (StringIntLabelMap in protobuf text
# format). Parsed by hand: the proto is part of the OD API, which is not a dependency.
_ITEM = re.compile(r"item\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"""\b(name|display_name|id)\s*:\s*(?:"([^"]*)"|'([^']*)'|(-?\d+))""")


def parse_pbtxt_label_map(text: str, source: str = "label_map.pbtxt") -> dict[str, int]:
    """A TF OD API `label_map.pbtxt` as name -> id (`name`, else `display_name`).

    >>> parse_pbtxt_label_map("item { id: 1 name: 'cat' } item { name: \\"dog\\" id: 3 }")
    {'cat': 1, 'dog': 3}
    """
    label_map: dict[str, int] = {}
    for number, block in enumerate(_ITEM.findall(text), start=1):
        fields = {key: quoted or single or digits for key, quoted, single, digits in _FIELD.findall(block)}
        name = fields.get("name") or fields.get("display_name")
        if not name or "id" not in fields or int(fields["id"]) < 1:
            raise ValueError(f"{source}: item {number} needs a name and an id >= 1")
        label_map[name] = int(fields["id"])
    if not label_map:
        raise ValueError(f"{source}: no `item {{ name: ... id: ... }}` entries")
    return label_map


def read_dataset_label_map(data_dir: str) -> dict[str, int]:
    """The classes of a shard folder: `label_map.json` (detpipe) or `label_map.pbtxt` (TF OD API)."""
    import tensorflow as tf  # here: the job's workers import this module and do without TensorFlow

    root = data_dir.rstrip("/")
    for name in LABEL_MAP_FILES:
        path = f"{root}/{name}"
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as handle:
                text = handle.read()
            return json.loads(text) if name.endswith(".json") else parse_pbtxt_label_map(text, path)
    raise FileNotFoundError(f"no {' or '.join(LABEL_MAP_FILES)} in {data_dir}: "
                            "is it the output of `detpipe data build`?")


def num_class_slots(label_map: dict[str, int]) -> int:
    """Classes the model's head needs: ids may have gaps (OD API label maps), so one slot
    per id up to the largest."""
    return max(label_map.values())
