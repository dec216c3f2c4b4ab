"""The promotion floor: what a "detector" that has learned nothing from the pixels scores.

A model is only worth promoting when it beats placing each class's most common boxes on
every image, the same boxes whatever the image shows. That baseline learns where objects
tend to be from the train split's boxes (as the model does; the val boxes would let it
memorise a small val set) and is scored with the same COCO evaluation as the model on the
val images. A model that predicts nothing scores 0 and never beats it: the challenger's
mAP must be strictly above the baseline's.

The prototypes are chosen greedily (no library offers this): each next box is the train
box of the class that reaches IoU >= 0.5 with the most train boxes of the class not yet
reached, and its score is the share of the class's boxes it reaches. IoU on normalised
boxes equals IoU in pixels on any one image (it does not change when an axis is scaled),
so a prototype in normalised coordinates is placed on images of any size.

Example:
    >>> truths = [ImageTruth(i, 100, 100, [(0.1, 0.1, 0.5, 0.5)], [1]) for i in range(1, 5)]
    >>> train = np.array([[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.5, 0.52], [0.6, 0.6, 0.9, 0.9]])
    >>> baseline = box_prior_baseline(truths, {1: "a"}, train, np.array([1, 1, 1]))
    >>> baseline.metrics["mAP"], baseline.boxes_per_class
    (1.0, 10)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from components.detector.coco_metrics import Box, ImageDetections, ImageTruth, coco_box_metrics
from components.evaluate.threshold import iou

# At most this many prototypes per class: a handful of "usual places", not a tiling of the
# image; and never more than COCO's 100 detections per image over all classes.
MAX_PROTOTYPES = 10
MAX_DETECTIONS = 100
# Pairwise IoU over at most this many boxes of one class (a seeded sample above it).
MAX_SAMPLE = 2000
MATCH_IOU = 0.5


@dataclass(frozen=True)
class Baseline:
    metrics: dict[str, float]  # coco_box_metrics of the baseline's detections
    boxes_per_class: int

    @property
    def description(self) -> str:
        return (f"each class's {self.boxes_per_class} most common train box{'es' if self.boxes_per_class != 1 else ''}"
                " placed on every val image, no model")

    def to_dict(self) -> dict:
        return {"mAP": round(self.metrics["mAP"], 8), "AP50": round(self.metrics["AP50"], 8),
                "boxes_per_class": self.boxes_per_class, "description": self.description}


def prototypes(boxes: np.ndarray, limit: int, seed: int = 0) -> list[tuple[Box, float]]:
    """Up to `limit` boxes of `boxes` [N, 4], each reaching the most boxes not yet reached,
    with the share of `boxes` it reaches; ties go to the earlier box (deterministic)."""
    if not len(boxes):
        return []
    if len(boxes) > MAX_SAMPLE:
        boxes = boxes[np.sort(np.random.default_rng(seed).choice(len(boxes), MAX_SAMPLE, replace=False))]
    reaches = iou(boxes[:, None], boxes[None]) >= MATCH_IOU
    reached = np.zeros(len(boxes), dtype=bool)
    chosen = []
    for _ in range(limit):
        gain = (reaches & ~reached[None, :]).sum(axis=1)
        best = int(np.argmax(gain))
        if gain[best] == 0:
            break
        chosen.append((tuple(float(v) for v in boxes[best]), float(gain[best]) / len(boxes)))
        reached |= reaches[best]
    return chosen


def box_prior_baseline(truths: list[ImageTruth], label_names: dict[int, str], train_boxes: np.ndarray,
                       train_labels: np.ndarray, seed: int = 0) -> Baseline:
    """The baseline's COCO metrics on `truths` for the classes of `label_names`, its
    prototypes drawn from `train_boxes` [N, 4] (normalised yxyx) of class `train_labels` [N]."""
    per_class = max(1, min(MAX_PROTOTYPES, MAX_DETECTIONS // max(1, len(label_names))))
    placed: list[tuple[Box, float, int]] = []
    train_boxes = np.asarray(train_boxes, dtype=np.float64).reshape(-1, 4)
    for class_id in sorted(label_names):
        boxes = train_boxes[np.asarray(train_labels) == class_id]
        if len(boxes):
            placed += [(box, score, class_id) for box, score in prototypes(boxes, per_class, seed)]
    detections = [ImageDetections(t.image_id, [p[0] for p in placed], [p[1] for p in placed], [p[2] for p in placed])
                  for t in truths]
    return Baseline(coco_box_metrics(truths, detections, label_names), per_class)
