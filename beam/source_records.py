"""Format-neutral records that every reader produces and every check consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """A record that passed every check: the image bytes and boxes normalised to [0, 1]."""

    image_id: str
    filename: str
    image_bytes: bytes
    image_format: str  # "jpeg" | "png"
    width: int
    height: int
    color_mode: str  # PIL mode of the source image ("RGB", "L", "CMYK", ...)
    boxes: tuple[tuple[float, float, float, float], ...]  # (xmin, ymin, xmax, ymax)
    class_texts: tuple[str, ...]
    difficult: tuple[bool, ...]
    source_ref: str
    notes: tuple[str, ...] = field(default=())
