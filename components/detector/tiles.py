"""Tiles of a large photo, and the detections of the whole photo from the detector run on its tiles.

A photo whose objects would shrink below the smallest anchor at the model's input size is
seen at full resolution instead, in square tiles of the input size that overlap (`Tiling`).
`tile_starts` lays them out along a side: the fewest tiles whose overlaps are at least the
asked overlap, spread evenly, the first at 0 and the last flush with the end; a side shorter
than a tile is padded with grey on its far end (as training's zoom-out pads).

An object no larger than the overlap lies whole inside some tile. So when the tiles'
detections are merged (`merge_tile_detections`), a detection that touches a tile's inner
border (one that is not the photo's edge) is a fragment of an object: it is dropped when a
detection that touches no inner border covers most of it (intersection over the fragment's
area >= FRAGMENT_COVERED), and kept otherwise (an object larger than the overlap keeps its
best fragment rather than vanishing). Then the same object seen whole by two tiles is one
detection after an NMS per class over the whole photo, the detector's own rule (nms.py).

Written here rather than taken from SAHI (the reference for sliced inference): SAHI slices
and merges in Python around a PyTorch model, image by image; this runs inside the exported
SavedModel's graph, so `serve`, `predict` and the batch job answer on whole photos unchanged.

Example (a 1000 x 600 photo, 512 px tiles overlapping by at least 64 px):
    >>> tile_starts(1000, 512, 64).numpy().tolist(), tile_starts(600, 512, 64).numpy().tolist()
    ([0, 244, 488], [0, 88])
    >>> tile_starts(300, 512, 64).numpy().tolist()  # shorter than a tile: one, padded
    [0]
"""

from __future__ import annotations

import tensorflow as tf

from components.detector.detect import detect
from components.detector.nms import class_apart
from components.detector.tile_choice import BORDER_MARGIN, Tiling

PAD_GREY = 127  # what lies beyond a photo's edge in a tile, as beyond it in training's zoom-out
FRAGMENT_COVERED = 0.6  # a fragment whose area is this much inside a whole detection is that detection's


