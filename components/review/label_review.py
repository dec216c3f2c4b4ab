"""Which labels to fix: likely missing, wrong-class and misplaced boxes, from labels and the
out-of-sample detections of a model trained without them.

The scores are cleanlab's (`cleanlab.object_detection.rank`, ObjectLab: Tkachenko et al.,
2023): per predicted box, how likely an object was overlooked (a confident prediction that no
label of its class matches); per labelled box, how likely its class was swapped (a confident
prediction of another class on it) and how likely it is badly located (the predictions of its
class agree on another place). Each score is in [0, 1], lower meaning more likely wrong.
Written here: turning those scores into ranked issues a person can act on, each with its box in
the dataset's own pixels, the class, the score and the evidence (the prediction that disagrees),
because cleanlab returns per-image masks and per-box arrays, not that list.

A box is flagged when its score is at most `FLAG_SCORE`; every scored box is ranked (the page
shows the best first), so a person can read past the flagged ones.

Example (one 100 x 100 image: a labelled box the model agrees with, an object it finds that
nobody labelled):
    >>> from components.detector.coco_metrics import ImageDetections, ImageTruth
    >>> truth = ImageTruth(1, 100, 100, [(0.1, 0.1, 0.4, 0.4)], [1], name="a.jpg")
    >>> found = ImageDetections(1, [(0.1, 0.1, 0.4, 0.4), (0.6, 0.6, 0.9, 0.9)], [0.99, 0.98], [1, 1])
    >>> issues = review_labels([truth], [found], {1: "cat"})
    >>> [(i.kind, i.image, i.box, i.class_name, i.flagged) for i in issues][:1]
    [('missing box', 'a.jpg', (60.0, 60.0, 90.0, 90.0), 'cat', True)]
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: `detpipe --help` reads CONFIDENT without faster-coco-eval's import
    from components.detector.coco_metrics import ImageDetections, ImageTruth

MISSING, WRONG_CLASS, MISPLACED, DUPLICATE = "missing box", "wrong class", "misplaced box", "duplicate box"
KINDS = (MISSING, WRONG_CLASS, MISPLACED, DUPLICATE)
FLAG_SCORE = 0.2  # a box whose cleanlab score is at most this is flagged (a likely label problem)
# cleanlab's default for a confident prediction (0.95) suits a softmax classifier; a detector
# trained with the focal loss seldom scores that high (its best-F1 threshold is typically
# 0.3-0.7), so the review takes the model's own threshold, this when none is known.
CONFIDENT = 0.5
REVIEW_FILE = "label_review.jsonl"
# The review trusts a model's disagreement only from this val AP50 up: below it the model's own
# misses and confusions outnumber a labeller's, and would be listed as label problems. Measured
# on the demo, whose synthetic labels are exact (every flag there is false): models at val AP50
# 0.29 and 0.60 flagged 72 and 73 boxes (35 "wrong class" circles: the model's confusion), at
# 0.95-0.97 7-10. Raccoon's default runs (AP50 0.76-0.86) flag 2-3. Duplicates are found from the
# labels alone and stay flagged.
REVIEW_FLOOR_AP50 = 0.7
# Two labels of one class overlapping at IoU >= this are scored as a duplicate (1 - IoU, so
# flagged from IoU 1 - FLAG_SCORE = 0.8): a box drawn twice, or two labellers' boxes merged.
DUPLICATE_IOU = 0.5
# A prediction that holds two labels of its class this much (their area inside it) answers
# several objects with one box: the labels are not flagged as misplaced for it.
MERGED_INSIDE = 0.8


@dataclass(frozen=True)
class Evidence:
    """The prediction that disagrees with the label: its box (xmin, ymin, xmax, ymax, the
    image's pixels), class and score; none for a label no prediction overlaps."""

    box: tuple[float, float, float, float]
    class_name: str
    score: float


@dataclass(frozen=True)
class LabelIssue:
    """One likely label problem. `box`: (xmin, ymin, xmax, ymax) in the image's own pixels, the
    labelled box (wrong class, misplaced) or the predicted one that nobody labelled (missing);
    `class_name`: its class (the labelled one, or the predicted one for a missing box);
    `score`: cleanlab's (a duplicate's: 1 - its IoU with the label it repeats), lower is more
    likely wrong; `label_index`: the box's index among the image's labels (None for a missing
    box); `repeats`: for a duplicate, the box of the earlier label it repeats (the one to keep)."""

    image: str
    kind: str
    box: tuple[float, float, float, float]
    class_name: str
    score: float
    flagged: bool
    label_index: int | None
    evidence: Evidence | None
    width: int
    height: int
    repeats: tuple[float, float, float, float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _pixels(boxes, height: int, width: int) -> np.ndarray:
    """Normalised yxyx → pixel xyxy (cleanlab's format)."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.stack([b[:, 1] * width, b[:, 0] * height, b[:, 3] * width, b[:, 2] * height], axis=1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    lo, hi = np.maximum(box[:2], others[:, :2]), np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.maximum(hi - lo, 0.0), axis=1)
    area = lambda b: np.prod(np.maximum(b[..., 2:] - b[..., :2], 0.0), axis=-1)  # noqa: E731
    return inter / np.maximum(area(box) + area(others) - inter, 1e-9)


def _cleanlab_inputs(truths: list[ImageTruth], detections: list[ImageDetections],
                     num_classes: int) -> tuple[list[dict], list[np.ndarray]]:
    """cleanlab's labels ({'bboxes', 'labels'} 0-based) and predictions (per image an object
    array of `num_classes` arrays of [xmin, ymin, xmax, ymax, score])."""
    labels, predictions = [], []
    for truth, found in zip(truths, detections):
        labels.append({"bboxes": _pixels(truth.boxes, truth.height, truth.width),
                       "labels": np.asarray(truth.labels, np.int64) - 1})
        boxes = _pixels(found.boxes, truth.height, truth.width)
        scores, classes = np.asarray(found.scores, np.float64), np.asarray(found.labels, np.int64) - 1
        per_class = np.empty(num_classes, dtype=object)
        for k in range(num_classes):
            mine = classes == k
            per_class[k] = np.hstack([boxes[mine], scores[mine, None]]).reshape(-1, 5)
        predictions.append(per_class)
    return labels, predictions


def review_labels(truths: list[ImageTruth], detections: list[ImageDetections], names: dict[int, str],
                  confident: float = CONFIDENT) -> list[LabelIssue]:
    """Every scored box of the split as a `LabelIssue`, most likely wrong first (`names`:
    1-based class id → name). `detections` must come from a model that did not train on these
    images (the val split, or a held-out fold). `confident`: the score from which a prediction
    is evidence against a label (the evaluation's best-F1 threshold: the exported model's)."""
    from cleanlab.object_detection.rank import (
        compute_badloc_box_scores,
        compute_overlooked_box_scores,
        compute_swap_box_scores,
    )

    if len(truths) != len(detections):
        raise ValueError(f"{len(truths)} images of labels but {len(detections)} of detections")
    used = [c for t in truths for c in t.labels] + [c for d in detections for c in d.labels]
    num_classes = max([*names, *used, 1])
    labels, predictions = _cleanlab_inputs(truths, detections, num_classes)
    name = lambda c: names.get(int(c) + 1, f"class {int(c) + 1}")  # noqa: E731  0-based → its name
    issues = _duplicates(truths, labels, name)
    if not any(len(p) for image in predictions for p in image):
        return _ranked(issues)  # nothing predicted: no evidence about any label but its copies
    overlooked = compute_overlooked_box_scores(labels=labels, predictions=predictions,
                                               high_probability_threshold=confident)
    swapped = compute_swap_box_scores(labels=labels, predictions=predictions, high_probability_threshold=confident)
    misplaced = compute_badloc_box_scores(labels=labels, predictions=predictions,
                                          low_probability_threshold=confident)
    for i, (truth, label, prediction) in enumerate(zip(truths, labels, predictions)):
        pred = np.vstack([p for p in prediction if len(p)] or [np.zeros((0, 5))])
        pred_class = np.concatenate([np.full(len(p), k) for k, p in enumerate(prediction)] or [np.zeros(0)])
        common = dict(image=truth.name or str(truth.image_id), width=truth.width, height=truth.height)
        for j, score in enumerate(overlooked[i]):
            if math.isfinite(score):
                box = tuple(round(float(v), 1) for v in pred[j, :4])
                issues.append(LabelIssue(kind=MISSING, box=box, class_name=name(pred_class[j]), score=float(score),
                                         flagged=bool(score <= FLAG_SCORE), label_index=None,
                                         evidence=Evidence(box, name(pred_class[j]), round(float(pred[j, 4]), 4)),
                                         **common))
        for kind, scores in ((WRONG_CLASS, swapped[i]), (MISPLACED, misplaced[i])):
            for j, score in enumerate(scores):
                if not math.isfinite(score):
                    continue
                box = label["bboxes"][j]
                evidence = _evidence(box, label["labels"][j], pred, pred_class, kind, name, confident)
                merged = kind == MISPLACED and evidence is not None and _spans_several(
                    evidence.box, label["bboxes"][label["labels"] == label["labels"][j]])
                issues.append(LabelIssue(kind=kind, box=tuple(round(float(v), 1) for v in box),
                                         class_name=name(label["labels"][j]), score=float(score),
                                         flagged=bool(score <= FLAG_SCORE and not merged), label_index=j,
                                         evidence=evidence, **common))
    return _ranked(issues)


def _ranked(issues: list[LabelIssue]) -> list[LabelIssue]:
    return sorted(issues, key=lambda issue: (issue.score, issue.image, issue.kind, issue.box))


def _spans_several(prediction: tuple, boxes: np.ndarray) -> bool:
    """Whether a prediction holds two or more labelled boxes of its class (each at least
    `MERGED_INSIDE` inside it): the model answering several objects with one box, which
    cleanlab scores as each label misplaced. Written here: it is the model's mistake, not the
    labels', so such a label is ranked but not flagged."""
    box = np.asarray(prediction, np.float64)
    lo, hi = np.maximum(box[:2], boxes[:, :2]), np.minimum(box[2:], boxes[:, 2:])
    inside = np.prod(np.maximum(hi - lo, 0.0), axis=1) / np.maximum(np.prod(boxes[:, 2:] - boxes[:, :2], axis=1), 1e-9)
    return int(np.sum(inside >= MERGED_INSIDE)) >= 2


def _duplicates(truths: list[ImageTruth], labels: list[dict], name) -> list[LabelIssue]:
    """Labels that repeat an earlier label of the same class in their image (IoU >= DUPLICATE_IOU),
    scored 1 - IoU. Written here: cleanlab scores a label against the predictions, and a box
    drawn twice agrees with them twice, so none of its scores points at the copy."""
    issues = []
    for truth, label in zip(truths, labels):
        boxes, classes = label["bboxes"], label["labels"]
        for j in range(1, len(boxes)):
            earlier = np.flatnonzero(classes[:j] == classes[j])
            if not len(earlier):
                continue
            overlap = _iou(boxes[j], boxes[earlier])
            k = int(np.argmax(overlap))
            if overlap[k] < DUPLICATE_IOU:
                continue
            score = round(1.0 - float(overlap[k]), 6)
            issues.append(LabelIssue(
                image=truth.name or str(truth.image_id), kind=DUPLICATE, box=tuple(round(float(v), 1) for v in boxes[j]),
                class_name=name(classes[j]), score=score, flagged=bool(score <= FLAG_SCORE), label_index=j,
                evidence=None, width=truth.width, height=truth.height,
                repeats=tuple(round(float(v), 1) for v in boxes[earlier[k]])))
    return issues


def _evidence(box: np.ndarray, cls: int, pred: np.ndarray, pred_class: np.ndarray, kind: str, name,
              confident: float) -> Evidence | None:
    """The prediction that disagrees with a labelled box: for a wrong class, the most confident
    prediction of another class on it; for a misplaced box, among its class's confident
    predictions (score >= `confident`, those cleanlab weighs) the one that overlaps it most,
    else its class's most confident prediction on it."""
    if not len(pred):
        return None
    overlap = _iou(np.asarray(box, np.float64), pred[:, :4])
    pick = (pred_class != cls) if kind == WRONG_CLASS else (pred_class == cls)
    candidates = np.flatnonzero(pick & (overlap > 0.0))
    if not len(candidates):
        return None
    sure = candidates[pred[candidates, 4] >= confident]
    if kind == MISPLACED and len(sure):
        best = sure[np.argmax(overlap[sure])]
    else:
        best = candidates[np.argmax(pred[candidates, 4])]
    return Evidence(tuple(round(float(v), 1) for v in pred[best, :4]), name(pred_class[best]),
                    round(float(pred[best, 4]), 4))


def write_review(issues: list[LabelIssue], path: str | Path) -> Path:
    """`label_review.jsonl`: one flagged issue a line, most likely first (ids and boxes in the
    dataset's own pixels, for a labelling tool to import)."""
    path = Path(path)
    path.write_text("".join(json.dumps(i.to_dict(), sort_keys=True) + "\n" for i in issues if i.flagged))
    return path


def read_review(path: str | Path) -> list[LabelIssue]:
    """The flagged issues `write_review` wrote, in its order."""
    issues = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
            evidence = row.pop("evidence")
            issues.append(LabelIssue(**{**row, "box": tuple(row["box"]),
                                        "repeats": tuple(row["repeats"]) if row.get("repeats") else None,
                                        "evidence": Evidence(**{**evidence, "box": tuple(evidence["box"])})
                                        if evidence else None}))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a line of {REVIEW_FILE} ({error})") from None
    return issues


def summary_sentence(issues: list[LabelIssue], weak: str = "") -> str:
    """`summary_line` starting with a capital, class names untouched ("No likely label problems",
    "3 likely label problems: 3 missing RBC boxes"; str.capitalize would lower "RBC")."""
    line = summary_line(issues, weak)
    return line[:1].upper() + line[1:]


SUMMARY_FILE = "label_review_summary.json"


@dataclass(frozen=True)
class ReviewSummary:
    """`label_review_summary.json`, beside REVIEW_FILE: what the review concluded and with what,
    for the run report (the JSONL holds the flagged boxes only, so it cannot say why none is).

    >>> s = ReviewSummary("no label problems flagged: ...", 0, 224, 0.6, too_weak(0.6))
    >>> ReviewSummary.from_dict(s.to_dict()) == s, s.sentence[:9]
    (True, 'No label ')
    """

    summary: str  # summary_line's
    flagged: int
    images: int  # reviewed
    ap50: float | None  # the judging model's val AP50 (None: not measured)
    weak: str = ""  # too_weak's line when the model was under REVIEW_FLOOR_AP50, else ""

    @property
    def sentence(self) -> str:
        return self.summary[:1].upper() + self.summary[1:]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ReviewSummary":
        return cls(**data)

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / SUMMARY_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, folder: str | Path) -> "ReviewSummary | None":
        """The summary in `folder`, or None where the review wrote none (an earlier version's)."""
        path = Path(folder) / SUMMARY_FILE
        if not path.is_file():
            return None
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: not a {SUMMARY_FILE} ({error})") from None


