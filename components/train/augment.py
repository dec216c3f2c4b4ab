"""Box-aware augmentation for detection, with one strength knob.

Per image (boxes normalised `yxyx` in [0, 1]):
  - scale jitter: a random window, zooming in (crop) or out (padding) by up to
    ±40% x strength, resized to the model size; boxes move with it, and boxes the crop
    cuts away are dropped;
  - horizontal flip with probability 0.5;
  - brightness shift in ±0.3 * strength and contrast factor in 1 ± 0.4 * strength.

Where the work runs: the input pipeline (host CPUs) does the scale jitter, which needs the
decoded image, draws the rest per image (`draw`: three numbers) and flips the boxes. The
pixel work of the flip and the photometric jitter runs, on a GPU or under XLA, in the train
step on the whole batch (`finish`: a few elementwise passes, fused by XLA), where it costs
next to nothing and leaves the host's CPUs to decoding (done per image on a 2-core host it
took half of the input time at 320 px: benchmarks/input_pipeline.py --op-costs); on a CPU
without XLA on the host, image by image with TensorFlow's fused image kernels (`finish_one`),
whose passes stay in cache (there about 4x cheaper than the batch's passes through memory,
and overlapped with the train step).

All randomness is stateless from (seed, position), so `--deterministic` runs repeat
exactly and a resumed run continues the same sequence. Written here because KerasHub's
and Keras' augmentation layers either ignore boxes or keep boxes that a crop cut away.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf

from components.train.augment_settings import clamped_strength

MIN_VISIBLE = 0.4  # keep a cropped box only if at least this share of its area is left
# The 1-based label of an ignored region: the input pipeline's 0-based shift makes it -2,
# KerasHub's RetinaNetLabelEncoder's `ignore_class`, whose anchors the loss skips (taught
# neither object nor background).
IGNORED = -1
GREY = 127  # where a zoomed-out window lies outside the image
FLIP, BRIGHTNESS, CONTRAST = range(3)  # what `draw` draws per image, in this order
NO_DRAWS = (0.0, 0.0, 1.0)  # not flipped, no brightness shift, contrast factor 1
ZOOM = 0.4  # at strength 1, a scale jitter window's sides are 1 ± ZOOM of the image's
ASPECT = 0.15  # ... times exp(± ASPECT) one way and its inverse the other


def smallest_window(strength: float) -> float:
    """The smallest side of a `scale_jitter` window, as a fraction of the image's side."""
    s = clamped_strength(strength)
    return (1.0 - ZOOM * s) * math.exp(-ASPECT * s)


def resize_uint8(image: tf.Tensor, size) -> tf.Tensor:
    """`tf.image.resize` (bilinear) rounded back to uint8: what the host hands on, a quarter of
    float32's bytes through batching, prefetch buffers and the copy to an accelerator (at
    320 px ~6% of the host's time per image here: benchmarks/input_pipeline.py); the
    rounding (at most half a grey level) is far below the photometric jitter's."""
    # + 0.5 then truncation rounds: a bilinear resize of uint8 stays within [0, 255].
    return tf.cast(tf.image.resize(image, size) + 0.5, tf.uint8)


class Window(NamedTuple):
    """A scale jitter window in whole pixels of the image (float32 (y, x) pairs): `corner` and
    `extent` of its overlap with the image (what is decoded or sliced), `part` and `offset`:
    where that overlap lands in the output, resized; `origin` and `span`: the output's
    extent in the image as fractions of it (for `window_boxes`)."""

    corner: tf.Tensor
    extent: tf.Tensor
    part: tf.Tensor
    offset: tf.Tensor
    origin: tf.Tensor
    span: tf.Tensor


def jitter_window(shape: tf.Tensor, strength: float, seed: tf.Tensor, size: int, base=1.0) -> Window:
    """A random window of an image of `shape` ((height, width), float32) to resize to `size`:
    its sides a random factor in [1 - 0.4 s, 1 + 0.4 s] (with a little aspect jitter) of
    `base` (fractions of the image's sides: 1, the whole image; a tile's `tile / shape`),
    at a random place; a window larger than the image zooms out (the image lies somewhere
    inside it, the rest grey)."""
    s = clamped_strength(strength)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scale = tf.random.stateless_uniform([], seeds[0], 1.0 - ZOOM * s, 1.0 + ZOOM * s)
    aspect = tf.exp(tf.random.stateless_uniform([], seeds[1], -ASPECT * s, ASPECT * s))
    window = base * tf.stack([scale * aspect, scale / aspect])  # (height, width) as fractions of the image
    start = tf.random.stateless_uniform([2], seeds[2]) * (1.0 - window)  # also right when window > 1
    return pixel_window(shape, window, start, size)


