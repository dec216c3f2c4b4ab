"""The default score threshold of a deployed model: the one that maximises F1 at IoU 0.5
on the val split.

COCO's evaluators report precision over recall levels, not per score, so the matching is
done here: per image and class, detections by falling score take the unmatched truth box
they overlap most if IoU >= 0.5 (COCO's rule); a match with a `difficult` box counts as
neither hit nor miss, and difficult boxes are not needed for recall.

Not faster-coco-eval's `extended_metrics` (1.8): it returns the precision and recall of
the best macro-F1 (classes averaged), not the threshold that gives them, and it counts a
detection on a difficult (crowd) box as a hit: on a case with one, its recall was 1.0 where
COCO's rule gives 0.5, and 1.5 with `useCats` off (tests/test_coco_crosscheck.py).

Example:
    >>> from components.detector.coco_metrics import ImageDetections, ImageTruth
    >>> truth = [ImageTruth(1, 10, 10, [(0.0, 0.0, 0.5, 0.5)], [1], [0])]
    >>> found = [ImageDetections(1, [(0.0, 0.0, 0.5, 0.5), (0.5, 0.5, 1.0, 1.0)], [0.9, 0.4], [1, 1])]
    >>> best_f1_threshold(truth, found)
    ThresholdChoice(score=0.9, f1=1.0, precision=1.0, recall=1.0, iou=0.5)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from components.detector.coco_metrics import ImageDetections, ImageTruth
from components.export.export_files import DEFAULT_SCORE_THRESHOLD


@dataclass(frozen=True)
class ThresholdChoice:
    score: float
    f1: float
    precision: float
    recall: float
    iou: float = 0.5

    def to_dict(self) -> dict:
        return asdict(self)


# The score thresholds of the confidence curve: those of Vertex AI's image object detection
# metrics schema (0.05, 0.10, ..., 0.95, 0.96, ..., 0.99), so the Model Registry draws it as its own.
CONFIDENCE_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.96, 0.97, 0.98, 0.99)


@dataclass(frozen=True)
class ConfidencePoint:
    threshold: float  # keep detections scoring at least this
    precision: float
    recall: float
    f1: float


@dataclass(frozen=True)
class ConfidenceCurve:
    """Precision, recall and F1 of the val detections at each of CONFIDENCE_THRESHOLDS, at IoU
    `iou`, over `boxes` truth boxes (difficult ones not counted)."""

    boxes: int
    points: tuple[ConfidencePoint, ...]
    iou: float = 0.5

    def to_dict(self) -> dict:
        return {"boxes": self.boxes, "iou": self.iou, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict) -> "ConfidenceCurve":
        return cls(data["boxes"], tuple(ConfidencePoint(**p) for p in data["points"]), data["iou"])


def confidence_curve(truths: list[ImageTruth], detections: list[ImageDetections],
                     iou_threshold: float = 0.5) -> ConfidenceCurve:
    """The curve at CONFIDENCE_THRESHOLDS (no detection kept at a threshold: precision 1,
    recall 0, as a precision-recall curve starts)."""
    boxes = sum(int((~_difficult(t)).sum()) for t in truths)
    curve = f1_curve(truths, detections, iou_threshold)
    points = []
    for threshold in CONFIDENCE_THRESHOLDS:
        kept = int((curve.scores >= threshold).sum()) if curve is not None else 0
        if kept == 0:
            points.append(ConfidencePoint(threshold, 1.0, 0.0, 0.0))
        else:
            i = kept - 1
            points.append(ConfidencePoint(threshold, round(float(curve.precision[i]), 6),
                                          round(float(curve.recall[i]), 6), round(float(curve.f1[i]), 6)))
    return ConfidenceCurve(boxes, tuple(points), iou_threshold)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of yxyx boxes, broadcast over the leading axes: one box [4] with each of `boxes`
    [N, 4], or pairwise with `iou(a[:, None], a[None])` (normalised coordinates: IoU does not
    change when both axes are scaled)."""
    top_left = np.maximum(box[..., :2], boxes[..., :2])
    bottom_right = np.minimum(box[..., 2:], boxes[..., 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    area = np.prod(box[..., 2:] - box[..., :2], axis=-1)
    areas = np.prod(boxes[..., 2:] - boxes[..., :2], axis=-1)
    return inter / np.maximum(area + areas - inter, 1e-12)


def _difficult(truth: ImageTruth) -> np.ndarray:
    return np.asarray(truth.difficult or [0] * len(truth.boxes), dtype=bool)


def _hits(truth: ImageTruth, found: ImageDetections, iou_threshold: float) -> list[tuple[float, bool]]:
    """(score, hit) of every detection of one image that is not matched to a difficult box."""
    boxes = np.asarray(truth.boxes, dtype=np.float64).reshape(-1, 4)
    labels, difficult = np.asarray(truth.labels), _difficult(truth)
    taken = np.zeros(len(boxes), dtype=bool)
    out = []
    for j in np.argsort(-np.asarray(found.scores), kind="stable"):
        candidates = (labels == found.labels[j]) & ~taken
        if candidates.any():
            overlaps = np.where(candidates, iou(np.asarray(found.boxes[j]), boxes), -1.0)
            best = int(np.argmax(overlaps))
            if overlaps[best] >= iou_threshold:
                taken[best] = True
                if not difficult[best]:
                    out.append((found.scores[j], True))
                continue
        out.append((found.scores[j], False))
    return out


@dataclass
class F1Curve:
    """Precision, recall and F1 when keeping detections with score >= `scores[i]`."""
    scores: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray


def f1_curve(truths: list[ImageTruth], detections: list[ImageDetections], iou_threshold: float = 0.5) -> F1Curve | None:
    """None when there is nothing to draw (no detections or no truth boxes)."""
    positives = sum(int((~_difficult(t)).sum()) for t in truths)
    hits = sorted((h for t, d in zip(truths, detections) for h in _hits(t, d, iou_threshold)),
                  key=lambda h: -h[0])
    if not hits or positives == 0:
        return None
    scores = np.array([h[0] for h in hits])
    tp = np.cumsum([h[1] for h in hits])
    precision, recall = tp / np.arange(1, len(hits) + 1), tp / positives
    f1 = np.where(tp > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)
    return F1Curve(scores, precision, recall, f1)


def best_f1_threshold(truths: list[ImageTruth], detections: list[ImageDetections],
                      iou_threshold: float = 0.5) -> ThresholdChoice:
    """The score threshold (keep detections with score >= it) with the highest F1."""
    curve = f1_curve(truths, detections, iou_threshold)
    if curve is None:
        return ThresholdChoice(DEFAULT_SCORE_THRESHOLD, 0.0, 0.0, 0.0, iou_threshold)
    scores, f1 = curve.scores, curve.f1
    last_of_tie = np.append(scores[1:] != scores[:-1], True)  # a threshold keeps every equal score
    best = int(np.argmax(np.where(last_of_tie, f1, -1.0)))
    if f1[best] == 0:  # nothing found is right: no threshold is better than another
        return ThresholdChoice(DEFAULT_SCORE_THRESHOLD, 0.0, 0.0, 0.0, iou_threshold)
    return ThresholdChoice(float(scores[best]), float(f1[best]), float(curve.precision[best]),
                           float(curve.recall[best]), iou_threshold)
