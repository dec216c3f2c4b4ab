"""Will a batch fit? An estimate of accelerator memory for the detector before any run.

The estimate counts the model itself: every layer's output size for one image (what
training keeps for the backward pass), times a factor for gradient buffers and
intermediates of the backward pass, plus weights, gradients and two Adam moments; and the
loss's anchor matching, which holds anchors x boxes IoU tensors for every image of the
batch (the only part that grows with the data: dense images, e.g. shelves of 1,000
products, can need more memory for it than for the model). It is deliberately
conservative; the train step's `--batch-size auto` refines it with real trial steps on a
GPU, and the probe's job is to warn early when even small batches cannot fit.
"""

from __future__ import annotations

import json
import math

BACKWARD_FACTOR = 3.0  # forward outputs + their gradients + saved intermediates (BN, ReLU)
RESERVED_FRACTION = 0.1  # CUDA context, cuDNN workspaces, fragmentation
# Bytes a train step's peak grows by for each (anchor, box) pair of an image: KerasHub's
# RetinaNet label encoder computes IoUs of every anchor with every box in float32, and its
# intermediates hold three to four such tensors. Measured with `benchmarks/matching_memory.py`
# on a CPU (peak RSS of two train steps, against 1 box an image): 8.7 and 13.6 bytes a pair
# with 300 and 1,000 boxes (256 px, P3-P7, batch 4), 13.9 with 2,000 (128 px, batch 8);
# rounded up.
MATCH_BYTES_PER_PAIR = 14


def _output_elements(model) -> int:
    total = 0
    for layer in model.layers:
        if getattr(layer, "layers", None):  # a nested model (backbone, FPN)
            total += _output_elements(layer)
            continue
        outputs = layer.output
        if isinstance(outputs, dict):
            outputs = list(outputs.values())
        for out in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            total += math.prod(d for d in out.shape[1:] if d)
    return total


_FOOTPRINTS: dict[str, tuple[int, int]] = {}  # building a model takes seconds; the probe asks twice


def model_footprint(config) -> tuple[int, int]:
    """(activation elements per image, parameter count) of the detector a `ModelConfig`
    describes (its input size, levels and anchors: the fitted shape)."""
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    if key not in _FOOTPRINTS:
        from components.detector.model import build_detector

        model = build_detector(config)
        _FOOTPRINTS[key] = (_output_elements(model), model.count_params())
    return _FOOTPRINTS[key]


def anchor_count(config) -> int:
    """The anchors of a `ModelConfig`'s detector, as KerasHub's AnchorGenerator makes them:
    num_scales x aspect ratios at every grid position of every level.

    >>> from components.detector.model import ModelConfig
    >>> anchor_count(ModelConfig(num_classes=1, image_size=256, min_level=3, max_level=7))
    12276
    >>> anchor_count(ModelConfig(num_classes=1, image_size=97, min_level=3, max_level=6))
    2142
    """
    from components.detector.geometry import pyramid_positions

    return pyramid_positions(config.image_size, config.min_level, config.max_level) * (
        config.num_scales * len(config.aspect_ratios))


def matching_bytes_per_image(config, boxes_per_image: int) -> int:
    """What the loss's anchor matching adds to a train step's peak for one image with
    `boxes_per_image` boxes (float32 whatever the precision policy)."""
    return anchor_count(config) * max(1, boxes_per_image) * MATCH_BYTES_PER_PAIR


def bytes_per_image(config, mixed_precision: bool, boxes_per_image: int = 1) -> int:
    elements, _ = model_footprint(config)
    return int(elements * (2 if mixed_precision else 4) * BACKWARD_FACTOR) + matching_bytes_per_image(
        config, boxes_per_image)


def largest_safe_batch(memory_bytes: int, config, mixed_precision: bool, boxes_per_image: int = 1) -> int:
    """The largest batch expected to fit in `memory_bytes` (0 when even one image does not)
    when every image has `boxes_per_image` boxes (the densest training image's count: a
    batch is padded to its densest image). The class head grows with the classes (anchors
    x classes channels at every level)."""
    _, params = model_footprint(config)
    usable = memory_bytes * (1 - RESERVED_FRACTION) - params * 4 * 4  # weights, grads, 2 Adam moments
    return max(0, int(usable // bytes_per_image(config, mixed_precision, boxes_per_image)))
