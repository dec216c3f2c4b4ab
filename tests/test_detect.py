"""Prediction for any number of images: val splits that are not a multiple of the batch
(KerasHub's NMS cannot take a batch of unknown size), and padding that never leaks."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.detector.coco_metrics import coco_box_metrics
from components.detector.detect import BatchDetector, detect
from components.detector.artifacts import load_trained
from components.detector.split_prediction import predict_split
from components.evaluate.evaluator import evaluate_detector
from components.detector.records import compression_type, shard_files


def _val_records(data_dir) -> list[bytes]:
    files = shard_files(str(data_dir), "val")
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type=compression_type(files))]


def _val_split(records: list[bytes], folder):
    """A shard folder whose val split holds exactly these records, in this order."""
    folder.mkdir()
    with tf.io.TFRecordWriter(str(folder / "val-00000-of-00001.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    return folder


def test_raccoon_val_is_not_a_multiple_of_32(raccoon_shards):
    assert len(_val_records(raccoon_shards)) == 43  # what made every real dataset crash at evaluate


@pytest.mark.parametrize("size", [1, 31, 33, 43])
def test_evaluation_of_any_val_size_gives_finite_metrics_and_one_list_per_image(raccoon_model, raccoon_shards,
                                                                                 tmp_path, size):
    data = _val_split(_val_records(raccoon_shards)[:size], tmp_path / "data")
    result = evaluate_detector(str(raccoon_model), str(data), str(tmp_path / "eval"))
    assert result.num_images == size
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["num_images"] == size and all(math.isfinite(v) for v in saved["metrics"].values())
    assert "AP/raccoon" in saved["metrics"]
    # whole photos: one model input per photo
    assert saved["prediction"]["photos"] == saved["prediction"]["inputs"] == size and not saved["prediction"]["tiled"]
    truths, detections = result.truths, result.detections  # what the metrics were computed from
    assert len(truths) == len(detections) == size
    assert [t.image_id for t in truths] == [d.image_id for d in detections] == list(range(1, size + 1))


def test_padded_images_never_leak_into_the_detections_or_the_metrics(raccoon_shards, tmp_path):
    """33 images at batch 32 (the last batch padded with 31 black images) against the same
    33 images followed by 31 real ones (two full batches, nothing padded): the 33 images
    get identical detections and identical metrics."""
    from components.detector.model import ModelConfig, build_detector

    records = _val_records(raccoon_shards)
    padded_dir = _val_split(records[:33], tmp_path / "padded")
    exact_dir = _val_split(records[:33] + records[10:41], tmp_path / "exact")
    # A fresh detector with a very low score threshold and its box deltas zeroed (boxes are
    # anchors, inside the image, which KerasHub's NMS keeps): every image gets 20 detections
    # whose scores and choice of anchors depend on its pixels, so a mix-up would show.
    keras.utils.set_random_seed(7)
    model = build_detector(ModelConfig(num_classes=1, image_size=64, backbone_filters=(64, 16, 16, 16),
                                       min_level=4, max_level=5, score_threshold=1e-4, max_detections=20))
    deltas = model.box_head.prediction_layer
    deltas.set_weights([np.zeros_like(w) for w in deltas.get_weights()])
    truths, padded = predict_split(model, str(padded_dir), 64, batch_size=32)
    exact_truths, exact = predict_split(model, str(exact_dir), 64, batch_size=32)
    assert len(padded) == 33 and len(exact) == 64
    assert all(d.boxes for d in padded) and sum(len(d.boxes) for d in padded) > 10 * 33  # something to compare
    assert len({tuple(d.scores) for d in padded}) == 33
    for a, b in zip(padded, exact[:33]):
        assert (a.image_id, a.boxes, a.scores, a.labels) == (b.image_id, b.boxes, b.scores, b.labels)
    names = {1: "raccoon"}
    assert coco_box_metrics(truths, padded, names) == coco_box_metrics(exact_truths[:33], exact[:33], names)


def test_detect_pads_inside_the_graph_for_a_batch_unknown_until_called(raccoon_model):
    """The same function serves a signature with a [None] batch: any count, 0 included."""
    model, config = load_trained(str(raccoon_model))
    size = config.image_size
    images = tf.random.stateless_uniform([5, size, size, 3], seed=[1, 2])
    serving = tf.function(lambda x: detect(model, x, batch_size=4),
                          input_signature=[tf.TensorSpec([None, size, size, 3], tf.float32)])
    for count in (0, 1, 4, 5):
        out = serving(images[:count])
        assert out["boxes"].shape[0] == out["num_detections"].shape[0] == count
    whole = BatchDetector(model, size, batch_size=2)(images)
    one_by_one = BatchDetector(model, size, batch_size=1)
    for i in range(5):
        single = one_by_one(images[i:i + 1])
        np.testing.assert_allclose(single["boxes"][0], whole["boxes"][i], atol=1e-4)
        assert single["num_detections"][0] == whole["num_detections"][i]


def test_batch_size_must_be_positive(raccoon_model):
    model, config = load_trained(str(raccoon_model))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        detect(model, tf.zeros([1, 64, 64, 3]), batch_size=0)


def test_the_suppression_per_class_survives_infinite_and_far_off_boxes():
    """An untrained or diverged model decodes some boxes to infinity or far off the picture:
    they must not spread the classes' boxes apart past float32's precision (every box then one
    point, all suppressed by the first) nor overlap another class's boxes."""
    from components.detector.nms import GreedyNonMaxSuppression

    nms = GreedyNonMaxSuppression(bounding_box_format="yxyx", from_logits=False, max_detections=5,
                                  confidence_threshold=0.05)
    boxes = np.array([[[0, 0, 10, 10], [0, 20, 10, 30], [40, 40, 50, 50], [0, 0, np.inf, np.inf],
                       [1e6, 1e6, 1e6 + 5, 1e6 + 5]]], "float32")
    scores = np.array([[[0.9, 0.0], [0.0, 0.8], [0.0, 0.7], [0.6, 0.0], [0.0, 0.5]]], "float32")
    out = nms(boxes, scores, images=np.zeros([1, 64, 64, 3], "float32"))
    assert int(out["num_detections"][0]) == 5  # none overlaps another of its class
    assert out["labels"][0].numpy().tolist() == [0, 1, 1, 0, 1]
    np.testing.assert_array_equal(out["boxes"][0].numpy()[:3], boxes[0][:3])  # the model's own boxes come back
