"""Non-maximum suppression with TensorFlow's greedy kernel, one image at a time.

KerasHub's `NonMaxSuppression` layer runs a tiled, padded NMS written in Keras ops: it
builds the IoU of every anchor box against every other in 512-box tiles, whatever the
scores, and on this project's small CPU models that was ~55% of a prediction's CPU time
(at 128 px, 3,024 anchors: 1.15 s of network and 1.7 s of decoding for 320 photos, one
thread). `GreedyNonMaxSuppression` keeps the layer's settings and output (boxes,
confidence, labels, num_detections; rows past num_detections at -1) and selects with
TensorFlow's greedy NMS kernel (`tf.image.non_max_suppression`'s, in its padded form; boxes
at or below the confidence threshold never considered). The selections agree with KerasHub's
except for some low-score boxes near the threshold, where the tiled algorithm's batched
suppression differs from strict greedy order.

Models saved before this layer existed keep KerasHub's (their `model.keras` names it).

Example:
    >>> import numpy as np
    >>> nms = GreedyNonMaxSuppression(bounding_box_format="yxyx", from_logits=False, max_detections=3)
    >>> boxes = np.array([[[0, 0, 10, 10], [0, 1, 10, 11], [20, 20, 30, 30]]], "float32")
    >>> scores = np.array([[[0.9, 0.1], [0.8, 0.1], [0.1, 0.7]]], "float32")
    >>> out = nms(boxes, scores)
    >>> int(out["num_detections"][0]), out["labels"][0].numpy().tolist(), [round(float(c), 2) for c in out["confidence"][0]]
    (2, [0, 1, -1], [0.9, 0.7, -1.0])
"""

from __future__ import annotations

import keras
import keras_hub
import tensorflow as tf


@keras.saving.register_keras_serializable(package="detpipe")
class GreedyNonMaxSuppression(keras_hub.layers.NonMaxSuppression):
    """KerasHub's `NonMaxSuppression` (same settings and outputs), selecting with
    TensorFlow's greedy NMS kernel per image. Class-agnostic, as KerasHub's: a box's score
    is its best class's."""

    def call(self, box_prediction, class_prediction, images=None):
        if "rel" in self.bounding_box_format:  # relative boxes need the image size: KerasHub's path
            return super().call(box_prediction, class_prediction, images)
        boxes = tf.cast(keras.utils.bounding_boxes.convert_format(
            box_prediction, source=self.bounding_box_format, target="yxyx"), tf.float32)
        scores = tf.sigmoid(class_prediction) if self.from_logits else class_prediction
        confidence = tf.cast(tf.reduce_max(scores, axis=-1), tf.float32)
        limit = self.max_detections

        def select(pair):  # the padded form of tf.image.non_max_suppression's kernel: static shapes, XLA-able
            out = tf.raw_ops.NonMaxSuppressionV4(
                boxes=pair[0], scores=pair[1], max_output_size=limit, iou_threshold=self.iou_threshold,
                score_threshold=self.confidence_threshold, pad_to_max_output_size=True)
            return out.selected_indices, out.valid_outputs

        chosen, count = tf.map_fn(select, (boxes, confidence), fn_output_signature=(
            tf.TensorSpec([limit], tf.int32), tf.TensorSpec([], tf.int32)))
        valid = tf.range(limit)[tf.newaxis, :] < count[:, tf.newaxis]
        kept = keras.utils.bounding_boxes.convert_format(
            tf.gather(boxes, chosen, batch_dims=1), source="yxyx", target=self.bounding_box_format)
        labels = tf.argmax(tf.gather(scores, chosen, batch_dims=1), axis=-1, output_type=tf.int32)
        return {
            "boxes": tf.where(valid[..., tf.newaxis], tf.cast(kept, box_prediction.dtype), -1),
            "confidence": tf.where(valid, tf.gather(confidence, chosen, batch_dims=1), -1.0),
            "labels": tf.where(valid, labels, -1),
            "num_detections": count,
        }
