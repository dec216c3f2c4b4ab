"""A paired bootstrap over val images: how sure is "the challenger is better"?

pycocotools matches detections to ground truth per image (`COCOeval.evaluateImg`); what
no COCO library offers is re-accumulating those matches with images drawn with
replacement, which is what a bootstrap needs. Running the whole COCO evaluation 1000 times
per model would take minutes; re-weighting the matches takes seconds. So the
accumulation (COCO's 101-point interpolated AP, maxDets 100 or as coco_metrics counts, all areas) is re-done here on
per-image weights: an image drawn k times counts k times. With every weight 1 it gives
pycocotools' mAP and AP50 exactly (tests/test_promotion.py checks it).

Both models are scored on the same resamples (paired), so the interval is that of the
difference, not of two independent scores.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np

from components.detector.coco_metrics import ImageDetections, ImageTruth, detections_counted, to_coco
from components.model_registry.decision import CONFIDENCE_LEVEL, DeltaInterval

_REC_THRS = np.linspace(0.0, 1.00, 101)
_NUM_IOU = 10  # COCO's IoU thresholds 0.50:0.05:0.95
_EPS = np.spacing(1)


@dataclass
class ClassMatches:
    """One class's detections over the split, sorted by score as COCO does."""
    image_index: np.ndarray  # [D] which image each detection is on
    tp: np.ndarray  # [T, D] bool
    fp: np.ndarray  # [T, D] bool
    positives: np.ndarray  # [I] non-ignored ground-truth boxes per image


@dataclass
class MatchTable:
    num_images: int
    class_ids: list[int]
    classes: list[ClassMatches]


def match_table(truths: list[ImageTruth], detections: list[ImageDetections],
                label_names: dict[int, str]) -> MatchTable:
    """Per-image matching of `detections` on `truths` for the classes in `label_names`
    (others are ignored), with pycocotools."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    class_ids = sorted(label_names)
    image_ids = [t.image_id for t in truths]
    detections = [_only_classes(d, set(class_ids)) for d in detections]
    gt_dict, results = to_coco(truths, detections, label_names)
    if not results:  # nothing detected: every class scores 0 where it has boxes
        return MatchTable(len(image_ids), class_ids,
                          [_no_detections(_positives(truths, k), _NUM_IOU) for k in class_ids])
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco_gt = COCO()
        coco_gt.dataset = gt_dict
        coco_gt.createIndex()
        evaluator = COCOeval(coco_gt, coco_gt.loadRes(results), iouType="bbox")
        params = evaluator.params
        params.imgIds, params.catIds = image_ids, class_ids
        params.areaRng, params.areaRngLbl, params.maxDets = [[0, 1e10]], ["all"], [detections_counted(detections)]
        evaluator.evaluate()
    index_of = {image_id: i for i, image_id in enumerate(image_ids)}
    num_iou = len(params.iouThrs)
    classes = []
    for k, class_id in enumerate(class_ids):
        positives = _positives(truths, class_id)
        scores, images, matched, ignored = [], [], [], []
        for cell in evaluator.evalImgs[k * len(image_ids):(k + 1) * len(image_ids)]:
            if cell is None or not len(cell["dtScores"]):
                continue
            n = len(cell["dtScores"])
            scores.append(np.asarray(cell["dtScores"], dtype=np.float64))
            images.append(np.full(n, index_of[cell["image_id"]], dtype=np.int64))
            matched.append(np.asarray(cell["dtMatches"]).reshape(num_iou, n) > 0)
            ignored.append(np.asarray(cell["dtIgnore"]).reshape(num_iou, n) > 0)
        if scores:
            order = np.argsort(-np.concatenate(scores), kind="mergesort")
            hit = np.concatenate(matched, axis=1)[:, order]
            skip = np.concatenate(ignored, axis=1)[:, order]
            classes.append(ClassMatches(np.concatenate(images)[order], hit & ~skip, ~hit & ~skip, positives))
        else:
            classes.append(_no_detections(positives, num_iou))
    return MatchTable(len(image_ids), class_ids, classes)


def _no_detections(positives: np.ndarray, num_iou: int) -> ClassMatches:
    empty = np.zeros((num_iou, 0), dtype=bool)
    return ClassMatches(np.zeros(0, dtype=np.int64), empty, empty, positives)


def _only_classes(d: ImageDetections, keep: set[int]) -> ImageDetections:
    rows = [(b, s, c) for b, s, c in zip(d.boxes, d.scores, d.labels) if c in keep]
    return ImageDetections(d.image_id, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def _positives(truths: list[ImageTruth], class_id: int) -> np.ndarray:
    """Ground-truth boxes COCO does not ignore (difficult ones become crowd), per image."""
    return np.array([sum(1 for label, hard in zip(t.labels, t.difficult or [0] * len(t.labels))
                         if label == class_id and not hard) for t in truths], dtype=np.int64)


def _class_precision(matches: ClassMatches, weights: np.ndarray) -> np.ndarray:
    """COCO's interpolated precision [R, T, 101] under image weights [R, I]; -1 where the
    class has no positives in a resample."""
    resamples, num_iou = weights.shape[0], matches.tp.shape[0]
    npos = weights @ matches.positives  # [R]
    out = np.zeros((resamples, num_iou, len(_REC_THRS)))
    if matches.image_index.size:
        w = weights[:, matches.image_index][:, None, :]  # [R, 1, D]
        tp_sum = np.cumsum(w * matches.tp[None], axis=2)
        fp_sum = np.cumsum(w * matches.fp[None], axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            recall = tp_sum / npos[:, None, None]
        precision = tp_sum / (tp_sum + fp_sum + _EPS)
        envelope = np.maximum.accumulate(precision[..., ::-1], axis=2)[..., ::-1]
        size = matches.image_index.size
        for r in range(resamples):
            if npos[r] == 0:
                continue
            for t in range(num_iou):
                idx = np.searchsorted(recall[r, t], _REC_THRS, side="left")
                valid = idx < size
                out[r, t, :valid.sum()] = envelope[r, t, idx[valid]]
    out[npos == 0] = -1.0
    return out


@dataclass
class Scores:
    map: np.ndarray  # [R]
    ap50: np.ndarray  # [R]
    per_class: np.ndarray  # [R, K], -1 where undefined


def _mean_of_defined(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Mean over `axes` of the entries that are not -1 (COCO's "undefined"); -1 where none is."""
    defined = values > -1
    count = defined.sum(axis=axes)
    return np.where(count > 0, np.where(defined, values, 0).sum(axis=axes) / np.maximum(count, 1), -1.0)


