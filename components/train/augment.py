"""Box-aware augmentation for detection, with one strength knob.

Per image (boxes normalised `yxyx` in [0, 1]):
  - scale jitter: a random window, zooming in (crop) or out (padding) by up to
    ±40% x strength, resized to the model size; boxes move with it, and boxes the crop
    cuts away are dropped;
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
    resized = tf.image.resize(crop, tf.cast(part, tf.int32)) - 127.0
    pad = tf.cast(tf.stack([offset, size - offset - part], axis=1), tf.int32)
    resized = tf.pad(resized, tf.concat([pad, [[0, 0]]], 0)) + 127.0  # grey where the window is outside
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


def mosaic(images: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, probability: float,
           seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """YOLO's mosaic over a group of four training images: each output k is, with
    `probability`, the four images at half scale in a 2x2 grid starting with image k, the
    grid shifted by up to a quarter of the side (grey where it uncovers the canvas); else
    image k as it was.

    `images` (4, S, S, C) in [0, 1]; `boxes` (4, N, 4) pixel yxyx at S; `labels` (4, N),
    -1 for padding. Returns (4, S, S, C), (4, 4N, 4), (4, 4N): boxes move and shrink with
    their image, are clipped to the canvas, and get label -1 when less than `MIN_VISIBLE`
    of their area is left. Four outputs per four inputs, so an epoch still decodes each
    image once."""
    size = images.shape[1]
    half = size // 2
    small = tf.nn.avg_pool2d(images, 2, 2, "VALID")  # each image at half scale, (4, S/2, S/2, C)
    count = tf.shape(boxes)[1]
    # Where each quadrant's image lands: row and column offsets of quadrants 0-3.
    quadrant = tf.constant([[0, 0], [0, 1], [1, 0], [1, 1]], tf.float32) * half
    seeds = tf.random.experimental.stateless_split(seed, 4)
    out_images, out_boxes, out_labels = [], [], []
    for k in range(4):
        order = [(k + j) % 4 for j in range(4)]
        picked = tf.gather(small, order)
        grid = tf.concat([tf.concat([picked[0], picked[1]], 1), tf.concat([picked[2], picked[3]], 1)], 0)
        parts = tf.random.experimental.stateless_split(seeds[k], 2)
        shift = tf.random.stateless_uniform([2], parts[0], -(size // 4), size // 4 + 1, tf.int32)
        grey = tf.pad(grid - 0.5, [[half, half], [half, half], [0, 0]]) + 0.5
        canvas = tf.slice(grey, tf.concat([half - shift, [0]], 0), [size, size, -1])
        moved = tf.gather(boxes, order) * 0.5 + tf.tile(quadrant, [1, 2])[:, None, :]
        moved = tf.reshape(moved, [-1, 4]) + tf.tile(tf.cast(shift, tf.float32), [2])
        clipped = tf.clip_by_value(moved, 0.0, float(size))
        area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
        kept = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1]) >= MIN_VISIBLE * tf.maximum(area, 1e-6)
        grouped = tf.reshape(tf.gather(labels, order), [-1])
        mixed_labels = tf.where(kept, grouped, -tf.ones_like(grouped))
        use = tf.random.stateless_uniform([], parts[1]) < probability
        own = tf.pad(boxes[k], [[0, 3 * count], [0, 0]])
        own_labels = tf.pad(labels[k], [[0, 3 * count]], constant_values=-1.0)
        out_images.append(tf.where(use, canvas, images[k]))
        out_boxes.append(tf.where(use, clipped, own))
        out_labels.append(tf.where(use, mixed_labels, own_labels))
    return tf.stack(out_images), tf.stack(out_boxes), tf.stack(out_labels)
