"""The label review of a trained model on its val split: one prediction pass (the detections
evaluation makes: whole photos, or their tiles), cleanlab's scores (label_review.py), and what
people open: `label_review.jsonl` for a labelling tool, `label_review.html` to look at.

The val split is out of sample for the model trained on the train split, so its detections
are fair evidence against its labels; the train split's labels are reviewed only when asked
(`folds`: K models that did not see them, fold_review.py; costly)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from components.review.label_review import (
    CONFIDENT,
    REVIEW_FILE,
    REVIEW_FLOOR_AP50,
    LabelIssue,
    ReviewSummary,
    review_labels,
    summary_line,
    too_weak,
    trusted,
    write_review,
)
from components.review.review_page import PAGE_FILE, write_review_page

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReviewResult:
    issues: list[LabelIssue]  # every scored box, most likely wrong first
    summary: str  # "46 likely label problems: 36 missing RBC boxes, ..."
    images: int  # images reviewed (val, and train with folds)
    confident: float  # the score from which a prediction counted as evidence
    train_images: int = 0  # of `images`, the train split's (reviewed with `folds` models)
    ap50: float | None = None  # the judging model's val AP50
    weak: str = ""  # why the model could not judge (label_review.too_weak): nothing it found is flagged

    @property
    def flagged(self) -> int:
        return sum(issue.flagged for issue in self.issues)


def review_model(model_dir: str, data_dir: str, output_dir: str, confident: float | None = None,
                 evaluation_dir: str | None = None, folds: int = 0, fold_epochs: int | None = None,
                 floor: float = REVIEW_FLOOR_AP50) -> ReviewResult:
    """Review the val labels of `data_dir` with the model in `model_dir` (`detpipe train`'s
    output) and write REVIEW_FILE and PAGE_FILE to `output_dir`. With `evaluation_dir` (the
    evaluation of that model on that data), its detections are reviewed: no prediction pass.
    `confident`: the score from which a prediction is evidence (default: the evaluation's
    best-F1 threshold, the exported model's; without an evaluation, CONFIDENT). `folds` >= 2:
    the train split too, each of its labels against the detections of one of `folds` models
    trained from scratch without it (`fold_epochs` each; default: the model's epochs). `floor`: the
    val AP50 under which the model is too weak to judge (label_review.too_weak): nothing it finds
    is flagged then, and the summary says why."""
    from components.detector.artifacts import TrainConfigFile
    from components.detector.split_photos import split_photos

    names = {index: name for name, index in TrainConfigFile.read(model_dir).label_map.items()}
    photos = split_photos(data_dir, "val")  # without TensorFlow; None: read in evaluation's order with it
    val = _val_images(data_dir) if photos is None else None
    if evaluation_dir:
        truths, detections, threshold = _evaluated(evaluation_dir, len(photos) if val is None else len(val))
        confident = threshold if confident is None else confident
    else:
        truths, detections = _predicted(model_dir, data_dir)
    if not truths:
        raise ValueError(f"the val split in {data_dir} has no records to review")
    encoded = _in_order(data_dir, truths, photos) if val is None else val
    # The judge's own score, of the very detections judged (val, which the model never saw).
    ap50 = _ap50(truths, detections, names)
    weak = too_weak(ap50, floor)
    reviewed = f"{len(truths)} val images reviewed with the model in {model_dir}"
    train_images = 0
    if folds:
        from components.review.fold_review import predict_folds

        fold_truths, fold_detections, fold_images = predict_folds(model_dir, data_dir, folds, Path(output_dir) / "folds",
                                                                  epochs=fold_epochs)
        train_images = len(fold_truths)
        for truth, found in zip(fold_truths, fold_detections):  # image ids after the val split's
            truths.append(replace(truth, image_id=len(truths) + 1))
            detections.append(replace(found, image_id=len(detections) + 1))
        encoded = [*encoded, *fold_images]
        reviewed += (f", and {train_images} train images, each with one of {folds} models trained from scratch "
                     "on the other folds")
    confident = CONFIDENT if confident is None else confident
    issues = trusted(review_labels(truths, detections, names, confident=confident), weak)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_review(issues, out / REVIEW_FILE)
    images = {truth.name or str(truth.image_id): data for truth, data in zip(truths, encoded)}
    summary = summary_line(issues, weak)
    write_review_page(issues, images, out / PAGE_FILE,
                      f"{reviewed} (predictions from {confident:.2f} count as evidence; val AP50 {ap50:.3f}).", weak)
    result = ReviewResult(issues, summary, len(truths), confident, train_images, round(ap50, 4), weak)
    ReviewSummary(summary, result.flagged, result.images, result.ap50, weak).write(out)
    (logger.warning if weak else logger.info)("label review: %s -> %s", summary, out / PAGE_FILE)
    return result


def _in_order(data_dir: str, truths: list, photos: dict[str, bytes]) -> list[bytes]:
    """The val photos in the order of `truths` (evaluation's), by their source ids; read again with
    TensorFlow in that order when the ids do not say it."""
    if len(photos) == len(truths) and all(truth.name in photos for truth in truths):
        return [photos[truth.name] for truth in truths]
    return _val_images(data_dir)


def _val_images(data_dir: str) -> list[bytes]:
    """The val split's encoded photos in evaluation's order, read with TensorFlow (shards of other
    converters, or records sharing a source id)."""
    from components.evaluate.evaluator import val_images

    return val_images(data_dir)[0]


def _evaluated(evaluation_dir: str, images: int):
    """The labels and detections an evaluation wrote, and its score threshold; checked against
    the val split's image count (an evaluation of other data would put crops on wrong photos)."""
    from components.evaluate.detections_file import DETECTIONS_FILE, read_detections
    from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics

    path = Path(evaluation_dir) / DETECTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {evaluation_dir} the output of `detpipe evaluate` "
                                "(of this detpipe)? Or leave --evaluation out to predict the val split again")
    truths, detections = read_detections(path)
    if len(truths) != images:
        raise ValueError(f"{evaluation_dir} evaluated {len(truths)} val images but the data has {images}: "
                         "review the data that evaluation used")
    return truths, detections, EvalMetrics.read(Path(evaluation_dir) / METRICS_FILE).threshold.score


def _ap50(truths, detections, names: dict[int, str]) -> float:
    """The val AP50 of the detections (no evaluation to read it from)."""
    from components.detector.coco_metrics import coco_box_metrics

    return coco_box_metrics(truths, detections, names)["AP50"]


def _predicted(model_dir: str, data_dir: str):
    """The val split's labels and the model's detections (one prediction pass)."""
    from components.detector.artifacts import load_trained
    from components.detector.split_prediction import predict_split

    model, config = load_trained(model_dir)
    return predict_split(model, data_dir, config.image_size, tiling=config.tiling)
