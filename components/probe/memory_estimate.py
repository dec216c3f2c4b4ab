"""Will a batch fit? An estimate of accelerator memory for the detector before any run.

The estimate counts the model itself: every layer's output size for one image (what
training keeps for the backward pass), times a factor for gradient buffers and
intermediates of the backward pass, plus weights, gradients and two Adam moments. It is
deliberately conservative; the train step's `--batch-size auto` refines it with real
trial steps, and the probe's job is to warn early when even small batches cannot fit.
"""

from __future__ import annotations

import math
from functools import lru_cache

BACKWARD_FACTOR = 3.0  # forward outputs + their gradients + saved intermediates (BN, ReLU)
RESERVED_FRACTION = 0.1  # CUDA context, cuDNN workspaces, fragmentation


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


@lru_cache(maxsize=16)
def model_footprint(model_size: str, image_size: int, num_classes: int) -> tuple[int, int]:
    """(activation elements per image, parameter count) of detpipe's detector."""
    from components.train.model import build_model_for

    model = build_model_for(model_size, image_size, num_classes)
    return _output_elements(model), model.count_params()


def bytes_per_image(model_size: str, image_size: int, num_classes: int, mixed_precision: bool) -> int:
    elements, _ = model_footprint(model_size, image_size, num_classes)
    return int(elements * (2 if mixed_precision else 4) * BACKWARD_FACTOR)


def largest_safe_batch(memory_bytes: int, model_size: str, image_size: int, num_classes: int,
                       mixed_precision: bool) -> int:
    """The largest batch expected to fit in `memory_bytes` (0 when even one image does not).
    The class head grows with the classes (9 anchors x classes channels at every level)."""
    _, params = model_footprint(model_size, image_size, num_classes)
    usable = memory_bytes * (1 - RESERVED_FRACTION) - params * 4 * 4  # weights, grads, 2 Adam moments
    return max(0, int(usable // bytes_per_image(model_size, image_size, num_classes, mixed_precision)))
