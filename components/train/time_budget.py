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
>>> plateaued([0.1, 0.3, 0.31, 0.30, 0.29, 0.305, 0.3], patience=3, every=1), plateaued([0.1, 0.3, 0.31], patience=3, every=1)
(True, False)
>>> chosen_length("auto", on_gpu=False).images, chosen_length("auto", on_gpu=True).images, chosen_length("2m", False).images
(10000, 0, 0)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

AUTO = "auto"
# `--time-budget auto` on a machine without a GPU: train until the held-out curve is flat, at most
# CPU_AUTO_IMAGES images trained (from scratch; a warm start its share) and at most CPU_AUTO_SECONDS.
# A cap in images, not seconds, is the same model on every machine: a CPU at a third of the rate
# takes three times as long and hands over the same model, where a fixed 120 s budget handed a
# 2-core machine at 37 images/s one epoch of the demo (val mAP 0.150) and a faster one 6 (0.797).
# 10,000 images are 5 epochs of the demo's fit part (val mAP 0.78-0.81, docs/measurements.md) and
# 80 of raccoon's, whose curve is flat at 40-90: the curve, not the cap, ends most small real sets.
# CPU_AUTO_SECONDS bounds what the images cost where they are large (a 640 px photo trains at
# a few images/s on a CPU): a run it ends says so (stopped short), with the budget that would do.
# With a GPU, an hour: the held-out curve (patience) and MAX_BUDGET_EPOCHS end the run at its
# plateau long before on the data sets measured.
CPU_AUTO_IMAGES = 10_000
CPU_AUTO_SECONDS = 1200.0
GPU_AUTO_SECONDS = 3600.0
# A budget never buys more epochs than this from scratch: past it a cosine schedule spread over
# more passes only delays the decay that the last points gain from, and the held-out curve's
# patience ends a run that has stopped learning sooner. It was 100 (Ultralytics' default length),
# where small real sets reached it with most of a 25-minute budget unspent and the curve still
# rising: on the cards set (2 cores, 25 minutes, seed 0) 300 scored test mAP 0.453 against 0.350
# at 100 (that one refit on all of train; at 300 no time was left for a refit), its curve still
# rising at 300; on raccoon, whose curve's patience ends the run first, 0.397 against 0.395
# (docs/measurements.md, "Against the peer").
MAX_BUDGET_EPOCHS = 300
# What the held-out scores may cost, as a share of training time; a score (prediction, NMS and
# the COCO evaluation) runs at about PREDICT_SPEEDUP times the training rate: measured on the
# demo in `make run` (2 cores), 200 held-out images scored in 1.5 s against training at 88
# images/s. (3.0, the prediction alone, scored the demo every epoch at 7% of training.)
SCORE_SHARE = 0.05
PREDICT_SPEEDUP = 1.5
# Seconds kept at the end of the budget for saving the model, the report and the curves.
END_RESERVE_SECONDS = 5.0
# Held-out scores not improving for `patience` epochs end the run (0: never early): the learning
# rate then decays to 0 over ANNEAL_SHARE of the epochs done (at least one), and the run stops.
# Stopping at once left the rate where the plateau found it, far from the decayed end that the
# best points of a cosine schedule come from: on raccoon (seed 0, a 5 min budget) the run stopped
# at epoch 42 of about 100 at 72% of the peak rate, and scored below 10 epochs (test mAP 0.229
# against 0.239).
# `patience auto` is tied to the plan: at least DEFAULT_PATIENCE epochs and PATIENCE_SHARE of the
# epochs planned; and the rule compares the curve smoothed over SMOOTHED_SCORES scores, not single
# scores. A fixed 10 on raw scores stopped raccoon runs (32 held-out photos: an mAP's sd there is
# about 0.03) at epoch 30 of ~100, the rate still high, behind one lucky early score (test mAP
# 0.236, where runs that went 60-88 epochs scored 0.33-0.39; docs/measurements.md).
DEFAULT_PATIENCE = 10
PATIENCE_SHARE = 0.2
SMOOTHED_SCORES = 3
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


