"""COCO instances JSON reader: one file → one `SourceRecord` per image.

The image id is the file name without extension (as for VOC and CSV), so the same
dataset in any format gives identical records. `iscrowd` boxes are kept as
`difficult`. An annotation with no `bbox` gets the box around its `segmentation`.
Annotations that point at no image become rejects; so do images whose id two entries of
`images` share, or with an annotation of a category_id not in `categories`.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

from apache_beam.io.filesystems import FileSystems
from pycocotools import mask as mask_utils

from beam.contract.rejects import BAD_ANNOTATION, Reject
from beam.source_records import (AnnotationError, SourceBox, SourceRecord, image_id_from_filename, number_or_nan,
                                 optional_size)


def annotation_box(ann: dict) -> list:
    """The annotation's [x, y, width, height]: its `bbox`, or, when it has none (converters
    that write only masks), the box around its `segmentation` (polygons, or an RLE mask by
    pycocotools); NaNs when neither is usable, which the checks turn into an invalid_box.

    >>> annotation_box({"segmentation": [[10, 20, 50, 20, 30, 60]]}), annotation_box({"bbox": [1, 2]})
    ([10.0, 20.0, 40.0, 40.0], [nan, nan, nan, nan])
    >>> annotation_box({"segmentation": {"size": [10, 10], "counts": [22, 3, 7, 3, 65]}})
    [2.0, 2.0, 2.0, 3.0]
    """
    bbox = ann.get("bbox")
    if isinstance(bbox, list) and len(bbox) == 4:
        return bbox
    segmentation = ann.get("segmentation")
    try:
        if isinstance(segmentation, list) and segmentation:
            xs = [float(v) for polygon in segmentation for v in polygon[0::2]]
            ys = [float(v) for polygon in segmentation for v in polygon[1::2]]
            return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
        if isinstance(segmentation, dict):
            height, width = segmentation["size"]
            counts = segmentation["counts"]
            rle = (mask_utils.frPyObjects(segmentation, height, width) if isinstance(counts, list)
                   else {"size": [height, width], "counts": counts.encode() if isinstance(counts, str) else counts})
            return [float(v) for v in mask_utils.toBbox(rle)]
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        pass
    return [math.nan] * 4


def parse_coco(data: bytes, source: str) -> list[SourceRecord | Reject]:
    """Every image of the instances file as a record, in file order; orphans as rejects."""
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{source}: not valid JSON: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise AnnotationError(f"{source}: not a COCO instances file (no 'images' list)")
    categories = {c.get("id"): str(c.get("name", "")) for c in doc.get("categories", []) if isinstance(c, dict)}
    entries = Counter(img.get("id") for img in doc["images"] if isinstance(img, dict))
    image_ids = set(entries)
    boxes_by_image: dict = defaultdict(list)
    problems: dict = {}  # image id -> the first annotation of it that cannot be used
    out: list[SourceRecord | Reject] = []
    annotations = [a for a in doc.get("annotations", []) if isinstance(a, dict)]
    for ann in sorted(annotations, key=lambda a: (str(type(a.get("id"))), a.get("id") or 0)):
        ref = f"{source}#annotation={ann.get('id')}"
        if ann.get("image_id") not in image_ids:
            out.append(Reject(f"annotation-{ann.get('id')}", BAD_ANNOTATION,
                              f"annotation {ann.get('id')} refers to image id {ann.get('image_id')!r}, "
                              "which is not in 'images'", ref))
            continue
        x, y, w, h = (number_or_nan(v) for v in annotation_box(ann))
        if ann.get("category_id") not in categories:
            problems.setdefault(ann["image_id"], f"annotation {ann.get('id')}: category_id {ann.get('category_id')!r} "
                                                 "is not in 'categories'")
        boxes_by_image[ann["image_id"]].append(SourceBox(
            class_text=categories.get(ann.get("category_id"), ""),
            xmin=x, ymin=y, xmax=x + w, ymax=y + h, difficult=bool(ann.get("iscrowd", 0)),
        ))
    for img in doc["images"]:
        if not isinstance(img, dict) or not img.get("file_name"):
            out.append(Reject(str(img.get("id") if isinstance(img, dict) else img), BAD_ANNOTATION,
                              "image entry has no file_name", f"{source}#images"))
            continue
        coco_id = img.get("id")
        ref = f"{source}#image={coco_id}"
        if entries[coco_id] > 1:  # whose annotations are whose cannot be told
            out.append(Reject(image_id_from_filename(img["file_name"]), BAD_ANNOTATION,
                              f"image id {coco_id!r} is given to {entries[coco_id]} entries of 'images'", ref))
            continue
        if coco_id in problems:  # an object of no known class: dropping it would teach "background"
            out.append(Reject(image_id_from_filename(img["file_name"]), BAD_ANNOTATION, problems[coco_id], ref))
            continue
        width, height = number_or_nan(img.get("width")), number_or_nan(img.get("height"))
        out.append(SourceRecord(
            image_id=image_id_from_filename(img["file_name"]), filename=img["file_name"],
            width=optional_size(width), height=optional_size(height),
            boxes=tuple(boxes_by_image.get(coco_id, ())), source_ref=ref,
        ))
    return out


def read_coco(path: str) -> list[SourceRecord | Reject]:
    with FileSystems.open(path) as handle:
        return parse_coco(handle.read(), path)
