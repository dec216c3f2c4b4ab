"""Box-aware augmentation for detection, with one strength knob.

Per image, before resizing to the model size (boxes normalised `yxyx` in [0, 1]):
  - random crop (scale jitter): each side keeps a random fraction in
    [1 - 0.5 * strength, 1] of the image; boxes move with the crop, are clipped to it, and
    a box that keeps less than `MIN_VISIBLE` of its area is dropped (label 0: padding);
  - horizontal flip with probability 0.5.
After resizing:
  - brightness shift in ±0.3 * strength and contrast factor in 1 ± 0.4 * strength.
(A vectorised per-batch version of the photometric step measured slower on 2 cores.)

All randomness is stateless from (seed, position), so `--deterministic` runs repeat
exactly and a resumed run continues the same sequence. Written here because KerasHub's
and Keras' augmentation layers either ignore boxes or keep boxes that a crop cut away.
"""

from __future__ import annotations

import tensorflow as tf

MIN_VISIBLE = 0.4  # keep a cropped box only if at least this share of its area is left


def random_crop(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, strength: float,
                seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Crop a random window; returns the cropped image, the clipped boxes, and the labels with
    0 (dropped) for boxes cut away."""
    if strength <= 0:
        return image, boxes, labels
    shape = tf.shape(image)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    keep = tf.random.stateless_uniform([2], seed, minval=1.0 - 0.5 * min(strength, 1.0), maxval=1.0)
    offset = tf.random.stateless_uniform([2], seed + 1) * (1.0 - keep)
    top, left = tf.floor(offset[0] * height), tf.floor(offset[1] * width)
    crop_h = tf.maximum(1.0, tf.floor(keep[0] * height))
    crop_w = tf.maximum(1.0, tf.floor(keep[1] * width))
    # A plain slice: crop_to_bounding_box adds a dozen shape checks per image.
    begin = tf.stack([tf.cast(top, tf.int32), tf.cast(left, tf.int32), 0])
    image = tf.slice(image, begin, tf.stack([tf.cast(crop_h, tf.int32), tf.cast(crop_w, tf.int32), -1]))
    scale = tf.stack([height / crop_h, width / crop_w, height / crop_h, width / crop_w])
    shift = tf.stack([top / height, left / width, top / height, left / width])
    moved = (boxes - shift) * scale
    clipped = tf.clip_by_value(moved, 0.0, 1.0)
    area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    kept = visible >= MIN_VISIBLE * tf.maximum(area, 1e-12)
    # A dropped box gets label 0, which the input pipeline turns into the padding label -1
    # that the detector ignores: cheaper per image than removing it with boolean_mask.
    return image, clipped, tf.where(kept, labels, tf.zeros_like(labels))


def random_flip(image: tf.Tensor, boxes: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mirror left-right with probability 0.5, boxes with the pixels."""
    flip = tf.random.stateless_uniform([], seed) < 0.5
    image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
    flipped = tf.stack([boxes[:, 0], 1.0 - boxes[:, 3], boxes[:, 2], 1.0 - boxes[:, 1]], axis=-1)
    return image, tf.where(flip, flipped, boxes)


def photometric(image: tf.Tensor, strength: float, seed: tf.Tensor) -> tf.Tensor:
    """Brightness shift and contrast factor of one image in [0, 1] (TF's fused kernels)."""
    if strength <= 0:
        return image
    seeds = tf.random.experimental.stateless_split(seed, 2)
    image = tf.image.stateless_random_brightness(image, 0.3 * strength, seeds[0])
    image = tf.image.stateless_random_contrast(image, 1.0 - 0.4 * strength, 1.0 + 0.4 * strength, seeds[1])
    return tf.clip_by_value(image, 0.0, 1.0)