@dataclass(frozen=True)
class ChosenLength:
    """What bounds a budgeted run: `seconds` (its deadline) and, for `auto` on a CPU, `images`
    (the most images it trains; 0: no such cap), and why."""

    seconds: float
    reason: str
    images: int = 0


def chosen_length(text: str, on_gpu: bool) -> ChosenLength:
    """The bounds of a run given `--time-budget text` on this machine, and why."""
    if text != AUTO:
        return ChosenLength(budget_seconds(text), f"given: {text}")
    if on_gpu:
        return ChosenLength(GPU_AUTO_SECONDS, f"auto: {GPU_AUTO_SECONDS:g} s on a GPU machine (the held-out curve "
                                              f"or {MAX_BUDGET_EPOCHS} epochs end it sooner)")
    return ChosenLength(CPU_AUTO_SECONDS, f"auto on a machine without a GPU: until the held-out curve is flat, at most "
                                          f"{CPU_AUTO_IMAGES:,} images trained and {CPU_AUTO_SECONDS / 60:g} min "
                                          "(give --time-budget to train longer)", CPU_AUTO_IMAGES)


def chosen_budget(text: str, on_gpu: bool) -> tuple[float, str]:
    """The budget in seconds and why.

    >>> chosen_budget("auto", on_gpu=False)[0], chosen_budget("auto", on_gpu=True)[0], chosen_budget("2m", False)
    (1200.0, 3600.0, (120.0, 'given: 2m'))
    """
    chosen = chosen_length(text, on_gpu)
    return chosen.seconds, chosen.reason


# What a search that ran over its share leaves the training at least, as a share of the budget.
MIN_TRAINING_SHARE = 0.1


def budget_after(text: str, spent: float, on_gpu: bool) -> str:
    """The budget a training gets after a search spent `spent` seconds of it (in seconds;
    at least MIN_TRAINING_SHARE of it); the budget as it is when nothing was spent, when the
    training's length is given, or when it is `auto`: a bound of its own (the images on a CPU,
    the hour on a GPU, which the curve or the epoch cap ends sooner), where seconds left of it
    would read as a budget given in time, and buy a larger input (afforded_size.py).

    >>> budget_after("20m", 300, on_gpu=False), budget_after("auto", 300, on_gpu=True), budget_after("1m", 100, False)
    ('900s', 'auto', '6s')
    """
    if spent <= 0 or text == AUTO:
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
    cap: int = 0  # the most epochs the run may reach when its pace is corrected (0: epoch_cap's)
    image_size: int = 0  # the input size the budget afforded above the fitted one (afforded_size.py); 0: none


def epoch_cap(fine_tune_share: float = 1.0) -> int:
    """The most epochs a budget buys: MAX_BUDGET_EPOCHS, times a warm start's share.

    >>> epoch_cap(), epoch_cap(0.4)
    (300, 120)
    """
    return max(1, math.floor(MAX_BUDGET_EPOCHS * fine_tune_share))