def weighted_scores(table: MatchTable, weights: np.ndarray, chunk: int = 25) -> Scores:
    """mAP@[.5:.95], AP50 and per-class AP for each row of image weights [R, I]."""
    maps, ap50s, per_class = [], [], []
    for start in range(0, weights.shape[0], chunk):
        w = weights[start:start + chunk].astype(np.float64)
        precision = np.stack([_class_precision(c, w) for c in table.classes], axis=-1)  # [r, T, 101, K]
        maps.append(_mean_of_defined(precision, (1, 2, 3)))
        ap50s.append(_mean_of_defined(precision[:, 0], (1, 2)))  # IoU 0.5 only
        per_class.append(np.where((precision > -1).all(axis=(1, 2)), precision.mean(axis=(1, 2)), -1.0))
    return Scores(np.concatenate(maps), np.concatenate(ap50s), np.concatenate(per_class))


def resample_weights(num_images: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, num_images] counts of each image in a draw with replacement; row 0 is
    the sample itself (all ones), the rest are seeded draws."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, num_images, size=(resamples, num_images))
    weights = np.stack([np.bincount(row, minlength=num_images) for row in draws])
    return np.vstack([np.ones((1, num_images), dtype=np.int64), weights])


def _interval(values: np.ndarray, point: float, level: float) -> DeltaInterval:
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return DeltaInterval(float(point), float(low), float(high))


@dataclass
class PairedResult:
    challenger: Scores  # row 0: the sample itself
    champion: Scores
    delta_map: DeltaInterval
    delta_ap50: DeltaInterval
    resamples: int


def paired_bootstrap(challenger: MatchTable, champion: MatchTable, resamples: int = 1000, seed: int = 0,
                     level: float = CONFIDENCE_LEVEL) -> PairedResult:
    """Both tables must be on the same images and classes."""
    if challenger.num_images != champion.num_images or challenger.class_ids != champion.class_ids:
        raise ValueError("the paired bootstrap needs both models scored on the same images and classes")
    if challenger.num_images == 0:
        raise ValueError("no val images to compare on")
    weights = resample_weights(challenger.num_images, resamples, seed)
    a, b = weighted_scores(challenger, weights), weighted_scores(champion, weights)
    both = (a.map[1:] > -1) & (b.map[1:] > -1)
    delta_map = (a.map - b.map)[1:][both]
    delta_ap50 = (a.ap50 - b.ap50)[1:][both]
    if delta_map.size == 0:
        raise ValueError("no resample holds a ground-truth box of the compared classes")
    return PairedResult(a, b, _interval(delta_map, float(a.map[0] - b.map[0]), level),
                        _interval(delta_ap50, float(a.ap50[0] - b.ap50[0]), level), resamples)
