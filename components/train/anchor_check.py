"""Can the detector's anchors match the dataset's boxes at all?

RetinaNet learns from a box only through anchors that overlap it with IoU >= 0.5 (KerasHub's
label encoder). A box smaller or thinner than every anchor shape matches none, and a
dataset of such boxes trains to a loss of exactly 0 while learning nothing. Before
training, this takes a sample of the training boxes at the model's input size and finds,
for each, the best IoU any anchor shape could reach (anchor centred on the box: an upper
bound, since real anchors sit on a grid), and reports the share that cannot reach 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from beam import feature_keys as K
from components.train.input_pipeline import compression_type, shard_files

POSITIVE_IOU = 0.5  # KerasHub RetinaNetLabelEncoder's default positive threshold
WARN_SHARE = 0.1

_BOX_FEATURES = {key: tf.io.VarLenFeature(tf.float32) for key in (K.XMIN, K.YMIN, K.XMAX, K.YMAX)}


@dataclass(frozen=True)
class AnchorCoverage:
    boxes: int  # sampled boxes
    unmatched: int  # boxes no anchor shape can reach IoU 0.5 with
    smallest_px: float  # smallest box side at the model's input size
    smallest_anchor_px: float

    @property
    def share(self) -> float:
        return self.unmatched / self.boxes if self.boxes else 0.0

    def describe(self, image_size: int) -> str:
        if not self.boxes:
            return "no boxes sampled"
        text = (f"{self.share:.0%} of {self.boxes} sampled training boxes cannot reach IoU {POSITIVE_IOU} with any "
                f"anchor shape at {image_size}px input (smallest box side {self.smallest_px:.0f}px, smallest anchor "
                f"{self.smallest_anchor_px:.0f}px)")
        if self.share > WARN_SHARE:
            text += "; those boxes teach the model nothing: use a larger --image-size"
        return text


def anchor_shapes(model, image_size: int) -> np.ndarray:
    """Distinct (height, width) of the model's anchors, in pixels."""
    anchors = model.anchor_generator(tf.zeros([1, image_size, image_size, 3]))
    boxes = np.concatenate([np.asarray(a).reshape(-1, 4) for a in anchors.values()])
    return np.unique(np.round(np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1), 3), axis=0)


def best_centred_iou(box_hw: np.ndarray, anchor_hw: np.ndarray) -> np.ndarray:
    """For each box (h, w), the best IoU of any anchor shape centred on it."""
    inter = (np.minimum(box_hw[:, None, 0], anchor_hw[None, :, 0])
             * np.minimum(box_hw[:, None, 1], anchor_hw[None, :, 1]))
    union = (box_hw[:, 0] * box_hw[:, 1])[:, None] + (anchor_hw[:, 0] * anchor_hw[:, 1])[None, :] - inter
    return (inter / np.maximum(union, 1e-12)).max(axis=1)


def sample_box_sizes(data_dir: str, image_size: int, records: int = 2000) -> np.ndarray:
    """(height, width) in model-input pixels of the boxes in the first `records` train records."""
    files = shard_files(data_dir, "train")
    data = tf.data.TFRecordDataset(files, compression_type=compression_type(files)).take(records)
    sizes = []
    for serialized in data:
        parsed = tf.io.parse_single_example(serialized, _BOX_FEATURES)
        v = {k: tf.sparse.to_dense(t).numpy() for k, t in parsed.items()}
        sizes.append(np.stack([v[K.YMAX] - v[K.YMIN], v[K.XMAX] - v[K.XMIN]], 1) * image_size)
    return np.concatenate(sizes) if sizes else np.zeros((0, 2))


def anchor_coverage(model, data_dir: str, image_size: int, records: int = 2000) -> AnchorCoverage:
    shapes = anchor_shapes(model, image_size)
    sizes = sample_box_sizes(data_dir, image_size, records)
    if not len(sizes):
        return AnchorCoverage(0, 0, 0.0, float(shapes.min()))
    best = best_centred_iou(sizes, shapes)
    return AnchorCoverage(len(sizes), int((best < POSITIVE_IOU).sum()), float(sizes.min()), float(shapes.min()))
