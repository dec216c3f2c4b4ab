"""Per-record checks: a `SourceRecord` becomes a `CheckedRecord` or a `Reject`.

The reason codes are in beam/contract/rejects.py.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from beam.contract import images
from beam.contract.exif import apply_orientation, check_exif_mode, displayed_size
from beam.contract.images import (IMAGE_SUFFIXES, MAX_IMAGE_PIXELS, ImageTooLarge, UnreadableFormat, inspect_image,
                                  needs_conversion, written_format)
from beam.contract.rejects import (BAD_ANNOTATION, BOX_OUTSIDE_IMAGE, IMAGE_TOO_LARGE, INVALID_BOX, MISSING_IMAGE,
                                   NO_BOXES, SIZE_MISMATCH, TENSORFLOW_CANNOT_DECODE, UNKNOWN_CLASS, UNREADABLE_IMAGE,
                                   UNSUPPORTED_FORMAT, Reject)
from beam.source_records import CheckedRecord, SourceBox, SourceRecord, base_name, has_image_suffix

# What a box that cannot be trusted on its own (empty, inverted, NaN, zero area after
# clipping, outside the image) costs: itself (the image is written with its other boxes, as
# the TF OD API converters do) or, as before, the whole image.
DROP_BOX, REJECT_IMAGE = "drop", "reject-image"
BAD_BOX_MODES = (DROP_BOX, REJECT_IMAGE)


@dataclass(frozen=True)
class CheckOptions:
    """Knobs of the checks; the defaults suit most datasets."""

    # A box may stick out of the image by this many pixels and is clipped; beyond, rejected.
    clip_tolerance_px: float = 2.0
    max_pixels: int = MAX_IMAGE_PIXELS
    keep_empty: bool = True
    label_map: dict[str, int] | None = None
    exif: str = "auto"  # beam/contract/exif.py: which frame the annotations were made in
    bad_box: str = DROP_BOX  # one of BAD_BOX_MODES

    def __post_init__(self):
        check_exif_mode(self.exif)  # at once, not at the first photo with an orientation
        if self.bad_box not in BAD_BOX_MODES:
            raise ValueError(f"bad_box must be one of {', '.join(BAD_BOX_MODES)}, got {self.bad_box!r}")


def _reject(record: SourceRecord, reason: str, message: str) -> Reject:
    return Reject(record.image_id, reason, message, record.source_ref)


def _unsupported(record: SourceRecord, fmt: str) -> Reject:
    message = f"image {record.filename!r} is {fmt}; accepted: {images.ACCEPTED}"
    return _reject(record, UNSUPPORTED_FORMAT, message)


def _notes(mode: str, orientation: int, applied: bool, fmt: str) -> tuple[str, ...]:
    """What a written record says of how its image was taken: a colour mode other than RGB, an
    EXIF orientation (applied or ignored), a format converted to PNG."""
    return (() if mode == "RGB" else (f"color_mode:{mode}",)) + (
        () if orientation == 1 else (f"exif_orientation:{orientation}:{'applied' if applied else 'ignored'}",)) + (
        (f"converted:{fmt}:png",) if needs_conversion(fmt) else ())


def check_record(
    record: SourceRecord, image_bytes: bytes | None, options: CheckOptions, image_path: str = ""
) -> CheckedRecord | Reject:
    """Run every per-record check; the first failure of the image decides the reject reason.
    A box that fails on its own is dropped (`dropped_boxes`) or, with `bad_box="reject-image"`,
    rejects the image."""
    if image_bytes is None:
        tried = "" if has_image_suffix(record.filename) else f" (nor with any of {', '.join(IMAGE_SUFFIXES)})"
        return _reject(record, MISSING_IMAGE, f"image file {record.filename!r} not found{tried}")
    if not image_bytes:
        return _reject(record, UNREADABLE_IMAGE, f"image {record.filename!r} is an empty file (0 bytes)")
    try:  # the header: the pixels are decoded below, by the decoder that will read them
        fmt, width, height, mode, orientation = inspect_image(image_bytes, decode=False)
    except ImageTooLarge as err:
        return _reject(record, IMAGE_TOO_LARGE, f"image {record.filename!r}: {err}")
    except UnreadableFormat as err:
        return _unsupported(record, str(err))
    except ValueError as err:
        return _reject(record, UNREADABLE_IMAGE, f"image {record.filename!r} cannot be decoded: {err}")
    image_format = written_format(fmt)
    if image_format is None:
        return _unsupported(record, fmt)
    if width * height > options.max_pixels:
        return _reject(record, IMAGE_TOO_LARGE, f"image is {width}x{height}, over the limit of {options.max_pixels} pixels")
    annotated = (record.width, record.height) if record.width is not None and record.height is not None else None
    applied = apply_orientation(orientation, (width, height), annotated, options.exif)
    problem = _pixels_reject(record, image_bytes, fmt, rewritten=applied or needs_conversion(fmt))
    if problem is not None:
        return problem
    displayed = displayed_size(width, height, orientation)
    frame = displayed if applied else (width, height)
    if annotated is not None and annotated != frame:
        turned = "" if displayed == (width, height) else (
            f" (EXIF orientation {orientation} would make it {displayed[0]}x{displayed[1]}"
            + (", but --exif ignore keeps the stored pixels)" if options.exif == "ignore" and annotated == displayed
               else ")"))
        return _reject(record, SIZE_MISMATCH,
                       f"annotation says {annotated[0]}x{annotated[1]}, image is {width}x{height}{turned}")
    width, height = frame  # boxes are in the annotation's frame, which the shard's pixels now follow
    checked = checked_boxes(record, width, height, options)
    if isinstance(checked, Reject):
        return checked
    boxes, texts, difficult, dropped = checked
    if not boxes and not options.keep_empty:
        why = f"all {len(dropped)} box(es) dropped (first: {dropped[0].message})" if dropped else "no boxes"
        return _reject(record, NO_BOXES, f"{why} (negatives are rejected by option)")
    converted = needs_conversion(fmt)
    # A name given without its suffix (`000005`) is written as the file found (`000005.jpg`).
    found, named = base_name(image_path), base_name(record.filename)
    return CheckedRecord(
        image_id=record.image_id, image_path=image_path or record.filename,
        filename=found if found.startswith(named + ".") else record.filename,
        image_sha256=hashlib.sha256(image_bytes).hexdigest(), image_size=len(image_bytes),
        image_format=image_format, width=width, height=height, color_mode=mode,
        boxes=tuple(boxes), class_texts=tuple(texts), difficult=tuple(difficult),
        source_ref=record.source_ref, notes=_notes(mode, orientation, applied, fmt), exif_orientation=orientation,
        orientation_applied=applied,
        dropped_boxes=tuple(dropped), converted_from=fmt if converted else "",
    )


def checked_boxes(record: SourceRecord, width: int, height: int, options: CheckOptions
                  ) -> tuple[list, list, list, list] | Reject:
    """The record's boxes in a `width` x `height` frame: (clipped normalised boxes, class names,
    difficult flags, the boxes dropped as `Reject`s), or the `Reject` of the whole image when a
    box cannot be trusted and costs it (no class, a class outside the label map, or any bad box
    with `bad_box="reject-image"`)."""
    boxes, texts, difficult, dropped = [], [], [], []
    for index, box in enumerate(record.boxes):
        where = f"box {index} ({box.class_text!r})"
        # A box with no class, or one outside a given label map, stands for a real object:
        # dropping it would teach the model that object is background, so the image goes.
        if not box.class_text:
            return _reject(record, BAD_ANNOTATION, f"{where} has no class name")
        if options.label_map is not None and box.class_text not in options.label_map:
            return _reject(record, UNKNOWN_CLASS, f"{where}: class {box.class_text!r} is not in the label map")
        problem = box_problem(box, width, height, options.clip_tolerance_px)
        if problem is not None:
            reason, what = problem
            if options.bad_box == REJECT_IMAGE:
                return _reject(record, reason, f"{where} {what}")
            dropped.append(Reject(record.image_id, reason, f"{where} {what}", record.source_ref,
                                  box_index=index, class_text=box.class_text))
            continue
        boxes.append(clipped_box(box, width, height))
        texts.append(box.class_text)
        difficult.append(box.difficult)
    return boxes, texts, difficult, dropped


def _pixels_reject(record: SourceRecord, image_bytes: bytes, fmt: str, rewritten: bool) -> Reject | None:
    """`decoding.pixels_problem` as a reject: `unreadable_image`, or `tensorflow_cannot_decode` (a
    damaged JPEG Pillow fills in and TensorFlow does not). TensorFlow is imported here, on the
    first image: the CLI's and the options' users of this module never pay for it."""
    from beam.contract.decoding import UNREADABLE, pixels_problem

    problem = pixels_problem(image_bytes, fmt, rewritten)
    if problem is None:
        return None
    kind, why = problem
    if kind == UNREADABLE:
        return _reject(record, UNREADABLE_IMAGE, f"image {record.filename!r} cannot be decoded: {why}")
    return _reject(record, TENSORFLOW_CANNOT_DECODE, f"image {record.filename!r}: TensorFlow's decoder refuses it "
                                                     f"({why}), though Pillow reads it; training would stop on it")


def box_problem(box: SourceBox, width: int, height: int, tolerance: float) -> tuple[str, str] | None:
    """(reason, what is wrong) for a box that cannot be trusted on its own, else None.

    >>> box_problem(SourceBox("cat", 5, 5, 5, 9), 10, 10, 2.0)
    ('invalid_box', 'is empty or inverted: xmin=5 xmax=5 ymin=5 ymax=9')
    >>> box_problem(SourceBox("cat", 10, 0, 11, 4), 10, 10, 2.0)[0]
    'invalid_box'
    >>> box_problem(SourceBox("cat", float("nan"), 1, 5, float("inf")), 10, 10, 2.0)[1]
    'has no usable xmin, ymax (missing, not a number or infinite)'
    """
    coords = (box.xmin, box.ymin, box.xmax, box.ymax)
    unusable = [name for name, c in zip(("xmin", "ymin", "xmax", "ymax"), coords) if not math.isfinite(c)]
    if unusable:  # the readers make a missing, empty or non-numeric coordinate NaN
        return INVALID_BOX, f"has no usable {', '.join(unusable)} (missing, not a number or infinite)"
    if box.xmin >= box.xmax or box.ymin >= box.ymax:
        return INVALID_BOX, f"is empty or inverted: xmin={box.xmin} xmax={box.xmax} ymin={box.ymin} ymax={box.ymax}"
    if box.xmin < -tolerance or box.ymin < -tolerance or box.xmax > width + tolerance or box.ymax > height + tolerance:
        return BOX_OUTSIDE_IMAGE, f"{coords} lies outside the {width}x{height} image by more than {tolerance} px"
    xmin, ymin, xmax, ymax = clipped_box(box, width, height, normalise=False)
    if xmin >= xmax or ymin >= ymax:
        return INVALID_BOX, f"{coords} has zero area once clipped to the {width}x{height} image"
    return None


def clipped_box(box: SourceBox, width: int, height: int,
                normalise: bool = True) -> tuple[float, float, float, float]:
    """(xmin, ymin, xmax, ymax) clipped to the image, as shares of it unless `normalise` is False."""
    xmin, xmax = min(max(box.xmin, 0.0), width), min(max(box.xmax, 0.0), width)
    ymin, ymax = min(max(box.ymin, 0.0), height), min(max(box.ymax, 0.0), height)
    if not normalise:
        return xmin, ymin, xmax, ymax
    return xmin / width, ymin / height, xmax / width, ymax / height


# Two boxes of one class on one image overlapping this much are most likely the same object
# labelled twice (a known quirk of hand-labelled sets): kept, but counted and shown.
NEAR_DUPLICATE_IOU = 0.8


def near_duplicates(record: CheckedRecord) -> list[tuple[int, int, float]]:
    """(i, j, IoU) of each pair of the record's boxes (i < j, indices of its written boxes)
    with the same class and IoU above NEAR_DUPLICATE_IOU.

    >>> r = CheckedRecord("a", "a.jpg", "a.jpg", "", 0, "jpeg", 100, 100, "RGB",
    ...                   ((0.1, 0.1, 0.5, 0.5), (0.11, 0.1, 0.5, 0.5), (0.1, 0.1, 0.5, 0.5)),
    ...                   ("cat", "cat", "dog"), (False,) * 3, "a.xml")
    >>> near_duplicates(r)
    [(0, 1, 0.975)]
    """
    if len(set(record.class_texts)) == len(record.class_texts):  # no class twice: no pair (most records)
        return []
    import numpy as np

    boxes = np.asarray(record.boxes, dtype=np.float64).reshape(-1, 4)
    left, top = np.maximum(boxes[:, None, 0], boxes[None, :, 0]), np.maximum(boxes[:, None, 1], boxes[None, :, 1])
    right, bottom = np.minimum(boxes[:, None, 2], boxes[None, :, 2]), np.minimum(boxes[:, None, 3], boxes[None, :, 3])
    inter = np.clip(right - left, 0, None) * np.clip(bottom - top, 0, None)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / (area[:, None] + area[None, :] - inter)
    classes = np.asarray(record.class_texts)
    same = (classes[:, None] == classes[None, :]) & (iou > NEAR_DUPLICATE_IOU)
    return [(int(i), int(j), round(float(iou[i, j]), 3)) for i, j in zip(*np.nonzero(np.triu(same, k=1)))]
