"""Whether a budgeted run trains again on the whole train split (refit.py), and why: plain
numbers in, no TensorFlow (the pipeline's parameters and `--help` read these constants)."""

from __future__ import annotations

import math
from dataclasses import dataclass

REFIT_MODES = ("auto", "on", "off")
# `auto` refits where the carve is at least this share of train (a set under about 1,000 train
# images, whose carve is not capped at HOLDOUT_MAX_IMAGES): there the fit part misses a fifth of
# the photos, and raccoon (carve 20%) gained +0.025 in every seed; on the demo's capped carve (10%)
# the refit adds a tenth more images for +0.012 on average and doubles the training
# (docs/measurements.md, "the held-out carve").
REFIT_MIN_SHARE = 0.15
REFIT_NOTE = "refit on the whole train split"  # how the run's length line marks it (TrainResult.length_line)


@dataclass(frozen=True)
class RefitChoice:
    epochs: int  # 0: no refit
    reason: str


def choose_refit(mode: str, fit: int, held_out: int, epochs: float, seconds: float, budget_seconds: float,
                 workers: int = 1) -> RefitChoice:
    """After a budgeted run that trained `epochs` on `fit` images and scored its curve on
    `held_out` ones in `seconds` of a `budget_seconds` budget: the epochs of a refit on all of
    train (0: none) and why. The refit is estimated at the run's seconds times whole/fit images
    (the same epochs on more images, no held-out scores, its own start-up).

    >>> choose_refit("auto", 128, 32, 79.3, 150.0, 1200.0).epochs
    80
    >>> print(choose_refit("auto", 128, 32, 79.3, 150.0, 1200.0).reason)
    auto: the carve is 20% of train (32 of 160); 80 epoch(s) on all 160 train images (about 188 s), within the budget's 1050 s left
    >>> choose_refit("auto", 1880, 200, 5.0, 140.0, 1200.0).reason[:44]
    'off: the carve is 10% of train (200 of 2080)'
    >>> choose_refit("auto", 128, 32, 79.3, 1100.0, 1200.0).epochs, choose_refit("on", 128, 32, 79.3, 1100.0, 1200.0).epochs
    (0, 80)
    >>> choose_refit("on", 128, 32, 79.3, 150.0, 1200.0, workers=2).reason
    'off: 2 machines trained in lockstep; a refit runs on one machine only'
    >>> choose_refit("auto", 128, 0, 30.0, 100.0, 0.0).reason
    'off: nothing was held out (epochs given, or too few images): the run trained on all of train'
    """
    whole = fit + held_out
    again, estimate, left = max(1, math.ceil(epochs)), seconds * whole / max(1, fit), budget_seconds - seconds
    what = f"{again} epoch(s) on all {whole} train images (about {estimate:.0f} s)"
    why = _ruled_out(mode, fit, held_out, workers, what)
    if why:
        return RefitChoice(0, why)
    if mode == "on":
        return RefitChoice(again, f"on (given): {what}")
    if estimate > left:
        return RefitChoice(0, f"off: the budget has {max(0.0, left):.0f} s left and a refit of {what} would pass it; "
                              "--refit on trains it anyway")
    return RefitChoice(again, f"auto: the carve is {held_out / whole:.0%} of train ({held_out} of {whole}); {what}, "
                              f"within the budget's {left:.0f} s left")


def refit_expected(mode: str, fit: int, held_out: int, workers: int = 1) -> bool:
    """Whether `choose_refit` refits a run of this carve and these machines when the budget has
    the time (what a plan made before training can know).

    >>> refit_expected("auto", 128, 32), refit_expected("auto", 1880, 200), refit_expected("on", 1880, 200)
    (True, False, True)
    """
    return not _ruled_out(mode, fit, held_out, workers)


def _ruled_out(mode: str, fit: int, held_out: int, workers: int, what: str = "a refit") -> str:
    """Why no refit runs whatever the time left ("": one may)."""
    if mode not in REFIT_MODES:
        raise ValueError(f"refit must be one of {', '.join(REFIT_MODES)}, got {mode!r}")
    if mode == "off":
        return "off: given --refit off"
    if not held_out:
        return "off: nothing was held out (epochs given, or too few images): the run trained on all of train"
    if workers > 1:  # the strategy over several machines is made once a process
        return f"off: {workers} machines trained in lockstep; a refit runs on one machine only"
    whole = fit + held_out
    if mode == "auto" and held_out / whole < REFIT_MIN_SHARE:
        return (f"off: the carve is {held_out / whole:.0%} of train ({held_out} of {whole}), under "
                f"{REFIT_MIN_SHARE:.0%}, where a refit gained within the noise; --refit on trains {what}")
    return ""
