"""Will a batch fit? An estimate of accelerator memory for the detector before any run.

The estimate counts the model itself: every layer's output size for one image (what
training keeps for the backward pass), times a factor for gradient buffers and
intermediates of the backward pass, plus weights, gradients and two Adam moments. It is
deliberately conservative; the train step's `--batch-size auto` refines it with real
trial steps, and the probe's job is to warn early when even small batches cannot fit.
"""

from __future__ import annotations

import json
import math

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


def bytes_per_image(config, mixed_precision: bool) -> int:
    elements, _ = model_footprint(config)
    return int(elements * (2 if mixed_precision else 4) * BACKWARD_FACTOR)


def largest_safe_batch(memory_bytes: int, config, mixed_precision: bool) -> int:
    """The largest batch expected to fit in `memory_bytes` (0 when even one image does not).
    The class head grows with the classes (anchors x classes channels at every level)."""
    _, params = model_footprint(config)
    usable = memory_bytes * (1 - RESERVED_FRACTION) - params * 4 * 4  # weights, grads, 2 Adam moments
    return max(0, int(usable // bytes_per_image(config, mixed_precision)))
