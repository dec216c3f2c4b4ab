"""The augmentation's declared settings and numbers that the config, the CLI's help and the
docs read: plain names, no TensorFlow (augment.py and mosaic.py do the work)."""

from __future__ import annotations

# TrainConfig.orientations, which ways up a training image may be turned (augment.orient):
ORIENTATION_WHAT = {"upright": "as photographed", "flips": "upside down with probability 0.5",
                    "any": "upside down with probability 0.5, then 0-3 quarter turns"}
ORIENTATIONS = tuple(ORIENTATION_WHAT)

# TrainConfig.mosaic (mosaic.py):
MOSAIC_IMAGES = 4  # images in a mosaic, and mosaics a group of four gives
MOSAIC_SCALE = 0.5  # the window's zoom z is uniform in 1 ± this (Ultralytics' default `scale`)
# The share of a run's last steps trained without mosaic, on whole images as they are (Ultralytics'
# `close_mosaic`: its last 10 of 100 epochs): the model ends on the distribution it will see.
MOSAIC_CLEAN_SHARE = 0.1

# TrainConfig.augment_strength is the strength of a run up to STRENGTH_GROWS_AFTER epochs; a longer
# run's grows with its planned epochs, linearly to LONG_RUN_STRENGTH_FACTOR times it at LONG_RUN_EPOCHS
# and beyond (at most 1). A long run sees each photo hundreds of times and learns the photos rather
# than the objects under light jitter: the cards set at 25 minutes (300 epochs, 244 photos) scored
# test mAP 0.453 at strength 0.25 and 0.618 at 0.6 (docs/measurements.md), while on short runs
# stronger jitter did not pay (8-30 epochs: 0.4-0.5 no better than 0.25, docs/training.md).
STRENGTH_GROWS_AFTER = 100
LONG_RUN_EPOCHS = 300
LONG_RUN_STRENGTH_FACTOR = 2.4  # 0.25 -> 0.6, the strength measured at LONG_RUN_EPOCHS


def clamped_strength(strength: float) -> float:
    """A strength as the augmentation applies it: within 0-1."""
    return min(max(strength, 0.0), 1.0)


def run_strength(given: float, epochs: int) -> tuple[float, str]:
    """The augmentation strength of a run of `epochs` planned epochs whose `--augment-strength`
    is `given` (clamped to 0-1), and why.

    >>> [run_strength(0.25, e)[0] for e in (5, 100, 200, 300, 1000)]
    [0.25, 0.25, 0.425, 0.6, 0.6]
    >>> run_strength(0.5, 300)[0], run_strength(0.0, 300)[0], run_strength(1.5, 10)[0]
    (1.0, 0.0, 1.0)
    """
    base = clamped_strength(given)
    share = min(max((epochs - STRENGTH_GROWS_AFTER) / (LONG_RUN_EPOCHS - STRENGTH_GROWS_AFTER), 0.0), 1.0)
    factor = 1.0 + (LONG_RUN_STRENGTH_FACTOR - 1.0) * share
    strength = round(clamped_strength(base * factor), 3)
    if share == 0.0 or base == 0.0:
        return strength, f"as given (a run of up to {STRENGTH_GROWS_AFTER} epochs keeps it)"
    return strength, (f"{base:g} given x {factor:.3g} for {epochs} planned epochs (a run past {STRENGTH_GROWS_AFTER} "
                      f"epochs augments harder, up to x{LONG_RUN_STRENGTH_FACTOR:g} from {LONG_RUN_EPOCHS}, at most 1)")
