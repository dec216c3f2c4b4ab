"""The label review of a trained model on its val split: one prediction pass (the detections
evaluation makes: whole photos, or their tiles), cleanlab's scores (label_review.py), and what
people open: `label_review.jsonl` for a labelling tool, `label_review.html` to look at.

The val split is out of sample for the model trained on the train split, so its detections
are fair evidence against its labels; the train split would need models that did not see it
(K folds: not built)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from components.evaluate.label_review import (
    CONFIDENT,
    REVIEW_FILE,
    LabelIssue,
    review_labels,
    summary_line,
    write_review,
)
from components.evaluate.review_page import PAGE_FILE, write_review_page

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReviewResult:
    issues: list[LabelIssue]  # every scored box, most likely wrong first
    summary: str  # "46 likely label problems: 36 missing RBC boxes, ..."
    images: int  # val images reviewed
    confident: float  # the score from which a prediction counted as evidence

    @property
    def flagged(self) -> int:
        return sum(issue.flagged for issue in self.issues)


def review_model(model_dir: str, data_dir: str, output_dir: str, confident: float | None = None) -> ReviewResult:
    """Review the val labels of `data_dir` with the model in `model_dir` (`detpipe train`'s
    output) and write REVIEW_FILE and PAGE_FILE to `output_dir`. `confident`: the score from which
    a prediction is evidence (default: the model's exported threshold when an evaluation wrote
    one next to it, else CONFIDENT)."""
    from components.detector.artifacts import load_trained
    from components.evaluate.evaluator import predict_split, val_images

    model, config = load_trained(model_dir)
    names = {index: name for name, index in config.label_map.items()}
    truths, detections = predict_split(model, data_dir, config.image_size, tiling=config.tiling)
    if not truths:
        raise ValueError(f"the val split in {data_dir} has no records to review")
    confident = CONFIDENT if confident is None else confident
    issues = review_labels(truths, detections, names, confident=confident)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_review(issues, out / REVIEW_FILE)
    encoded, _ = val_images(data_dir)
    images = {truth.name or str(truth.image_id): data for truth, data in zip(truths, encoded)}
    summary = summary_line(issues)
    write_review_page(issues, images, out / PAGE_FILE,
                      f"{len(truths)} val images reviewed with the model in {model_dir} (predictions from "
                      f"{confident:.2f} count as evidence).")
    logger.info("label review: %s -> %s", summary, out / PAGE_FILE)
    return ReviewResult(issues, summary, len(truths), confident)