def epochs_for_budget(seconds: float, spent: float, images_per_second: float, examples_per_epoch: int,
                      fine_tune_share: float = 1.0, why: str = "", rate_source: str = "",
                      max_images: int = 0) -> RunLength:
    """The epochs that fit in what is left of a `seconds` budget after `spent` seconds, at
    `images_per_second`, less SCORE_SHARE for the held-out scores and END_RESERVE_SECONDS;
    at least 1, at most MAX_BUDGET_EPOCHS x `fine_tune_share` (a warm start continues a model)
    and, with `max_images`, at most the epochs of that many images (times the same share).

    >>> epochs_for_budget(60, 50, 10, 100).epochs, epochs_for_budget(10**6, 0, 10**4, 100).epochs
    (1, 300)
    >>> epochs_for_budget(1200, 0, 50, 1880, max_images=10000).epochs, epochs_for_budget(1200, 0, 50, 125, max_images=10000).epochs
    (5, 80)
    """
    left = max(0.0, seconds - spent - END_RESERVE_SECONDS) * (1 - SCORE_SHARE)
    fits = left * images_per_second / max(1, examples_per_epoch)
    cap, capped_by = epoch_cap(fine_tune_share), "MAX_BUDGET_EPOCHS"
    if max_images and max_images * fine_tune_share / max(1, examples_per_epoch) < cap:
        cap = max(1, math.floor(max_images * fine_tune_share / max(1, examples_per_epoch)))
        capped_by = f"{max_images:,} images (CPU_AUTO_IMAGES)"
    epochs = max(1, min(cap, math.floor(fits)))
    note = (f" (capped at {cap}: {capped_by}" + (f" x {fine_tune_share:g} for a warm start" if fine_tune_share < 1
                                                 else "") + ")" if fits >= cap + 1 else "")
    note += " (at least one)" if fits < 1 else ""
    return RunLength(epochs, f"{seconds:g} s budget{f' ({why})' if why else ''}: {epochs} epochs of "
                             f"{examples_per_epoch} images at {images_per_second:.1f} images/s"
                             f"{f' ({rate_source})' if rate_source else ''}{note}, after {spent:.0f} s of set-up, "
                             f"{SCORE_SHARE:.0%} for the held-out scores and {END_RESERVE_SECONDS:g} s to save",
                     seconds, images_per_second, round(fits, 2), cap)


def score_every(held_out: int, examples_per_epoch: int, images_per_second: float) -> int:
    """Epochs between held-out scores, so that scoring `held_out` images (at PREDICT_SPEEDUP
    times the training rate) costs at most SCORE_SHARE of training.

    >>> score_every(32, 125, 20), score_every(400, 100, 20), score_every(10, 2000, 50)
    (4, 54, 1)
    """
    score = held_out / (PREDICT_SPEEDUP * max(images_per_second, 1e-9))
    epoch = examples_per_epoch / max(images_per_second, 1e-9)
    return max(1, math.ceil(score / (SCORE_SHARE * epoch)))


def patience_epochs(setting: int | str, planned_epochs: int) -> tuple[int, str]:
    """The run's patience in epochs and why: as given, or for `auto` at least DEFAULT_PATIENCE and
    PATIENCE_SHARE of the `planned_epochs`.

    >>> patience_epochs("auto", 100), patience_epochs("auto", 6)[0], patience_epochs(3, 100)
    ((20, 'auto: 20% of the 100 epochs planned (at least 10)'), 10, (3, 'given'))
    """
    if setting != AUTO:
        return int(setting), "given"
    return (max(DEFAULT_PATIENCE, math.ceil(PATIENCE_SHARE * planned_epochs)),
            f"auto: {PATIENCE_SHARE:.0%} of the {planned_epochs} epochs planned (at least {DEFAULT_PATIENCE})")


def check_patience(value: int | str) -> int | str:
    """The patience as the config holds it: "auto" or a whole number >= 0 (0: never early).

    >>> check_patience("auto"), check_patience("12"), check_patience(0)
    ('auto', 12, 0)
    """
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(f"patience must be 'auto' or a whole number >= 0, got {value!r}")


def smoothed(scores: list[float], window: int = SMOOTHED_SCORES) -> list[float]:
    """Each score averaged with the ones before it, `window` in all (fewer at the start).

    >>> [round(v, 3) for v in smoothed([0.1, 0.5, 0.3, 0.3])]
    [0.1, 0.3, 0.3, 0.367]
    """
    return [sum(scores[max(0, i + 1 - window):i + 1]) / (i + 1 - max(0, i + 1 - window)) for i in range(len(scores))]


def plateaued(scores: list[float], patience: int, every: int, window: int = SMOOTHED_SCORES) -> bool:
    """True when the last `patience` epochs of held-out scores (one per `every` epochs), smoothed
    over `window` scores, hold none better than the best before them; `patience` 0: never."""
    if patience <= 0 or not scores:
        return False
    curve = [round(v, 9) for v in smoothed(scores, window)]  # equal means compare equal
    best = max(range(len(curve)), key=lambda i: (curve[i], -i))  # the first of equal bests
    return (len(curve) - 1 - best) * every >= patience
