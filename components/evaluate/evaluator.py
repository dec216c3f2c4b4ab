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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.label_map import read_dataset_label_map
from components.detector.artifacts import TrainConfigFile, load_trained
from components.detector.detect import BatchDetector
from components.detector.geometry import COCO_MAX_DETECTIONS
from components.detector.records import eval_examples, read_records, shard_files, to_model_image
from components.detector.shard_check import naming_bad_records
from components.detector.tile_choice import Tiling, tiles_per_photo
from components.detector.tiles import TiledDetector
from components.evaluate.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics
from components.evaluate.detections_file import DETECTIONS_FILE, write_detections
from components.evaluate.metrics_file import METRICS_FILE, DetectionCap, EvalMetrics, Gate, PredictionCost
from components.evaluate.pictures import GALLERY_FILE, draw_evaluation
from components.evaluate.threshold import best_f1_threshold

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


def predict_split(model: keras.Model | None, data_dir: str, image_size: int, batch_size: int = 32,
                  split: str = "val", tiling: Tiling | None = None,
                  detector: Callable[[np.ndarray], dict] | None = None) -> tuple[list[ImageTruth], list[ImageDetections]]:
    """Ground truth and detections (normalised yxyx, 1-based labels) for every image of the
    split, whatever its size: the detector always sees full batches (detect.py); with a
    `tiling`, every whole photo from its tiles at full resolution (tiles.py). `detector`: what
    answers instead of `model` (a converted file, components/export/file_detector.py), called as
    BatchDetector is, on whole photos. A record that cannot be read stops it with
    `UnreadableShards` naming the image and its shard."""
    with naming_bad_records(data_dir, (split,)):
        if tiling is not None:
            return _predict_tiled(model, data_dir, tiling, batch_size, split)
        return _predict_whole(detector or BatchDetector(model, image_size, batch_size), data_dir, image_size,
                              batch_size, split)


def _predict_whole(detector: Callable[[np.ndarray], dict], data_dir: str, image_size: int, batch_size: int,
                   split: str) -> tuple[list[ImageTruth], list[ImageDetections]]:
    truths: list[ImageTruth] = []
    detections: list[ImageDetections] = []
    examples = eval_examples(data_dir, split, shorter_side=image_size).map(
        lambda ex: (to_model_image(ex["image"], image_size),
                    {k: ex[k] for k in ("boxes", "labels", "difficult", "height", "width", "source_id")}),
        num_parallel_calls=tf.data.AUTOTUNE,
    ).ragged_batch(batch_size).prefetch(2)
    for images, truth in examples:
        pred = detector(images)
        for i in range(int(images.shape[0])):
            _record(truths, detections, {k: v[i] for k, v in truth.items()}, {k: v[i] for k, v in pred.items()},
                    np.array([image_size, image_size] * 2, np.float64))
    return truths, detections


def _predict_tiled(model: keras.Model, data_dir: str, tiling: Tiling, batch_size: int,
                   split: str) -> tuple[list[ImageTruth], list[ImageDetections]]:
    """`predict_split` for a tiled model: each photo decoded whole, its tiles `batch_size` at a time."""
    truths: list[ImageTruth] = []
    detections: list[ImageDetections] = []
    detector = TiledDetector(model, tiling, batch_size)
    for example in eval_examples(data_dir, split).prefetch(2):
        height, width = (int(side) for side in tf.shape(example["image"])[:2])
        _record(truths, detections, example, detector(example["image"]), np.array([height, width] * 2, np.float64))
    return truths, detections


def _record(truths: list[ImageTruth], detections: list[ImageDetections], truth: dict, pred: dict,
            scale: np.ndarray) -> None:
    """One image's truth and its detections (pixel boxes divided by `scale`: normalised)."""
    image_id = len(truths) + 1
    truths.append(ImageTruth(
        image_id, int(truth["height"]), int(truth["width"]),
        [tuple(map(float, b)) for b in np.asarray(truth["boxes"])],
        [int(v) for v in np.asarray(truth["labels"])],
        [int(v) for v in np.asarray(truth["difficult"])],
        np.asarray(truth["source_id"]).item().decode("utf-8", "replace"),
    ))
    n = int(pred["num_detections"])
    boxes = np.clip(np.asarray(pred["boxes"][:n], dtype=np.float64) / scale, 0.0, 1.0)
    detections.append(ImageDetections(
        image_id, [tuple(b) for b in boxes],
        [float(s) for s in np.asarray(pred["confidence"][:n])],
        [int(c) + 1 for c in np.asarray(pred["labels"][:n])],
    ))


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


def model_metrics(model: keras.Model, record: TrainConfigFile, data_dir: str, split: str = "val") -> dict[str, float]:
    """`split_metrics` of a model in memory (a tuning trial's, scored between chunks) that
    `record` (its train_config.json) describes."""
    truths, detections = predict_split(model, data_dir, record.image_size, split=split, tiling=record.tiling)
    if not truths:
        raise ValueError(f"the {split} split in {data_dir} has no records")
    return coco_box_metrics(truths, detections, {v: k for k, v in record.label_map.items()})


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
                           cap, prediction)
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
    lines += [f"| {k} | {_fmt(v)} | {_fmt(ap50.get(k, -1.0))} |" for k, v in measured.per_class.items()]
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
            lines += ["", "In order: " + "; ".join(f"`{c}`" for c in worst) + "."]
    return "\n".join(lines) + "\n"