def too_weak(ap50: float, floor: float = REVIEW_FLOOR_AP50) -> str:
    """Why a model at val `ap50` cannot judge the labels (under `floor`), or "" when it can.

    >>> too_weak(0.95), too_weak(0.6)[:48], too_weak(0.6, floor=0)
    ('', 'the model judging them is too weak: val AP50 0.6', '')
    """
    if ap50 >= floor:
        return ""
    return (f"the model judging them is too weak: val AP50 {ap50:.3f}, under the review floor of "
            f"{floor:g}, so its own misses would read as label problems (train it longer)")


def trusted(issues: list[LabelIssue], weak: str) -> list[LabelIssue]:
    """The issues with the model's evidence unflagged when `weak` says the model cannot judge
    (duplicates, found from the labels alone, stay flagged)."""
    if not weak:
        return issues
    return [issue if issue.kind == DUPLICATE else replace(issue, flagged=False) for issue in issues]


def summary_line(issues: list[LabelIssue], weak: str = "") -> str:
    """'46 likely label problems: 36 missing circle boxes, ...' (the run report's and the console's)."""
    flagged = [i for i in issues if i.flagged]
    if not flagged:
        return f"no label problems flagged: {weak}" if weak else "no likely label problems"
    counts: dict[tuple[str, str], int] = {}
    for issue in flagged:
        counts[(issue.kind, issue.class_name)] = counts.get((issue.kind, issue.class_name), 0) + 1
    parts = [f"{n} {kind.replace(' box', '')} {cls} box{'es' if n > 1 else ''}" if kind != WRONG_CLASS else
             f"{n} {cls} box{'es' if n > 1 else ''} of the wrong class"
             for (kind, cls), n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return (f"{len(flagged)} likely label problem{'s' if len(flagged) > 1 else ''}: " + ", ".join(parts)
            + (f"; no other flagged: {weak}" if weak else ""))
