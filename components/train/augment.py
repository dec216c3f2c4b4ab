"""Box-aware augmentation for detection, with one strength knob.

Per image (boxes normalised `yxyx` in [0, 1]):
  - scale jitter: a random window, zooming in (crop) or out (padding) by up to
    ±40% x strength, resized to the model size; boxes move with it, and boxes the crop
    cuts away are dropped;
  - horizontal flip with probability 0.5;
  - brightness shift in ±0.3 * strength and contrast factor in 1 ± 0.4 * strength.

Where the work runs: the input pipeline (host CPUs) does the scale jitter, which needs the
decoded image, and draws the rest per image (`draw`: three numbers) and flips the boxes; the
train step does the pixel work of the flip and the photometric jitter on the whole batch
(`finish`, on the accelerator, fused by XLA), where it costs next to nothing. Done per image
on the host (`random_flip` and `photometric`, TensorFlow's own image ops: what a tutorial
pipeline does, kept as the reference `finish` is tested against) it took half of a 2-core
host's input time at 320 px (benchmarks/input_pipeline.py --op-costs).

All randomness is stateless from (seed, position), so `--deterministic` runs repeat
exactly and a resumed run continues the same sequence. Written here because KerasHub's
and Keras' augmentation layers either ignore boxes or keep boxes that a crop cut away.
"""

from __future__ import annotations

import math

import tensorflow as tf

MIN_VISIBLE = 0.4  # keep a cropped box only if at least this share of its area is left
GREY = 127.0  # where a zoomed-out window lies outside the image
FLIP, BRIGHTNESS, CONTRAST = range(3)  # what `draw` draws per image, in this order
NO_DRAWS = (0.0, 0.0, 1.0)  # not flipped, no brightness shift, contrast factor 1


def smallest_window(strength: float) -> float:
    """The smallest side of a `scale_jitter` window, as a fraction of the image's side."""
    s = min(max(strength, 0.0), 1.0)
    return (1.0 - 0.4 * s) * math.exp(-0.15 * s)


