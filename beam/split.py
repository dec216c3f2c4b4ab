"""Deterministic train/val split by a hash of the image id."""

from __future__ import annotations

from dataclasses import dataclass

from beam.contract.stable_hash import stable_fraction

TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class GivenSplit:
    """A dataset that comes split (COCO's train2017 and val2017 files, a Roboflow export's
    train/ and valid/ folders, TF OD API-style train_labels.csv and test_labels.csv): the
    val records are those read from `val_annotations` (a VOC folder, or a COCO or CSV file),
    with their images under `val_images`; every other record is train.

    >>> given = GivenSplit("ds/valid/_annotations.coco.json", "ds/valid")
    >>> given.split_of("ds/valid/_annotations.coco.json#image=3"), given.split_of("ds/train/a.json#image=3")
    ('val', 'train')
    >>> [GivenSplit("l/test.csv", "i").split_of(ref) for ref in ("l/test.csv:4-6", "l/train.csv:4", "l/test.csv.1:2")]
    ['val', 'train', 'train']
    >>> GivenSplit("ds/val_xml/", "ds/img").split_of("ds/val_xml/a.xml"), GivenSplit("ds", "i").split_of("ds/t/a.xml")
    ('val', 'train')
    """

    val_annotations: str
    val_images: str

    def split_of(self, source_ref: str) -> str:
        """The split of a record by the source it was read from: a COCO record's
        `FILE#image=ID`, a CSV record's `FILE:LINE` or `FILE:FIRST-LAST`, or a VOC record's
        XML file (listed from its folder, not below)."""
        given = self.val_annotations.rstrip("/")
        if source_ref.startswith((given + "#", given + ":")) or source_ref.rpartition("/")[0] == given:
            return VAL
        return TRAIN


def given_split_conflict(split_file: str | None, val_annotations: str | None, val_images: str | None) -> str | None:
    """What is wrong with how a build is told its split, else None.

    >>> given_split_conflict("s.json", "val.json", None)
    '--val-annotations and --split-file both say which images are val: give one'
    """
    if val_images and not val_annotations:
        return "--val-images needs --val-annotations (the val split's annotations)"
    if val_annotations and split_file:
        return "--val-annotations and --split-file both say which images are val: give one"
    return None


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