def tile_starts(length, tile: int, overlap: int) -> tf.Tensor:
    """Where the tiles along a side of `length` pixels start (int32): the fewest tiles of
    `tile` pixels that overlap by at least `overlap`, evenly spread, the last flush with the end."""
    length = tf.cast(length, tf.int32)
    span = tf.maximum(length - tile, 0)  # where the last tile starts
    stride = tile - overlap
    count = (span + stride - 1) // stride + 1
    gaps = tf.maximum(count - 1, 1)
    return (tf.range(count) * span + gaps // 2) // gaps  # rounded: i * span / gaps


def tile_origins(height, width, tiling: Tiling) -> tf.Tensor:
    """[tiles, 2] int32 (y, x) top-left corners of a photo's tiles, row by row."""
    ys = tile_starts(height, tiling.tile, tiling.overlap)
    xs = tile_starts(width, tiling.tile, tiling.overlap)
    grid_y, grid_x = tf.meshgrid(ys, xs, indexing="ij")
    return tf.reshape(tf.stack([grid_y, grid_x], axis=-1), [-1, 2])


def cut_tiles(image: tf.Tensor, tiling: Tiling) -> tuple[tf.Tensor, tf.Tensor]:
    """A photo [H, W, C] → its tiles [T, tile, tile, C] (same dtype) and their origins [T, 2]."""
    shape = tf.shape(image)
    size = tiling.tile
    padded = tf.pad(image, [[0, tf.maximum(size - shape[0], 0)], [0, tf.maximum(size - shape[1], 0)], [0, 0]],
                    constant_values=tf.cast(PAD_GREY, image.dtype))
    origins = tile_origins(shape[0], shape[1], tiling)
    tiles = tf.map_fn(lambda corner: tf.slice(padded, tf.concat([corner, [0]], 0), [size, size, -1]), origins,
                      fn_output_signature=tf.TensorSpec([size, size, image.shape[-1]], image.dtype))
    return tiles, origins


def _inner_borders(origins: tf.Tensor, height, width, tile: int) -> tf.Tensor:
    """[T, 4] bool: whether each tile's top, left, bottom and right edges lie inside the photo."""
    y, x = origins[:, 0], origins[:, 1]
    return tf.stack([y > 0, x > 0, y + tile < tf.cast(height, tf.int32), x + tile < tf.cast(width, tf.int32)], axis=1)


def merge_tile_detections(detections: dict[str, tf.Tensor], origins: tf.Tensor, height, width, tile: int,
                          max_detections: int, iou_threshold: float = 0.5) -> dict[str, tf.Tensor]:
    """The tiles' detections (`detect`'s output for the tiles: boxes pixel yxyx in the tile,
    confidence, labels, num_detections) → one photo's, in its own pixels, as `detect` gives
    for one image: boxes [max_detections, 4], confidence, labels, num_detections (rows past it -1).

    Fragments cut by a tile's inner border are dropped where a whole detection covers them,
    then an NMS per class at `iou_threshold` keeps at most `max_detections` (see the module)."""
    boxes = tf.cast(detections["boxes"], tf.float32)
    scores = tf.cast(detections["confidence"], tf.float32)
    labels = tf.cast(detections["labels"], tf.int32)
    valid = tf.range(tf.shape(scores)[1])[tf.newaxis, :] < tf.cast(detections["num_detections"], tf.int32)[:, None]
    inner = _inner_borders(origins, height, width, tile)  # [T, 4]
    near = tf.stack([boxes[..., 0] <= BORDER_MARGIN, boxes[..., 1] <= BORDER_MARGIN,
                     boxes[..., 2] >= tile - BORDER_MARGIN, boxes[..., 3] >= tile - BORDER_MARGIN], axis=-1)
    cut = tf.reduce_any(near & inner[:, tf.newaxis, :], axis=-1)  # [T, D]
    offset = tf.cast(tf.tile(origins, [1, 2]), tf.float32)[:, tf.newaxis, :]
    photo = tf.cast(tf.stack([height, width, height, width]), tf.float32)
    placed = tf.clip_by_value(boxes + offset, 0.0, photo)  # the grey beyond the photo is not the photo's
    boxes, scores, labels, cut = (tf.boolean_mask(t, valid) for t in (placed, scores, labels, cut))

    whole = tf.boolean_mask(boxes, ~cut)
    top_left = tf.maximum(boxes[:, tf.newaxis, :2], whole[tf.newaxis, :, :2])
    bottom_right = tf.minimum(boxes[:, tf.newaxis, 2:], whole[tf.newaxis, :, 2:])
    overlap = tf.reduce_prod(tf.maximum(bottom_right - top_left, 0.0), axis=-1)  # [N, whole]
    area = tf.reduce_prod(tf.maximum(boxes[:, 2:] - boxes[:, :2], 1e-6), axis=-1)
    covered = tf.reduce_any(overlap >= FRAGMENT_COVERED * area[:, tf.newaxis], axis=1)
    kept = ~(cut & covered)
    boxes, scores, labels = (tf.boolean_mask(t, kept) for t in (boxes, scores, labels))

    chosen = tf.image.non_max_suppression(class_apart(boxes, labels, tf.maximum(height, width)), scores, max_detections,
                                          iou_threshold=iou_threshold)
    count = tf.shape(chosen)[0]
    pad = max_detections - count
    return {
        "boxes": tf.pad(tf.gather(boxes, chosen), [[0, pad], [0, 0]], constant_values=-1.0),
        "confidence": tf.pad(tf.gather(scores, chosen), [[0, pad]], constant_values=-1.0),
        "labels": tf.pad(tf.gather(labels, chosen), [[0, pad]], constant_values=-1),
        "num_detections": count,
    }


def detect_tiled(model, image: tf.Tensor, tiling: Tiling, batch_size: int) -> dict[str, tf.Tensor]:
    """One photo (uint8 [H, W, 3], any size) → its detections in its own pixels, as
    `merge_tile_detections` gives them: the detector run on its tiles at full resolution,
    `batch_size` tiles a call, merged with the detector's own NMS threshold and limit."""
    tiles, origins = cut_tiles(image, tiling)
    found = detect(model, tiles, batch_size, scale=1.0 / 255.0)  # uint8 until each batch runs
    decoder = model.prediction_decoder
    shape = tf.shape(image)
    return merge_tile_detections(found, origins, shape[0], shape[1], tiling.tile, decoder.max_detections,
                                 decoder.iou_threshold)


class TiledDetector:
    """`detect_tiled` compiled once for a model and a tiling: call it with one photo (uint8
    [H, W, 3], any size); it returns numpy arrays in the photo's pixels. Used by evaluation."""

    def __init__(self, model, tiling: Tiling, batch_size: int = 32):
        self.tiling = tiling
        self._fn = tf.function(lambda image: detect_tiled(model, image, tiling, batch_size),
                               input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)])

    def __call__(self, image) -> dict:
        return {k: v.numpy() for k, v in self._fn(tf.convert_to_tensor(image, tf.uint8)).items()}
