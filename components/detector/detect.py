"""Detections for any number of images, with the detector always run on one fixed batch shape.

KerasHub's `NonMaxSuppression` sizes its buffers from the static batch dimension
(`ops.zeros([batch_size], "int32")`), so a batch of unknown size (Keras traces the last,
partial batch of `model.predict` with `None`) crashes it. Here every call of the detector
sees exactly `batch_size` images: the images are padded with black ones up to a multiple of
`batch_size`, run chunk by chunk inside one graph, and the padded images' outputs are
dropped. The padding is written in TensorFlow ops, not numpy, so the same function works
inside a SavedModel signature whose batch is unknown until a request arrives.

Images come in already at the model size: `records.to_model_image` is the one
preprocessing that training, evaluation and serving share.

Example:
    >>> from components.detector.model import ModelConfig, build_detector
    >>> model = build_detector(ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 16, 16, 16)))
    >>> out = detect(model, tf.zeros([3, 64, 64, 3]), batch_size=2)
    >>> out["boxes"].shape[0], out["num_detections"].shape
    (3, TensorShape([3]))
"""

from __future__ import annotations

import keras
import tensorflow as tf


def _one_batch(model: keras.Model, images: tf.Tensor) -> dict[str, tf.Tensor]:
    """The detector on one batch of static size: raw outputs decoded and NMS applied, as
    `model.predict_step` does. Keys: boxes (pixel yxyx at the model size), confidence,
    labels (0-based), num_detections. The raw outputs are decoded in float32: a model built
    under a mixed policy (one scored as it trains) gives float16 or bfloat16 outputs, which
    KerasHub's box decoding multiplies by its float32 anchors."""
    raw = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), model(images, training=False))
    return model.decode_predictions(raw, images)


def detect(model: keras.Model, images: tf.Tensor, batch_size: int, scale: float = 1.0) -> dict[str, tf.Tensor]:
    """Decoded detections for `images` ([N, S, S, 3], N any, 0 included), one row per image:
    what the model takes is `images` as float32 times `scale`, made a batch at a time (uint8
    tiles of a large photo with scale 1/255 stay a quarter of float32's bytes until their
    batch runs). Runs eagerly or inside a tf.function / SavedModel signature."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    size = images.shape[1]
    if size is None or images.shape[2] is None:
        raise ValueError("detect needs images of a static size; resize them with records.to_model_image first")
    count = tf.shape(images)[0]
    padded = (count + batch_size - 1) // batch_size * batch_size
    images = tf.pad(images, [[0, padded - count], [0, 0], [0, 0], [0, 0]])
    chunks = tf.reshape(images, [-1, batch_size, size, images.shape[2], 3])
    spec = tf.TensorSpec([batch_size, size, images.shape[2], 3], images.dtype)
    # map_fn needs the per-chunk output signature; its dtypes follow the model's precision
    # policy, so trace one batch to learn it rather than assume them, and run that trace for
    # every chunk (tracing the model again in map_fn's body doubled the cost of every trace
    # of `detect`: an export's, an evaluation's).
    def model_input(batch):
        batch = tf.cast(batch, tf.float32)
        return batch if scale == 1.0 else batch * scale

    traced = tf.function(lambda batch: _one_batch(model, model_input(batch))).get_concrete_function(spec)
    signature = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in traced.structured_outputs.items()}
    outputs = tf.map_fn(traced, chunks, fn_output_signature=signature)
    # [chunks, batch, ...] → [chunks * batch, ...] → the first `count` rows (the real images).
    return {k: tf.reshape(v, tf.concat([[-1], tf.shape(v)[2:]], 0))[:count] for k, v in outputs.items()}


class BatchDetector:
    """`detect` compiled once for a model and a batch size: call it with any number of
    images at the model size; it returns numpy arrays, one row per image.

    Used by evaluation (and through it by tuning): one traced graph, no per-image calls.
    """

    def __init__(self, model: keras.Model, image_size: int, batch_size: int = 32):
        self.image_size, self.batch_size = image_size, batch_size
        self._fn = tf.function(lambda images: detect(model, images, batch_size),
                               input_signature=[tf.TensorSpec([None, image_size, image_size, 3], tf.float32)])

    def __call__(self, images) -> dict:
        return {k: v.numpy() for k, v in self._fn(tf.convert_to_tensor(images, tf.float32)).items()}
