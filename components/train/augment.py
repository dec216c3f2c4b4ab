"""Box-aware augmentation for detection, with one strength knob.

Per image (boxes normalised `yxyx` in [0, 1]):
  - scale jitter: a random window, zooming in (crop) or out (padding) by up to
    ±40% x strength, resized to the model size in the same op; boxes move with it, and
    boxes the crop cuts away are dropped;
  - horizontal flip with probability 0.5;
  - brightness shift in ±0.3 * strength and contrast factor in 1 ± 0.4 * strength.
(A vectorised per-batch version of the photometric step measured slower on 2 cores.)

All randomness is stateless from (seed, position), so `--deterministic` runs repeat
exactly and a resumed run continues the same sequence. Written here because KerasHub's
and Keras' augmentation layers either ignore boxes or keep boxes that a crop cut away.
"""

from __future__ import annotations

import tensorflow as tf

MIN_VISIBLE = 0.4  # keep a cropped box only if at least this share of its area is left


def scale_jitter(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, strength: float, seed: tf.Tensor,
                 size: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Resize a random window of the image to `size` x `size` (float32, 0-255).

    The window's sides are a random factor in [1 - 0.4 s, 1 + 0.4 s] of the image's (with
    a little aspect jitter): below 1 it zooms in (a crop), above 1 it zooms out (the image
    lies somewhere inside the window, the rest is grey). Boxes move with the window, are
    clipped to it, and a box that keeps less than `MIN_VISIBLE` of its area gets label 0,
    which the input pipeline turns into the padding label the detector ignores (cheaper
    than removing it). One crop_and_resize does the crop, padding and resize, sampling
    exactly where tf.image.resize's half-pixel bilinear resize would.
    """
    s = min(max(strength, 0.0), 1.0)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scale = tf.random.stateless_uniform([], seeds[0], 1.0 - 0.4 * s, 1.0 + 0.4 * s)
    aspect = tf.exp(tf.random.stateless_uniform([], seeds[1], -0.15 * s, 0.15 * s))
    window = tf.stack([scale * aspect, scale / aspect])  # (height, width) as fractions of the image
    start = tf.random.stateless_uniform([2], seeds[2]) * (1.0 - window)  # also right when window > 1
    end = start + window

    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    half_step = 0.5 * window * shape / size  # half an output pixel, in input pixels
    first = (start * shape + half_step - 0.5) / tf.maximum(shape - 1.0, 1.0)
    last = (end * shape - half_step - 0.5) / tf.maximum(shape - 1.0, 1.0)
    resized = tf.image.crop_and_resize(image[tf.newaxis], tf.concat([first, last], 0)[tf.newaxis], [0],
                                       [size, size], extrapolation_value=127.0)[0]

    return (resized, *window_boxes(boxes, labels, start, window))


def window_boxes(boxes: tf.Tensor, labels: tf.Tensor, start: tf.Tensor,
                 window: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Boxes in the coordinates of a window (`start`, `window`: (y, x) fractions of the
    image), clipped to it; label 0 for boxes that keep less than `MIN_VISIBLE` of their area."""
    offset = tf.concat([start, start], 0)
    extent = tf.concat([window, window], 0)
    moved = (boxes - offset) / extent
    clipped = tf.clip_by_value(moved, 0.0, 1.0)
    area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    kept = visible >= MIN_VISIBLE * tf.maximum(area, 1e-12)
    return clipped, tf.where(kept, labels, tf.zeros_like(labels))


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