def scale_jitter(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, strength: float, seed: tf.Tensor,
                 size: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Resize a random window of the image to `size` x `size` (float32, 0-255).

    The window's sides are a random factor in [1 - 0.4 s, 1 + 0.4 s] of the image's (with
    a little aspect jitter): below 1 it zooms in (a crop), above 1 it zooms out (the image
    lies somewhere inside the window, the rest is grey). Boxes move with the window, are
    clipped to it, and a box that keeps less than `MIN_VISIBLE` of its area gets label 0,
    which the input pipeline turns into the padding label the detector ignores (cheaper
    than removing it). Boxes follow the exact whole-pixel window that is resized.
    """
    s = min(max(strength, 0.0), 1.0)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scale = tf.random.stateless_uniform([], seeds[0], 1.0 - 0.4 * s, 1.0 + 0.4 * s)
    aspect = tf.exp(tf.random.stateless_uniform([], seeds[1], -0.15 * s, 0.15 * s))
    window = tf.stack([scale * aspect, scale / aspect])  # (height, width) as fractions of the image
    start = tf.random.stateless_uniform([2], seeds[2]) * (1.0 - window)  # also right when window > 1

    # In whole pixels: the window, its overlap with the image, and where that overlap
    # lands in the output. A slice plus tf.image.resize plus a pad is several times faster
    # on a CPU than one crop_and_resize (benchmarks/input_pipeline.py).
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    win = tf.maximum(tf.round(window * shape), 1.0)
    top_left = tf.round(start * shape)
    inner0 = tf.maximum(top_left, 0.0)
    inner = tf.maximum(tf.minimum(top_left + win, shape) - inner0, 1.0)
    part = tf.clip_by_value(tf.round(inner * size / win), 1.0, float(size))
    offset = tf.clip_by_value(tf.round((inner0 - top_left) * size / win), 0.0, size - part)
    crop = tf.slice(image, tf.concat([tf.cast(inner0, tf.int32), [0]], 0),
                    tf.concat([tf.cast(inner, tf.int32), [-1]], 0))
    resized = tf.image.resize(crop, tf.cast(part, tf.int32))
    pad = tf.cast(tf.stack([offset, size - offset - part], axis=1), tf.int32)
    resized = tf.pad(resized, tf.concat([pad, [[0, 0]]], 0), constant_values=GREY)
    resized = tf.ensure_shape(resized, [size, size, None])
    # The exact map from image to output coordinates, as a window for window_boxes.
    pixels_per_output = inner / part  # image pixels per output pixel
    extent = size * pixels_per_output / shape
    origin = (inner0 - offset * pixels_per_output) / shape
    return (resized, *window_boxes(boxes, labels, origin, extent))


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


def _flips(seed: tf.Tensor) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed) < 0.5


def _mirrored(boxes: tf.Tensor) -> tf.Tensor:
    return tf.stack([boxes[:, 0], 1.0 - boxes[:, 3], boxes[:, 2], 1.0 - boxes[:, 1]], axis=-1)


def draw(strength: float, flip: bool, flip_seed: tf.Tensor, photometric_seed: tf.Tensor) -> tf.Tensor:
    """One image's flip (1.0 or 0.0), brightness shift and contrast factor: the very numbers
    `random_flip` and `photometric` draw from the same seeds ([3] float32, see `finish`)."""
    flipped = tf.cast(_flips(flip_seed), tf.float32) if flip else tf.constant(NO_DRAWS[FLIP])
    if strength <= 0:
        return tf.stack([flipped, tf.constant(NO_DRAWS[BRIGHTNESS]), tf.constant(NO_DRAWS[CONTRAST])])
    seeds = tf.random.experimental.stateless_split(photometric_seed, 2)
    shift = tf.random.stateless_uniform([], seeds[0], -0.3 * strength, 0.3 * strength)
    factor = tf.random.stateless_uniform([], seeds[1], 1.0 - 0.4 * strength, 1.0 + 0.4 * strength)
    return tf.stack([flipped, shift, factor])


def flip_boxes(boxes: tf.Tensor, draws: tf.Tensor) -> tf.Tensor:
    """The boxes of an image `draws` flips, mirrored (the pixels follow in `finish`)."""
    return tf.where(draws[FLIP] > 0.5, _mirrored(boxes), boxes)


def finish(images: tf.Tensor, draws: tf.Tensor) -> tf.Tensor:
    """A batch of images (float32, 0-255) and their `draws` ([batch, 3]) → what the model
    trains on: in [0, 1], flipped where drawn, brightness shifted, contrast scaled about each
    channel's mean (as TensorFlow's AdjustContrastv2), clipped. Per image the same as `/ 255`,
    `random_flip` and `photometric` with the seeds `draw` took (tests/test_augment.py)."""
    images = tf.convert_to_tensor(images, tf.float32) / 255.0
    column = lambda k: tf.reshape(draws[:, k], [-1, 1, 1, 1])  # noqa: E731 (one value per image)
    images = tf.where(column(FLIP) > 0.5, tf.reverse(images, axis=[2]), images)
    images = images + column(BRIGHTNESS)
    mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
    return tf.clip_by_value((images - mean) * column(CONTRAST) + mean, 0.0, 1.0)


def random_flip(image: tf.Tensor, boxes: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per image (the reference, see the module's docstring): mirror left-right with
    probability 0.5, boxes with the pixels."""
    flip = _flips(seed)
    image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
    return image, tf.where(flip, _mirrored(boxes), boxes)


def photometric(image: tf.Tensor, strength: float, seed: tf.Tensor) -> tf.Tensor:
    """Per image (the reference, see the module's docstring): brightness shift and contrast
    factor of one image in [0, 1], with TensorFlow's own image ops."""
    if strength <= 0:
        return image
    seeds = tf.random.experimental.stateless_split(seed, 2)
    image = tf.image.stateless_random_brightness(image, 0.3 * strength, seeds[0])
    image = tf.image.stateless_random_contrast(image, 1.0 - 0.4 * strength, 1.0 + 0.4 * strength, seeds[1])
    return tf.clip_by_value(image, 0.0, 1.0)
