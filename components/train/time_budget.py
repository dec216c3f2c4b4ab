"""How long a run trains: a time budget turned into epochs from the rate measured on this
machine, how often the held-out curve is scored, and when the curve says stop. Pure: no
TensorFlow; the plan (plan.py) and the trainer use it, the report prints its reasons.

A budget counts the training step's whole time (model build, tracing, checkpoints, the
held-out scores, saving): the epochs are what is left after the time already spent and a
reserve for the end, at the measured rate, less the share the held-out scores take.

>>> budget_seconds("20m"), budget_seconds("1.5h"), budget_seconds("90s"), budget_seconds("600")
(1200.0, 5400.0, 90.0, 600.0)
>>> length = epochs_for_budget(600, 0, images_per_second=50, examples_per_epoch=1000)
>>> length.epochs, length.reason[:54]
(28, '600 s budget: 28 epochs of 1000 images at 50.0 images/')
>>> plateaued([0.1, 0.3, 0.31, 0.30, 0.29, 0.305], patience=3, every=1), plateaued([0.1, 0.3, 0.31], patience=3, every=1)
(True, False)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

AUTO = "auto"
# `--time-budget auto`: on a machine without a GPU, a budget that keeps `make run` (install,
# demo data, every step) within 5 minutes on a 2-core machine: a CPU is where a pipeline is
# tried, not where a detector is trained. With a GPU, an hour: the held-out curve (patience)
# and MAX_BUDGET_EPOCHS end the run at its plateau long before on the data sets measured.
CPU_AUTO_SECONDS = 120.0
GPU_AUTO_SECONDS = 3600.0
# A budget never buys more epochs than this from scratch (Ultralytics' default length): past it
# a cosine schedule spread over more passes only delays the decay that the last points gain from.
MAX_BUDGET_EPOCHS = 100
# What the held-out scores may cost, as a share of training time; prediction runs at about
# PREDICT_SPEEDUP times the training rate (no backward pass, no augmentation), measured here
# on the tiny model at 128-320 px (benchmarks/time_budget.py prints both).
SCORE_SHARE = 0.05
PREDICT_SPEEDUP = 3.0
# Seconds kept at the end of the budget for saving the model, the report and the curves.
END_RESERVE_SECONDS = 5.0
# Held-out scores not improving for this many epochs end the run (0: never early): the learning
# rate then decays to 0 over ANNEAL_SHARE of the epochs done (at least one), and the run stops.
# Stopping at once left the rate where the plateau found it, far from the decayed end that the
# best points of a cosine schedule come from: on raccoon (seed 0, a 5 min budget) the run stopped
# at epoch 42 of about 100 at 72% of the peak rate, and scored below 10 epochs (test mAP 0.229
# against 0.239).
DEFAULT_PATIENCE = 10
ANNEAL_SHARE = 0.25

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def budget_seconds(text: str) -> float:
    """A duration as people write it (`20m`, `1.5h`, `90s`, `600`: seconds) in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"time_budget must be 'auto' or a duration such as 90s, 20m or 1.5h, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def check_budget(text: str) -> str:
    """The budget as the config holds it ("auto" or a duration), checked once."""
    if text != AUTO:
        budget_seconds(text)
    return text


def chosen_budget(text: str, on_gpu: bool) -> tuple[float, str]:
    """The budget in seconds and why.

    >>> chosen_budget("auto", on_gpu=False)[0], chosen_budget("auto", on_gpu=True)[0], chosen_budget("2m", False)
    (120.0, 3600.0, (120.0, 'given: 2m'))
    """
    if text != AUTO:
        return budget_seconds(text), f"given: {text}"
    if on_gpu:
        return GPU_AUTO_SECONDS, (f"auto: {GPU_AUTO_SECONDS:g} s on a GPU machine (the held-out curve or "
                                  f"{MAX_BUDGET_EPOCHS} epochs end it sooner)")
    return CPU_AUTO_SECONDS, f"auto: {CPU_AUTO_SECONDS:g} s on a machine without a GPU (give --time-budget to train longer)"


