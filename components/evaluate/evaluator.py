"""Evaluate a trained detector on the val shards with COCO metrics.

Plain function used by the CLI and the KFP component. Writes `metrics.json`,
`eval_report.md` and `val_detections.jsonl` (what the label review reads); `min_map` turns the
step into a gate.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.data_text import markdown_text
from beam.contract.label_map import read_dataset_label_map
from components.detector.artifacts import load_trained
from components.detector.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics
from components.detector.geometry import COCO_MAX_DETECTIONS
from components.detector.records import read_records, shard_files
from components.detector.shard_check import naming_bad_records
from components.detector.split_prediction import model_metrics, predict_split
from components.detector.tile_choice import tiles_per_photo
from components.evaluate.detections_file import DETECTIONS_FILE, write_detections
from components.evaluate.metrics_file import METRICS_FILE, DetectionCap, EvalMetrics, Gate, PredictionCost
from components.evaluate.pictures import GALLERY_FILE, draw_evaluation
from components.evaluate.threshold import best_f1_threshold, confidence_curve

logger = logging.getLogger(__name__)

REPORT_FILE = "eval_report.md"


@dataclass
class EvalResult:
    metrics: dict[str, float]
    num_images: int
    passed: bool
    gate: str
    label_map: dict[str, int] = field(default_factory=dict)
    truths: list[ImageTruth] = field(default_factory=list, repr=False)
    detections: list[ImageDetections] = field(default_factory=list, repr=False)
    images: list[bytes] = field(default_factory=list, repr=False)  # encoded, in the order of `truths`
    val_fingerprint: str = ""


class GateFailed(RuntimeError):
    """mAP below the configured minimum."""


def val_images(data_dir: str, split: str = "val") -> tuple[list[bytes], str]:
    """The split's encoded images in the order evaluation reads them, and a fingerprint of
    the split (sha256 over the sorted sha256 of each record: independent of sharding)."""
    images, digests = [], []
    with naming_bad_records(data_dir, (split,)):
        for serialized in read_records(shard_files(data_dir, split), deterministic=True):
            raw = serialized.numpy()
            digests.append(hashlib.sha256(raw).hexdigest())
            parsed = tf.io.parse_single_example(serialized, {K.ENCODED: tf.io.FixedLenFeature([], tf.string)})
            images.append(parsed[K.ENCODED].numpy())
    return images, hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()


def split_metrics(model_dir: str, data_dir: str, split: str = "val") -> dict[str, float]:
    """COCO metrics of a trained model on one split, as `evaluate_detector` computes them,
    with no files written: what a tuning trial is scored by (on its own held-out part of train)."""
    return model_metrics(*load_trained(model_dir), data_dir, split)


def evaluate_detector(model_dir: str, data_dir: str, output_dir: str, min_map: float = 0.0,
                      raise_on_gate: bool = True) -> EvalResult:
    """COCO metrics on the val split; raises `GateFailed` (after writing the files) below
    `min_map` unless `raise_on_gate` is False (the pipeline decides later, after recording)."""
    started = time.monotonic()
    model, config = load_trained(model_dir)
    label_map = config.label_map
    names = {v: k for k, v in label_map.items()}
    try:
        data_map = read_dataset_label_map(data_dir)
    except FileNotFoundError:  # val shards without a label map (assembled by hand): nothing to compare
        data_map = {}
    moved = sorted(n for n in set(data_map) & set(label_map) if data_map[n] != label_map[n])
    if moved:
        raise ValueError(f"class ids differ between the model and the data ({', '.join(moved[:5])}): build the data "
                         "with the model's label map (data build --label-map, from the model's train_config.json)")
    predicting = time.monotonic()
    truths, detections = predict_split(model, data_dir, config.image_size, tiling=config.tiling)
    if not truths:
        raise ValueError(f"the val split in {data_dir} has no records")
    tiling = config.tiling
    prediction = PredictionCost(
        photos=len(truths), seconds=round(time.monotonic() - predicting, 2), input_size=config.image_size,
        inputs=sum(tiles_per_photo(tiling, t.height, t.width) for t in truths) if tiling else len(truths),
        tiled=tiling is not None)
    metrics = coco_box_metrics(truths, detections, names)
    threshold = best_f1_threshold(truths, detections)  # the exported model's default
    passed = metrics["mAP"] >= min_map
    gate = f"mAP {metrics['mAP']:.4f} {'>=' if passed else '<'} minimum {min_map:.4f}"
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cap = DetectionCap(config.max_detections, sum(
        1 for d in detections if sum(score >= threshold.score for score in d.scores) >= config.max_detections))
    measured = EvalMetrics(metrics, len(truths), Gate(min_map, passed), threshold, round(time.monotonic() - started, 1),
                           cap, prediction, confidence_curve(truths, detections))
    cap_warning = cap.warning(len(truths))
    if cap_warning:
        logger.warning("%s", cap_warning)
    measured.write(out / METRICS_FILE)
    write_detections(truths, detections, out / DETECTIONS_FILE)  # for the label review
    images, val_fingerprint = val_images(data_dir)
    pictures, worst = draw_evaluation(out, truths, detections, names, metrics, threshold.score,
                                      images if len(images) == len(truths) else None)
    (out / REPORT_FILE).write_text(_report(measured, gate, pictures, worst))
    result = EvalResult(metrics, len(truths), passed, gate, label_map, truths, detections, images, val_fingerprint)
    if not passed and raise_on_gate:
        raise GateFailed(gate)
    return result


def _fmt(value: float) -> str:
    return "n/a" if value < 0 or not math.isfinite(value) else f"{value:.3f}"


def _report(measured: EvalMetrics, gate: str, pictures: dict[str, str], worst: list[str]) -> str:
    threshold = measured.threshold
    lines = ["# Evaluation report", "", f"{measured.num_images} val images. Gate: {gate}.", "",
             "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in measured.summary.items()]
    ap50 = measured.per_class_ap50
    lines += ["", "| class | AP@[.5:.95] | AP50 |", "|---|---|---|"]
    lines += [f"| {markdown_text(k)} | {_fmt(v)} | {_fmt(ap50.get(k, -1.0))} |" for k, v in measured.per_class.items()]
    if measured.cap:
        limit = measured.cap.max_detections
        lines += ["", f"The metrics count up to {limit} detections per image" + (
            " (COCO's)." if limit <= COCO_MAX_DETECTIONS else
            f", the model's limit for these dense images (COCO counts {COCO_MAX_DETECTIONS}): AR100 is the recall at {limit}.")]
    if measured.cap and measured.cap.warning(measured.num_images):
        lines += ["", f"**Warning:** {measured.cap.warning(measured.num_images)}."]
    lines += ["", f"Default score threshold for the exported model: {threshold.score:.3f} (the highest F1 at IoU "
                  f"{threshold.iou}: F1 {threshold.f1:.3f}, precision {threshold.precision:.3f}, "
                  f"recall {threshold.recall:.3f})."]
    if measured.prediction:
        lines += ["", f"Prediction: {measured.prediction.line()}."]
    for title, name in pictures.items():
        lines += ["", f"## {title}", "", f"![{title}]({name})"]
        if name == GALLERY_FILE and worst:
            lines += ["", "In order: " + "; ".join(markdown_text(c) for c in worst) + "."]
    return "\n".join(lines) + "\n"
