"""COCO box metrics over normalised boxes, computed with faster-coco-eval.

Ground truth and detections come in as plain per-image objects; this module only
builds the COCO dictionaries (pixel `xywh` boxes, 1-based category ids) and reads
the standard summary back.

Example:
    >>> gt = [ImageTruth(1, 100, 100, [(0.1, 0.1, 0.5, 0.5)], [1], [0])]
    >>> det = [ImageDetections(1, [(0.1, 0.1, 0.5, 0.5)], [0.9], [1])]
    >>> round(coco_box_metrics(gt, det, {1: "a"})["AP50"], 3)
    1.0
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

from components.detector.geometry import COCO_MAX_DETECTIONS

logger = logging.getLogger(__name__)

# Boxes are (ymin, xmin, ymax, xmax) normalised to [0, 1], as in the shards.
Box = tuple[float, float, float, float]

SUMMARY_KEYS = (
    "mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
    "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large",
)


@dataclass
class ImageTruth:
    image_id: int
    height: int
    width: int
    boxes: list[Box]
    labels: list[int]
    difficult: list[int] = field(default_factory=list)
    name: str = ""  # the image's source id (file id), for pictures and people; "" when unknown


@dataclass
class ImageDetections:
    image_id: int
    boxes: list[Box]
    scores: list[float]
    labels: list[int]


def _xywh(box: Box, height: int, width: int) -> list[float]:
    ymin, xmin, ymax, xmax = box
    return [xmin * width, ymin * height, (xmax - xmin) * width, (ymax - ymin) * height]


def to_coco(
    truths: list[ImageTruth], detections: list[ImageDetections], label_names: dict[int, str]
) -> tuple[dict, list[dict]]:
    """COCO ground-truth dict and detection list; `difficult` boxes become crowd."""
    sizes = {t.image_id: (t.height, t.width) for t in truths}
    images = [{"id": t.image_id, "height": t.height, "width": t.width} for t in truths]
    annotations = []
    for t in truths:
        difficult = t.difficult or [0] * len(t.boxes)
        for box, label, hard in zip(t.boxes, t.labels, difficult):
            xywh = _xywh(box, t.height, t.width)
            annotations.append({
                "id": len(annotations) + 1, "image_id": t.image_id, "category_id": int(label),
                "bbox": xywh, "area": xywh[2] * xywh[3], "iscrowd": int(bool(hard)),
            })
    categories = [{"id": int(k), "name": v} for k, v in sorted(label_names.items())]
    results = []
    for d in detections:
        height, width = sizes[d.image_id]
        for box, score, label in zip(d.boxes, d.scores, d.labels):
            results.append({
                "image_id": d.image_id, "category_id": int(label),
                "bbox": _xywh(box, height, width), "score": float(score),
            })
    return {"images": images, "annotations": annotations, "categories": categories}, results


def detections_counted(detections: list[ImageDetections]) -> int:
    """The detections per image the metrics count (COCO's `maxDets`): COCO's 100, or as many
    as the densest image has when a model fitted to dense images returns more (its limit,
    geometry.choose_max_detections), so its recall is not cut at 100. Then `AR100` is the
    recall at that many detections.

    >>> detections_counted([ImageDetections(1, [(0, 0, 1, 1)] * 250, [0.5] * 250, [1] * 250)])
    250
    """
    return max([COCO_MAX_DETECTIONS] + [len(d.scores) for d in detections])


def coco_box_metrics(
    truths: list[ImageTruth], detections: list[ImageDetections], label_names: dict[int, str]
) -> dict[str, float]:
    """The 12 COCO summary numbers plus per-class AP@[.5:.95] (`AP/<name>`) and AP at IoU 0.5
    (`AP50/<name>`); -1 means undefined. Detections per image counted: `detections_counted`."""
    gt_dict, results = to_coco(truths, detections, label_names)
    if not results:
        logger.warning("no detections at all: every metric is 0")
        metrics = {key: 0.0 for key in SUMMARY_KEYS}
        metrics.update({f"{prefix}/{name}": 0.0 for prefix in ("AP", "AP50") for name in label_names.values()})
        return metrics
    coco_gt = COCO(gt_dict)
    coco_dt = coco_gt.loadRes(results)
    evaluator = COCOeval_faster(coco_gt, coco_dt, iouType="bbox")
    evaluator.params.maxDets = [1, 10, detections_counted(detections)]
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    metrics = {key: float(v) for key, v in zip(SUMMARY_KEYS, evaluator.stats[: len(SUMMARY_KEYS)])}
    # precision: [iou thresholds, recall points, classes, area ranges, max dets]
    precision = evaluator.eval["precision"]
    for index, cat_id in enumerate(evaluator.params.catIds):
        name = label_names.get(cat_id, cat_id)
        every_iou, at_half = precision[:, :, index, 0, -1], precision[0, :, index, 0, -1]
        for key, values in ((f"AP/{name}", every_iou), (f"AP50/{name}", at_half)):
            values = values[values > -1]
            metrics[key] = float(np.mean(values)) if values.size else -1.0
    for key, value in metrics.items():
        if not math.isfinite(value):
            raise ValueError(f"COCO metric {key} is not finite: {value}")
    return metrics
