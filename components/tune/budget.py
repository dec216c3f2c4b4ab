"""How many trials the search runs and how long each is: `tune_trials auto` decided from the
machine and the data, or as given; pure, no TensorFlow.

A trial is a short version of the training it tunes (same batch, input size, precision and
schedule shape) on the fit part of train, `trial_epochs` long, so the search's training
steps are at most about `trials x trial_epochs / epochs x (1 - holdout)` times the
training's; the pruner stops most trials at a third of that.

>>> choose_search("auto", gpus=1, num_train=2000, epochs=10).trials
8
>>> b = choose_search("auto", gpus=0, num_train=2000, epochs=10); b.trials, b.reason[:36]
(0, 'auto: no search on a machine without')
>>> b = choose_search(4, gpus=0, num_train=160, epochs=10); b.trials, b.trial_epochs
(4, 9)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.train.config import TrainConfig
from components.tune.trials import REDUCTION

AUTO = "auto"
# `auto` on a GPU machine: this many trials (the defaults first), each as long as keeps the
# search's training steps at most MAX_COST times the training's before pruning.
AUTO_TRIALS = 8
MAX_COST = 3.0
# The share of train held out to score trials (the training's `holdout`); and the fewest
# held-out images whose mAP `auto` trusts to rank trials. Measured on raccoon (157 train photos,
# 32 held out; benchmarks/tuning.py, 8 trials, seeds 0-2): the winners beat the defaults on the
# tuning split by +0.019 to +0.057 mAP and did not on val (mean -0.0005, sd 0.036): with that
# few images the ranking is noise, so `auto` does not search there. On the demo (497 train, 96
# held out) the winners gained +0.118 mAP on val on average (+0.048 at least). The limit lies
# between the two sizes measured.
HOLDOUT_FRACTION = TrainConfig.holdout  # the training's held-out curve uses the same carve
MIN_HOLDOUT_IMAGES = 50


def trials_or_auto(value: int | str) -> int | str:
    """The trial count as the config holds it: a whole number >= 0, or "auto".

    >>> trials_or_auto("8"), trials_or_auto("auto"), trials_or_auto(0)
    (8, 'auto', 0)
    """
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(f"tune_trials must be 'auto' or a whole number >= 0, got {value!r}")


@dataclass(frozen=True)
class SearchBudget:
    trials: int  # 0: no search, the defaults
    trial_epochs: int  # epochs of one trial over the fit part of train
    cost: float  # the search's training steps over the training's, about (before pruning)
    reason: str
    short: str = ""  # the reason in a few words, for a console line (`auto: no GPU`)


def trial_epochs_for(trials: int, epochs: int, holdout: float, given: int = 0) -> int:
    """Epochs of one trial: given, else as many as keep `trials` trials within MAX_COST
    trainings (at least 1, at most `epochs`).

    >>> trial_epochs_for(8, 10, 0.2), trial_epochs_for(2, 10, 0.2), trial_epochs_for(8, 10, 0.2, given=3)
    (4, 10, 3)
    """
    if given:
        return given
    return max(1, min(epochs, math.floor(epochs * MAX_COST / (trials * (1 - holdout)))))


def choose_search(requested: int | str, gpus: int, num_train: int | None, epochs: int,
                  holdout: float = HOLDOUT_FRACTION, trial_epochs: int = 0,
                  affordable: float | None = None) -> SearchBudget:
    """The search's size and the one line that says why. `affordable`: for a training whose
    length a time budget decides, the epochs the budget would pay for (`epochs` being what it
    trains, at most its cap): `auto` searches only when the budget pays for the training and
    the search (MAX_COST trainings) too, since until a training reaches its plateau more epochs
    gain more than a search at the same cost (docs/measurements.md).

    >>> choose_search("auto", gpus=0, num_train=2000, epochs=100, affordable=450).trials
    8
    >>> choose_search("auto", gpus=1, num_train=2000, epochs=30, affordable=30).reason[:40]
    'auto: no search: the time budget pays fo'
    """
    requested = trials_or_auto(requested)

    def budget(trials: int, why: str, short: str) -> SearchBudget:
        if trials == 0:
            return SearchBudget(0, 0, 0.0, why, short)
        length = trial_epochs_for(trials, epochs, holdout, trial_epochs)
        cost = trials * length / max(1, epochs) * (1 - holdout)
        return SearchBudget(trials, length, round(cost, 2),
                            f"{why}: {trials} trials of {length} epoch(s) on {1 - holdout:.0%} of train, about "
                            f"{cost:.1f}x the training's steps (the pruner stops most trials at 1/{REDUCTION} of "
                            "their length)", short)

    if requested != AUTO:
        return budget(requested, "given", "given") if requested else \
            budget(0, "tune_trials 0: no search, the defaults", "tune_trials 0")
    held_out = math.floor((num_train or 0) * holdout)
    if affordable is not None and affordable < epochs * (1 + MAX_COST):
        return budget(0, f"auto: no search: the time budget pays for {affordable:.0f} epochs of training, fewer than "
                         f"the {epochs} the training takes plus a search of {MAX_COST:g}x that: every second goes "
                         "to training", "auto: the budget trains")
    if affordable is None and gpus < 1:
        return budget(0, "auto: no search on a machine without a GPU (a search costs a few trainings' time; give "
                         "tune_trials N to search anyway)", "auto: no GPU")
    if num_train is not None and held_out < MIN_HOLDOUT_IMAGES:
        return budget(0, f"auto: no search: {holdout:.0%} of {num_train} train images is {held_out} held-out "
                         f"images, fewer than {MIN_HOLDOUT_IMAGES}: too few to rank trials (give tune_trials N to "
                         "search anyway)", "auto: too few images")
    if affordable is not None:
        return budget(AUTO_TRIALS, f"auto: the time budget pays for {affordable:.0f} epochs, the training takes "
                                   f"{epochs}", "auto")
    return budget(AUTO_TRIALS, f"auto on {gpus} GPU(s)", "auto")