# What a search that ran over its share leaves the training at least, as a share of the budget.
MIN_TRAINING_SHARE = 0.1


def budget_after(text: str, spent: float, on_gpu: bool) -> str:
    """The budget a training gets after a search spent `spent` seconds of it (in seconds;
    at least MIN_TRAINING_SHARE of it); the budget as it is when nothing was spent or when
    the training's length is given.

    >>> budget_after("20m", 300, on_gpu=False), budget_after("auto", 0, on_gpu=True), budget_after("1m", 100, False)
    ('900s', 'auto', '6s')
    """
    if spent <= 0:
        return text
    seconds, _ = chosen_budget(text, on_gpu)
    return f"{max(seconds * MIN_TRAINING_SHARE, seconds - spent):.0f}s"


@dataclass(frozen=True)
class RunLength:
    epochs: int
    reason: str
    seconds: float = 0.0  # the budget (0: epochs were given)
    images_per_second: float = 0.0  # the rate it was turned into epochs at
    affordable: float = 0.0  # epochs the budget would pay for without the cap (a search may use the rest)


def epoch_cap(fine_tune_share: float = 1.0) -> int:
    """The most epochs a budget buys: MAX_BUDGET_EPOCHS, times a warm start's share.

    >>> epoch_cap(), epoch_cap(0.4)
    (100, 40)
    """
    return max(1, math.floor(MAX_BUDGET_EPOCHS * fine_tune_share))


def epochs_for_budget(seconds: float, spent: float, images_per_second: float, examples_per_epoch: int,
                      fine_tune_share: float = 1.0, why: str = "", rate_source: str = "") -> RunLength:
    """The epochs that fit in what is left of a `seconds` budget after `spent` seconds, at
    `images_per_second`, less SCORE_SHARE for the held-out scores and END_RESERVE_SECONDS;
    at least 1, at most MAX_BUDGET_EPOCHS x `fine_tune_share` (a warm start continues a model).

    >>> epochs_for_budget(60, 50, 10, 100).epochs, epochs_for_budget(10**6, 0, 10**4, 100).epochs
    (1, 100)
    """
    left = max(0.0, seconds - spent - END_RESERVE_SECONDS) * (1 - SCORE_SHARE)
    fits = left * images_per_second / max(1, examples_per_epoch)
    cap = epoch_cap(fine_tune_share)
    epochs = max(1, min(cap, math.floor(fits)))
    note = (f" (capped at {cap}: MAX_BUDGET_EPOCHS" + (f" x {fine_tune_share:g} for a warm start" if fine_tune_share < 1
                                                       else "") + ")" if fits >= cap + 1 else "")
    note += " (at least one)" if fits < 1 else ""
    return RunLength(epochs, f"{seconds:g} s budget{f' ({why})' if why else ''}: {epochs} epochs of "
                             f"{examples_per_epoch} images at {images_per_second:.1f} images/s"
                             f"{f' ({rate_source})' if rate_source else ''}{note}, after {spent:.0f} s of set-up, "
                             f"{SCORE_SHARE:.0%} for the held-out scores and {END_RESERVE_SECONDS:g} s to save",
                     seconds, images_per_second, round(fits, 2))


def score_every(held_out: int, examples_per_epoch: int, images_per_second: float) -> int:
    """Epochs between held-out scores, so that scoring `held_out` images (at PREDICT_SPEEDUP
    times the training rate) costs at most SCORE_SHARE of training.

    >>> score_every(32, 125, 20), score_every(400, 100, 20), score_every(10, 2000, 50)
    (2, 27, 1)
    """
    score = held_out / (PREDICT_SPEEDUP * max(images_per_second, 1e-9))
    epoch = examples_per_epoch / max(images_per_second, 1e-9)
    return max(1, math.ceil(score / (SCORE_SHARE * epoch)))


def plateaued(scores: list[float], patience: int, every: int) -> bool:
    """True when the last `patience` epochs of held-out scores (one per `every` epochs) hold
    none better than the best before them; `patience` 0: never."""
    if patience <= 0 or not scores:
        return False
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))  # the first of equal bests
    return (len(scores) - 1 - best) * every >= patience
