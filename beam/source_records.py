"""Format-neutral records that every reader produces and every check consumes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class AnnotationError(ValueError):
    """An annotation file that cannot be parsed into records at all."""


def image_id_from_filename(filename: str) -> str:
    """The image id in every format: the file name without folders or extension, so the same
    dataset as VOC, COCO or CSV gives the same records.

    >>> image_id_from_filename("sub/dir/raccoon-1.jpg")
    'raccoon-1'
    """
    return filename.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def number_or_nan(value) -> float:
    """`float(value)`, or NaN when it is missing or not a number: the record checks then
    reject the record with a reason instead of the reader failing the whole job."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def optional_size(value: float) -> int | None:
    """An annotated width/height in pixels, or None when the annotation gives none."""
    return int(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class SourceBox:
    """One annotated box in pixel coordinates, as the annotation file states it."""

    class_text: str
    xmin: float
    ymin: float
    xmax: float
    ymax: float
    difficult: bool = False


@dataclass(frozen=True)
class SourceRecord:
    """One image and its boxes as read from an annotation source.

    `source_ref` says where the record came from (file, line or annotation id) so
    that a reject can point a person straight at it.
    """

    image_id: str
    filename: str
    width: int | None
    height: int | None
    boxes: tuple[SourceBox, ...]
    source_ref: str


@dataclass(frozen=True)
class Reject:
    """A record that was not written, with a reason code and a one-line message."""

    image_id: str
    reason: str
    message: str
    source_ref: str

    def to_json_dict(self) -> dict:
        return {
            "image_id": self.image_id,
            "reason": self.reason,
            "message": self.message,
            "source": self.source_ref,
        }


@dataclass(frozen=True)
class CheckedRecord:
    """A record that passed every check, with boxes normalised to [0, 1].

    It holds no pixels: the shard writer reads the image again at `image_path` and
    checks it against `image_sha256`, so only small records flow through the job's
    shuffles and memory does not grow with the size of the images.
    """

    image_id: str
    filename: str
    image_path: str
    image_sha256: str
    image_size: int  # bytes
    image_format: str  # "jpeg" | "png"
    width: int
    height: int
    color_mode: str  # PIL mode of the source image ("RGB", "L", "CMYK", ...)
    boxes: tuple[tuple[float, float, float, float], ...]  # (xmin, ymin, xmax, ymax)
    class_texts: tuple[str, ...]
    difficult: tuple[bool, ...]
    source_ref: str
    notes: tuple[str, ...] = field(default=())
    exif_orientation: int = 1  # the image's EXIF orientation (1: none)
    # The shard gets the image as displayed (EXIF applied, beam/exif.py), and width,
    # height and boxes are in that frame.
    orientation_applied: bool = False