def pixel_window(shape: tf.Tensor, window: tf.Tensor, start: tf.Tensor, size: int) -> Window:
    """The window of an image of `shape` ((height, width), float32) with sides `window` and
    top-left corner `start` ((y, x) fractions of the image's sides; it may reach past the image)
    to resize to `size`, in whole pixels (`Window`)."""
    # In whole pixels: the window, its overlap with the image, and where that overlap
    # lands in the output. A slice plus tf.image.resize plus a pad is several times faster
    # on a CPU than one crop_and_resize (benchmarks/input_pipeline.py).
    win = tf.maximum(tf.round(window * shape), 1.0)
    top_left = tf.round(start * shape)
    corner = tf.maximum(top_left, 0.0)
    extent = tf.maximum(tf.minimum(top_left + win, shape) - corner, 1.0)
    part = tf.clip_by_value(tf.round(extent * size / win), 1.0, float(size))
    offset = tf.clip_by_value(tf.round((corner - top_left) * size / win), 0.0, size - part)
    # The exact map from image to output coordinates.
    pixels_per_output = extent / part  # image pixels per output pixel
    return Window(corner, extent, part, offset, origin=(corner - offset * pixels_per_output) / shape,
                  span=size * pixels_per_output / shape)


def fill_window(crop: tf.Tensor, window: Window, size: int) -> tf.Tensor:
    """The image's overlap with the window (`crop`, uint8) → the window at `size` x `size`
    (uint8: `resize_uint8`, grey where the window lies outside the image)."""
    resized = resize_uint8(crop, tf.cast(window.part, tf.int32))
    pad = tf.cast(tf.stack([window.offset, size - window.offset - window.part], axis=1), tf.int32)
    resized = tf.pad(resized, tf.concat([pad, [[0, 0]]], 0), constant_values=GREY)
    return tf.ensure_shape(resized, [size, size, None])


