"""Non-maximum suppression with TensorFlow's greedy kernel, one image at a time.

KerasHub's `NonMaxSuppression` layer runs a tiled, padded NMS written in Keras ops: it
builds the IoU of every anchor box against every other in 512-box tiles, whatever the
scores, and on this project's small CPU models that was ~55% of a prediction's CPU time
(at 128 px, 3,024 anchors: 1.15 s of network and 1.7 s of decoding for 320 photos, one
thread). `GreedyNonMaxSuppression` keeps the layer's settings and output (boxes,
confidence, labels, num_detections; rows past num_detections at -1) and selects with
TensorFlow's greedy NMS kernel (`tf.image.non_max_suppression`'s, in its padded form; boxes
at or below the confidence threshold never considered).

One difference in what it keeps: the suppression is per class, as COCO detectors score
(Detectron2's RetinaNet, Ultralytics' validation), where KerasHub's is class-agnostic on each
anchor's best class. Each anchor is a candidate once per class, the best
`CANDIDATES_PER_DETECTION` x max_detections candidates of an image (at most `MAX_CANDIDATES`)
are kept before the suppression (Detectron2 keeps the best 1,000 a level), and a box suppresses only boxes of
its own class (`class_apart`). An object whose class the model hesitates over keeps both
readings, and two objects of different classes that overlap (cards fanned in a hand) are
both found: on a 6-class card set the same trained weights scored test mAP 0.621 against
0.539, mean of 3 seeds (docs/measurements.md). The boxes returned are the model's own; only
the suppression sees them moved. Per class, its selections agree with KerasHub's layer run on
that class's scores alone, except for some low-score boxes near the threshold, where the
tiled algorithm's batched suppression differs from strict greedy order.

Models saved before this layer existed keep KerasHub's (their `model.keras` names it).

Example (the first two boxes overlap, IoU 0.82):
    >>> import numpy as np
    >>> nms = GreedyNonMaxSuppression(bounding_box_format="yxyx", from_logits=False, max_detections=3)
    >>> boxes = np.array([[[0, 0, 10, 10], [0, 1, 10, 11], [20, 20, 30, 30]]], "float32")
    >>> scores = np.array([[[0.9, 0.1], [0.8, 0.1], [0.1, 0.7]]], "float32")
    >>> out = nms(boxes, scores)
    >>> int(out["num_detections"][0]), out["labels"][0].numpy().tolist(), [round(float(c), 2) for c in out["confidence"][0]]
    (2, [0, 1, -1], [0.9, 0.7, -1.0])

    Of one class, the second box goes; of two classes, both stay:
    >>> out = nms(boxes, np.array([[[0.9, 0.1], [0.1, 0.8], [0.1, 0.7]]], "float32"))
    >>> int(out["num_detections"][0]), out["labels"][0].numpy().tolist(), [round(float(c), 2) for c in out["confidence"][0]]
    (3, [0, 1, 1], [0.9, 0.8, 0.7])
"""

from __future__ import annotations

import keras
import keras_hub
import tensorflow as tf


# An image's candidates for the suppression: this many per detection it may keep (see the module),
CANDIDATES_PER_DETECTION = 20
# and never more than TensorRT's TopK layer takes (its largest k), so the ONNX file still builds an engine.
MAX_CANDIDATES = 3840


def class_apart(boxes: tf.Tensor, classes: tf.Tensor, extent) -> tf.Tensor:
    """`boxes` ([N, 4] corners, in the pixels of a picture whose longer side is `extent`) moved
    by their class so that boxes of two classes never overlap: one class-agnostic suppression
    of the moved boxes is a suppression per class. Each is first held within a side of the
    picture beyond its edges, so that an untrained or diverged model's boxes (far off, or
    infinite) neither overlap another class's nor spread the classes apart past float32's
    precision."""
    extent = tf.cast(extent, boxes.dtype)
    bounded = tf.clip_by_value(boxes, -extent, 2.0 * extent)
    return bounded + tf.cast(classes, boxes.dtype)[:, tf.newaxis] * (3.0 * extent)


@keras.saving.register_keras_serializable(package="detpipe")
class GreedyNonMaxSuppression(keras_hub.layers.NonMaxSuppression):
    """KerasHub's `NonMaxSuppression` (same settings and outputs), selecting with
    TensorFlow's greedy NMS kernel per image and per class (see the module)."""

    def call(self, box_prediction, class_prediction, images=None):
        if "rel" in self.bounding_box_format:  # relative boxes need the image size: KerasHub's path
            return super().call(box_prediction, class_prediction, images)
        boxes = tf.cast(keras.utils.bounding_boxes.convert_format(
            box_prediction, source=self.bounding_box_format, target="yxyx"), tf.float32)
        scores = tf.sigmoid(class_prediction) if self.from_logits else class_prediction
        scores = tf.cast(scores, tf.float32)
        limit = self.max_detections
        classes = scores.shape[-1]
        candidates = min(CANDIDATES_PER_DETECTION * limit, MAX_CANDIDATES)
        if boxes.shape[1] is not None:
            candidates = min(boxes.shape[1] * classes, candidates)
        else:  # anchors known only when the graph runs
            candidates = tf.minimum(tf.shape(boxes)[1] * classes, candidates)

        if images is not None and None not in images.shape[1:3]:
            extent = max(images.shape[1:3])
        else:  # called on boxes alone: the largest finite coordinate of the batch
            extent = tf.reduce_max(tf.where(tf.abs(boxes) < 1e30, tf.abs(boxes), 1.0))

        def select(pair):  # the padded form of tf.image.non_max_suppression's kernel: static shapes, XLA-able
            image_boxes, image_scores = pair
            confidence, index = tf.math.top_k(tf.reshape(image_scores, [-1]), candidates)  # anchor-major
            label = index % classes
            found = tf.gather(image_boxes, index // classes)
            out = tf.raw_ops.NonMaxSuppressionV4(
                boxes=class_apart(found, label, extent), scores=confidence, max_output_size=limit,
                iou_threshold=self.iou_threshold, score_threshold=self.confidence_threshold,
                pad_to_max_output_size=True)
            chosen = out.selected_indices
            return tf.gather(found, chosen), tf.gather(confidence, chosen), tf.gather(label, chosen), out.valid_outputs

        kept, confidence, labels, count = tf.map_fn(select, (boxes, scores), fn_output_signature=(
            tf.TensorSpec([limit, 4], tf.float32), tf.TensorSpec([limit], tf.float32),
            tf.TensorSpec([limit], tf.int32), tf.TensorSpec([], tf.int32)))
        valid = tf.range(limit)[tf.newaxis, :] < count[:, tf.newaxis]
        kept = keras.utils.bounding_boxes.convert_format(kept, source="yxyx", target=self.bounding_box_format)
        return {
            "boxes": tf.where(valid[..., tf.newaxis], tf.cast(kept, box_prediction.dtype), -1),
            "confidence": tf.where(valid, confidence, -1.0),
            "labels": tf.where(valid, labels, -1),
            "num_detections": count,
        }
