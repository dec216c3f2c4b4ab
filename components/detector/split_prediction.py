"""Every image of a split predicted, and scored with COCO metrics: what evaluation, a
converted file's re-scoring, a tuning trial's rungs and the training's held-out curve share
(the detector core, so no step imports another for it).

`predict_split` gives the ground truth and detections of a split; `model_metrics` the COCO
metrics of a model in memory on it.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from components.detector.artifacts import TrainConfigFile
from components.detector.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics
from components.detector.detect import BatchDetector
from components.detector.records import as_graph, eval_examples, to_model_image
from components.detector.shard_check import naming_bad_records
from components.detector.tile_choice import Tiling
from components.detector.tiles import TiledDetector


# Kept in memory by `kept_batches` at most: a split's images at the model size, as float32.
KEPT_BYTES = 1 << 30


def whole_photo_batches(data_dir: str, image_size: int, batch_size: int, split: str) -> tf.data.Dataset:
    """The split's photos at the model size (`to_model_image`), `batch_size` at a time, with their truth."""
    return eval_examples(data_dir, split, shorter_side=image_size).map(
        as_graph(lambda ex: (to_model_image(ex["image"], image_size),
                             {k: ex[k] for k in ("boxes", "labels", "difficult", "height", "width", "source_id")})),
        num_parallel_calls=tf.data.AUTOTUNE,
    ).ragged_batch(batch_size).prefetch(2)


def kept_batches(data_dir: str, image_size: int, images: int, split: str = "val", batch_size: int = 32) -> list | None:
    """`whole_photo_batches` read once and kept, for a split scored many times (the training's
    held-out curve): decoding the photos costs as much as predicting them. None (read them each
    time) when `images` at the model size would take more than KEPT_BYTES."""
    if images * image_size * image_size * 3 * 4 > KEPT_BYTES:
        return None
    with naming_bad_records(data_dir, (split,)):
        return list(whole_photo_batches(data_dir, image_size, batch_size, split))


def predict_split(model: keras.Model | None, data_dir: str, image_size: int, batch_size: int = 32,
                  split: str = "val", tiling: Tiling | None = None,
                  detector: Callable[[np.ndarray], dict] | None = None,
                  batches: list | None = None) -> tuple[list[ImageTruth], list[ImageDetections]]:
    """Ground truth and detections (normalised yxyx, 1-based labels) for every image of the
    split, whatever its size: the detector always sees full batches (detect.py); with a
    `tiling`, every whole photo from its tiles at full resolution (tiles.py). `detector`: what
    answers instead of `model` (a converted file, components/export/file_detector.py), called as
    BatchDetector is, on whole photos; `batches`: the split's `kept_batches`, not read again. A
    record that cannot be read stops it with `UnreadableShards` naming the image and its shard."""
    with naming_bad_records(data_dir, (split,)):
        if tiling is not None:
            return _predict_tiled(model, data_dir, tiling, batch_size, split)
        examples = batches if batches is not None else whole_photo_batches(data_dir, image_size, batch_size, split)
        return _predict_whole(detector or BatchDetector(model, image_size, batch_size), examples, image_size)


def _predict_whole(detector: Callable[[np.ndarray], dict], examples, image_size: int,
                   ) -> tuple[list[ImageTruth], list[ImageDetections]]:
    truths: list[ImageTruth] = []
    detections: list[ImageDetections] = []
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


def model_metrics(model: keras.Model, record: TrainConfigFile, data_dir: str, split: str = "val",
                  detector: Callable[[np.ndarray], dict] | None = None, batches: list | None = None) -> dict[str, float]:
    """COCO metrics of a model in memory that `record` (its train_config.json) describes, on one
    split of `data_dir` (a tuning trial's rungs, the training's held-out curve, scored between chunks).
    `detector`, `batches`: a BatchDetector of the model and the split's `kept_batches`, kept
    between calls (one trace, one decoding for all of them)."""
    truths, detections = predict_split(model, data_dir, record.image_size, split=split, tiling=record.tiling,
                                       detector=detector, batches=batches)
    if not truths:
        raise ValueError(f"the {split} split in {data_dir} has no records")
    return coco_box_metrics(truths, detections, {v: k for k, v in record.label_map.items()})
