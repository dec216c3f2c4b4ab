"""Mosaic: four training images in one, boxes included (YOLO's augmentation: Ultralytics'
`mosaic`, its `scale` 0.5 and its clean last epochs, `close_mosaic`).

Four images at the model size S (each already scale-jittered, turned and flipped as alone) are
laid out 2 x 2 on a 2S x 2S canvas. A window of side S / z of it, z uniform in
1 ± MOSAIC_SCALE (so objects appear at 0.5-1.5x their single-image size), centred anywhere in
the canvas's middle half (where the four meet: the seams fall anywhere in the window, as
Ultralytics' random mosaic centre puts them), is resized to S; a window reaching past the
canvas is grey there. Each group of four gives four mosaics, each its own window: every photo
is still decoded once a pass, and a pass still yields as many training images.

Boxes move with the canvas and the window; a box the window keeps less than
`augment.MIN_VISIBLE` of gets label 0 (dropped: padding to the loss). All draws are stateless
from (seed, the group's position), like the rest of the augmentation.

Written here because KerasHub has no box-aware mosaic (KerasCV's `Mosaic` layer is not
maintained and not a dependency).
"""

from __future__ import annotations

import tensorflow as tf

from components.train import augment
from components.train.augment_settings import MOSAIC_CLEAN_SHARE, MOSAIC_IMAGES, MOSAIC_SCALE

# Where each image of a group lies on the canvas: its top-left corner in fractions of the canvas.
_QUADRANTS = ((0.0, 0.0), (0.0, 0.5), (0.5, 0.0), (0.5, 0.5))


def canvas_boxes(boxes: tf.RaggedTensor) -> tf.Tensor:
    """The four images' normalised yxyx boxes ([4, (n_i), 4], ragged) in the canvas's
    normalised coordinates, all in one [sum n_i, 4] tensor (image 0's first).

    >>> b = tf.ragged.constant([[[0.0, 0.0, 1.0, 1.0]], [], [[0.5, 0.5, 1.0, 1.0]], []], ragged_rank=1)
    >>> canvas_boxes(b).numpy().tolist()
    [[0.0, 0.0, 0.5, 0.5], [0.75, 0.25, 1.0, 0.5]]
    """
    corner = tf.gather(tf.constant(_QUADRANTS), boxes.value_rowids())  # [n, 2]: (y, x) of its image
    return boxes.flat_values * 0.5 + tf.concat([corner, corner], axis=1)


def mosaic_window(size: int, seed: tf.Tensor) -> augment.Window:
    """One mosaic's window of the 2 `size` canvas (whole pixels, `augment.Window`)."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    zoom = tf.random.stateless_uniform([], seeds[0], 1.0 - MOSAIC_SCALE, 1.0 + MOSAIC_SCALE)
    side = 0.5 / zoom  # of the canvas: S / z of 2S
    centre = tf.random.stateless_uniform([2], seeds[1], 0.25, 0.75)
    return augment.pixel_window(tf.constant([2.0 * size] * 2), tf.stack([side, side]), centre - side / 2, size)


def mosaic_four(images: tf.Tensor, boxes: tf.RaggedTensor, labels: tf.RaggedTensor, seed: tf.Tensor,
                size: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Four images ([4, S, S, C] uint8) with their boxes ([4, (n), 4] normalised yxyx, ragged)
    and 1-based labels ([4, (n)]) → four mosaics of them: images [4, S, S, C] uint8, boxes
    [4, N, 4] and labels [4, N], N the four's boxes together, label 0 where a window dropped one."""
    canvas = tf.concat([tf.concat([images[0], images[1]], axis=1), tf.concat([images[2], images[3]], axis=1)], axis=0)
    on_canvas = canvas_boxes(boxes)
    flat_labels = labels.flat_values
    seeds = tf.random.experimental.stateless_split(seed, MOSAIC_IMAGES)
    outputs, out_boxes, out_labels = [], [], []
    for k in range(MOSAIC_IMAGES):
        window = mosaic_window(size, seeds[k])
        crop = tf.slice(canvas, tf.concat([tf.cast(window.corner, tf.int32), [0]], 0),
                        tf.concat([tf.cast(window.extent, tf.int32), [-1]], 0))
        outputs.append(augment.fill_window(crop, window, size))
        moved, kept = augment.window_boxes(on_canvas, flat_labels, window.origin, window.span)
        out_boxes.append(moved)
        out_labels.append(kept)
    return tf.stack(outputs), tf.stack(out_boxes), tf.stack(out_labels)


def takes_mosaic(asked: bool, tiled: bool) -> bool:
    """Whether a run trains on mosaics: `--mosaic` asked for it, and its model is not tiled (a
    tile of a large photo takes none)."""
    return asked and not tiled


def boxes_per_image(densest: int, mosaic: bool) -> int:
    """The most boxes a training image holds: the densest photo's, four times that in a mosaic
    (what the batch's memory and XLA's box padding are sized for).

    >>> boxes_per_image(0, False), boxes_per_image(3, True)
    (1, 12)
    """
    return max(1, densest) * (MOSAIC_IMAGES if mosaic else 1)


def clean_from(total_steps: int) -> int:
    """The first step trained without mosaic: the last MOSAIC_CLEAN_SHARE of the run's steps
    (at least one) are clean.

    >>> clean_from(1000), clean_from(5)
    (900, 4)
    """
    return max(0, total_steps - max(1, round(MOSAIC_CLEAN_SHARE * total_steps)))
