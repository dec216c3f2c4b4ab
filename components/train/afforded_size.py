"""The input size a given time budget affords (`--grow-input`): where `--time-budget` buys more
than the capped epochs at the size fitted to the boxes (`--image-size auto`), the rest buys a larger
input. Off by default until measured to pay on two real sets (docs/measurements.md).

Past MAX_BUDGET_EPOCHS a budget's extra time goes unspent: with the cap at 100 (before it was
raised), on 2 cores a 10-minute raccoon run reached its 100 epochs at 128 px in 278 s, cards' in
456 s, and at 25 minutes most of the budget was left (docs/measurements.md, "Against the peer").
The larger input sees each object at more pixels, which the boxes' localisation (AP75) and small
objects gain from.

The rule: the largest multiple of SIZE_STEP above the fitted size, up to the `auto` size's cap
(the photos' median long side, the device's SIZE_BUDGET: geometry.size_cap), at which the
capped epochs and the refit a budgeted run will train (refit_choice) still fit the budget with
AFFORD_MARGIN to spare. The rate at the larger size is estimated from the one measured at the
fitted size and the model's compute at each (geometry.CostModel); the trainer corrects the
length by its own pace after its first chunks (curve.py), so an estimate off by more than the
margin costs epochs, never the budget. Only a budget given in time: `auto` ends at its cap in
images (time_budget.CPU_AUTO_IMAGES) or its curve, and a warm start keeps its source's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from components.detector.geometry import SIZE_STEP
from components.train.refit_choice import refit_expected

# The budget must pay for this much more than the capped epochs (and the refit) at the estimated
# rate: the estimate is a count of multiply-adds, and the measured rate it scales came from a few
# steps (the probe's), which trained 5-10% faster than the runs that followed on the sets measured.
AFFORD_MARGIN = 1.15


@dataclass(frozen=True)
class AffordedSize:
    size: int
    speed: float  # the rate at `size` over the rate at the fitted size (estimated: < 1)
    reason: str


def afforded_size(fitted: int, ceiling: int, affordable: float, needed: float,
                  cost: Callable[[int], float]) -> AffordedSize | None:
    """The largest multiple of SIZE_STEP above `fitted`, at most `ceiling`, whose estimated
    cost (`cost(size)`, compute per image) leaves `needed` epochs within the `affordable`
    ones the budget buys at `fitted`, with AFFORD_MARGIN; None when no size above it fits.

    >>> pixels = lambda size: size * size
    >>> afforded_size(128, 512, affordable=500, needed=100, cost=pixels).size  # 4.35x the compute pays: 256 px
    256
    >>> afforded_size(128, 192, affordable=500, needed=100, cost=pixels).size  # the photos' size caps it
    192
    >>> afforded_size(128, 512, affordable=150, needed=100, cost=pixels) is None  # 160 px costs 1.56x
    True
    >>> print(afforded_size(128, 512, affordable=300, needed=200, cost=pixels))
    None
    """
    base = cost(fitted)
    chosen = None  # (size, speed) of the largest size that fits so far
    size = fitted + SIZE_STEP - fitted % SIZE_STEP
    while size <= ceiling:
        speed = base / cost(size)
        if affordable * speed < needed * AFFORD_MARGIN:
            break
        chosen = size, speed
        size += SIZE_STEP
    if chosen is None:
        return None
    size, speed = chosen
    return AffordedSize(size, speed, (
        f"{size}: the budget buys {affordable:.0f} epochs at the fitted {fitted}px and the run needs {needed:.0f} "
        f"(the capped epochs and a refit): {size}px costs about {1 / speed:.2f}x the compute, within the budget "
        f"with {AFFORD_MARGIN - 1:.0%} to spare (at most {ceiling}px)"))


def refit_factor(mode: str, fit: int, held_out: int, workers: int) -> float:
    """How many times the capped epochs' images a budgeted run trains, its refit included: 1 +
    whole/fit where `choose_refit` would refit when the time allows, else 1.

    >>> refit_factor("auto", 128, 32, 1), refit_factor("auto", 1880, 200, 1), refit_factor("off", 128, 32, 1)
    (2.25, 1.0, 1.0)
    """
    if not refit_expected(mode, fit, held_out, workers):
        return 1.0
    return 1 + (fit + held_out) / max(1, fit)


def scaled_epochs(affordable: float, speed: float, cap: int) -> int:
    """The epochs at the afforded size: the budget's epochs at `speed` times the rate, at most `cap`.

    >>> scaled_epochs(500, 0.25, 100), scaled_epochs(120.5, 0.5, 100)
    (100, 60)
    """
    return max(1, min(cap, math.floor(affordable * speed)))


def budget_shape(config, sample, num_classes: int, shape, length, held_out, warm: bool, workers: int,
                 on_gpu: bool):
    """The shape and length of a budgeted run of `config` after the input size its budget affords
    (`afforded_size`, with `config.grow_input`): the `shape` (FittedShape) fitted to the boxes of
    `sample` and the `length` (RunLength) as they are where no larger size fits or the rule does not
    apply (grow_input off, an `auto` budget, a given or tiled size, a `warm` start, which keeps its
    source's shape), else the shape fitted at the larger size and the length at its estimated rate. A length kept from a run this
    one resumes holds its size: that one. `held_out`: the carve (TuningSplit) or None."""
    from dataclasses import replace
    from functools import cache

    from components.detector.fitted_shape import anchor_spec, cost_model, shape_for_sample
    from components.detector.geometry import size_cap
    from components.train.time_budget import AUTO, epoch_cap

    @cache
    def fitted_at(size: int):  # the levels and anchors change with the size, and the compute with them
        return shape_for_sample(sample, config.model_size, num_classes, size, on_gpu, config.preset,
                                config.allow_poor_anchors, config.tile)

    def cost(fitted) -> float:
        return cost_model(fitted.model).total(fitted.model.image_size, anchor_spec(fitted.model))

    def at(size: int, why: str):
        return replace(fitted_at(size), decisions={**fitted_at(size).decisions, "image_size": (
            f"auto: {why}; fitted to the boxes: {shape.decisions['image_size']}")})

    if length.image_size:
        return at(length.image_size, f"{length.image_size}: the size this run's budget afforded when it started"), length
    off = not config.grow_input or config.time_budget == AUTO or config.image_size != "auto"
    if off or shape.model.tiled or warm:
        return shape, length
    fit, carved = (held_out.fit, held_out.held_out) if held_out is not None else (0, 0)
    cap = length.cap or epoch_cap()
    needed = cap * refit_factor(config.refit, fit, carved, workers)
    found = afforded_size(shape.model.image_size, size_cap(sample, on_gpu), length.affordable, needed,
                          lambda size: cost(shape) if size == shape.model.image_size else cost(fitted_at(size)))
    if found is None:
        return shape, length
    epochs = scaled_epochs(length.affordable, found.speed, cap)
    rate = length.images_per_second * found.speed
    return at(found.size, found.reason), replace(
        length, epochs=epochs, images_per_second=rate, affordable=round(length.affordable * found.speed, 2),
        image_size=found.size, reason=f"{length.reason}; at the afforded {found.size}px: {epochs} epochs at about "
                                      f"{rate:.1f} images/s (estimated from the compute)")