def scale_jitter(image: tf.Tensor, boxes: tf.Tensor, labels: tf.Tensor, strength: float, seed: tf.Tensor,
                 size: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Resize a random window of the uint8 image (`jitter_window`) to `size` x `size` (uint8).

    Boxes move with the window, are clipped to it, and a box that keeps less than
    `MIN_VISIBLE` of its area gets label 0, which the input pipeline turns into the padding
    label the detector ignores (cheaper than removing it). Boxes follow the exact
    whole-pixel window that is resized.
    """
    window = jitter_window(tf.cast(tf.shape(image)[:2], tf.float32), strength, seed, size)
    crop = tf.slice(image, tf.concat([tf.cast(window.corner, tf.int32), [0]], 0),
                    tf.concat([tf.cast(window.extent, tf.int32), [-1]], 0))
    return (fill_window(crop, window, size), *window_boxes(boxes, labels, window.origin, window.span))


def window_boxes(boxes: tf.Tensor, labels: tf.Tensor, start: tf.Tensor, window: tf.Tensor,
                 cut_label: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """Boxes in the coordinates of a window (`start`, `window`: (y, x) fractions of the
    image), clipped to it; label 0 for boxes outside it, and `cut_label` for boxes it cuts so
    that less than `MIN_VISIBLE` of their area is left (0: dropped; `IGNORED`: an ignored
    region, the tiled training's rule: a fragment is neither an object nor background)."""
    offset = tf.concat([start, start], 0)
    extent = tf.concat([window, window], 0)
    moved = (boxes - offset) / extent
    clipped = tf.clip_by_value(moved, 0.0, 1.0)
    area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    kept = visible >= MIN_VISIBLE * tf.maximum(area, 1e-12)
    cut = (visible > 0) & (labels > 0)
    return clipped, tf.where(kept, labels, tf.where(cut, tf.cast(cut_label, labels.dtype), tf.zeros_like(labels)))


def draw(strength: float, flip: bool, flip_seed: tf.Tensor, photometric_seed: tf.Tensor) -> tf.Tensor:
    """One image's flip (1.0 or 0.0), brightness shift and contrast factor ([3] float32, see
    `finish`): the numbers TensorFlow's `stateless_random_flip_left_right`,
    `stateless_random_brightness` and `stateless_random_contrast` draw from the same seeds."""
    flipped = (tf.cast(tf.random.stateless_uniform([], flip_seed) < 0.5, tf.float32) if flip
               else tf.constant(NO_DRAWS[FLIP]))
    if strength <= 0:
        return tf.stack([flipped, tf.constant(NO_DRAWS[BRIGHTNESS]), tf.constant(NO_DRAWS[CONTRAST])])
    seeds = tf.random.experimental.stateless_split(photometric_seed, 2)
    shift = tf.random.stateless_uniform([], seeds[0], -0.3 * strength, 0.3 * strength)
    factor = tf.random.stateless_uniform([], seeds[1], 1.0 - 0.4 * strength, 1.0 + 0.4 * strength)
    return tf.stack([flipped, shift, factor])


def orient(image: tf.Tensor, boxes: tf.Tensor, orientations: str, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A square image (uint8, [S, S, C]) and its normalised yxyx boxes turned as `orientations`
    allows (augment_settings.ORIENTATIONS): "flips" flips it upside down with probability 0.5, "any"
    also turns it a quarter counter-clockwise 0-3 times (uniformly); "upright" leaves it. On the
    host, before the horizontal flip `draw` draws (which then mirrors the turned image)."""
    if orientations == "upright":
        return image, boxes
    seeds = tf.random.experimental.stateless_split(seed, 2)
    upside_down = tf.random.stateless_uniform([], seeds[0]) < 0.5
    image = tf.cond(upside_down, lambda: tf.reverse(image, axis=[0]), lambda: image)
    y0, x0, y1, x1 = tf.unstack(boxes, axis=-1)
    boxes = tf.where(upside_down, tf.stack([1.0 - y1, x0, 1.0 - y0, x1], axis=-1), boxes)
    if orientations != "any":
        return image, boxes
    turns = tf.random.stateless_uniform([], seeds[1], 0, 4, dtype=tf.int32)
    y0, x0, y1, x1 = tf.unstack(boxes, axis=-1)
    # tf.image.rot90 turns counter-clockwise: a point (y, x) goes to (1 - x, y).
    turned = tf.stack([
        boxes,
        tf.stack([1.0 - x1, y0, 1.0 - x0, y1], axis=-1),
        tf.stack([1.0 - y1, 1.0 - x1, 1.0 - y0, 1.0 - x0], axis=-1),
        tf.stack([x0, 1.0 - y1, x1, 1.0 - y0], axis=-1),
    ])
    return tf.image.rot90(image, turns), tf.gather(turned, turns)


def flip_pixels(image: tf.Tensor, draws: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The horizontal flip `draws` holds done on the host (image [S, S, C]) and taken out of
    the draws: what a mosaic needs of its four images before it lays them out (mosaic.py)."""
    image = tf.cond(draws[FLIP] > 0.5, lambda: tf.reverse(image, axis=[1]), lambda: image)
    return image, tf.tensor_scatter_nd_update(draws, [[FLIP]], [0.0])


def flip_boxes(boxes: tf.Tensor, draws: tf.Tensor) -> tf.Tensor:
    """The boxes of an image `draws` flips, mirrored (the pixels follow in `finish`)."""
    mirrored = tf.stack([boxes[:, 0], 1.0 - boxes[:, 3], boxes[:, 2], 1.0 - boxes[:, 1]], axis=-1)
    return tf.where(draws[FLIP] > 0.5, mirrored, boxes)


def finish_one(image: tf.Tensor, draws: tf.Tensor) -> tf.Tensor:
    """One image (0-255, uint8 or float) and its `draws` → what the model trains on: in [0, 1],
    flipped if drawn, brightness shifted, contrast scaled about each channel's mean, clipped;
    with TensorFlow's own image kernels."""
    image = tf.cast(image, tf.float32) / 255.0
    image = tf.cond(draws[FLIP] > 0.5, lambda: tf.image.flip_left_right(image), lambda: image)
    image = tf.image.adjust_brightness(image, draws[BRIGHTNESS])
    return tf.clip_by_value(tf.image.adjust_contrast(image, draws[CONTRAST]), 0.0, 1.0)


def finish(images: tf.Tensor, draws: tf.Tensor) -> tf.Tensor:
    """A batch of images (0-255, uint8 or float) and their `draws` ([batch, 3]) → what the model
    trains on, each image as `finish_one` makes it, the whole batch at once (for an
    accelerator): contrast about the mean is an affine map, x * f / 255 + shift + mean(x) *
    (1 - f) / 255, and a flip a gather of the columns in reverse, so four passes over the batch."""
    images = tf.cast(images, tf.float32)
    column = lambda k: tf.reshape(draws[:, k], [-1, 1, 1, 1])  # noqa: E731 (one value per image)
    scale = column(CONTRAST) / 255.0
    offset = column(BRIGHTNESS) + tf.reduce_mean(images, axis=[1, 2], keepdims=True) * (1.0 - column(CONTRAST)) / 255.0
    width = tf.shape(images)[2]
    columns = tf.range(width)[tf.newaxis, :]
    order = tf.where(draws[:, FLIP:FLIP + 1] > 0.5, width - 1 - columns, columns)  # [batch, width]
    images = tf.gather(images, order, axis=2, batch_dims=1)
    return tf.clip_by_value(images * scale + offset, 0.0, 1.0)
