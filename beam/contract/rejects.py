"""The rows of the rejects files (`rejects-*.jsonl`): what was not written, and why.

One definition for the data job that writes them (`beam/job_transforms.py::WriteRejects`)
and every reader (the CLI's summary, the run report, the gates); the reason codes are
stable strings that the rejects files, `manifest.json` and docs/troubleshooting.md use.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSING_IMAGE = "missing_image"
# An annotation's file name that leaves --images (absolute, `..`, a URL) and whose base name is not inside it.
IMAGE_OUTSIDE_FOLDER = "image_outside_folder"
UNREADABLE_IMAGE = "unreadable_image"
# Pillow reads it, TensorFlow's decoders (what training, evaluation and serving run) do not.
TENSORFLOW_CANNOT_DECODE = "tensorflow_cannot_decode"
UNSUPPORTED_FORMAT = "unsupported_format"
SIZE_MISMATCH = "size_mismatch"
INVALID_BOX = "invalid_box"
BOX_OUTSIDE_IMAGE = "box_outside_image"
UNKNOWN_CLASS = "unknown_class"
DUPLICATE_IMAGE_ID = "duplicate_image_id"
IMAGE_TOO_LARGE = "image_too_large"
NO_BOXES = "no_boxes"
BAD_ANNOTATION = "bad_annotation"
NOT_IN_SPLIT_FILE = "not_in_split_file"


@dataclass(frozen=True)
class Reject:
    """A record that was not written, or one box of a written record that was dropped, with a
    reason code and a one-line message. One row of a rejects file (`rejects-*.jsonl`): its writer
    (`beam/job_transforms.py::WriteRejects`) and every reader go through `to_dict`/`from_dict`.

    A box-level reject (`box_index` set) names the box's index in its annotation and its
    class; the image it came from was written, with its other boxes, to `split`.

    >>> row = Reject("img1", "invalid_box", "box 2 is empty", "a/img1.xml", box_index=2, class_text="cat",
    ...              split="train").to_dict()
    >>> row["box"], row["class"], Reject.from_dict(row).is_box
    (2, 'cat', True)
    """

    image_id: str
    reason: str
    message: str
    source_ref: str
    box_index: int | None = None
    class_text: str | None = None
    split: str | None = None  # where the image of a dropped box was written

    @property
    def is_box(self) -> bool:
        return self.box_index is not None

    def to_dict(self) -> dict:
        row = {"image_id": self.image_id, "reason": self.reason, "message": self.message,
               "source": self.source_ref, "level": "box" if self.is_box else "image"}
        if self.is_box:
            row.update({"box": self.box_index, "class": self.class_text, "split": self.split})
        return row

    @classmethod
    def from_dict(cls, row: dict) -> "Reject":
        """The row `to_dict` wrote; a missing key raises KeyError (a renamed field fails at once)."""
        box = row["level"] == "box"
        return cls(image_id=row["image_id"], reason=row["reason"], message=row["message"], source_ref=row["source"],
                   box_index=row["box"] if box else None, class_text=row["class"] if box else None,
                   split=row["split"] if box else None)
