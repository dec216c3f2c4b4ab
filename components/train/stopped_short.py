"""Whether a run ended short of its plateau, and what would reach it: pure, no TensorFlow.

A budget (given or `auto`'s cap) can end a run while its held-out curve still climbs: the model
is then less than the data can give, and the run says so in one line, with the budget that
would reach the plateau at the pace it trained at. The estimate fits the held-out scores with
`a + b ln(epoch)` (two numbers, so two or three scores fit it; a detector's learning curve
rises about linearly in log-epochs until it bends) and puts the plateau where the next
`patience` epochs would gain less than PLATEAU_GAIN, at most the epochs a budget buys
(time_budget.MAX_BUDGET_EPOCHS). It is an estimate: a schedule that decays to 0 lifts the last
points, so it is more often short than long.

>>> line = short_line([(2, 0.30), (4, 0.66), (5, 0.72)], patience=10, seconds_per_epoch=20.0, images_per_second=90.0,
...                   cap=100)
>>> line.startswith("stopped short: the held-out curve was still rising (mAP 0.300 at epoch 2 to 0.720 at epoch 5)")
True
>>> short_line([(2, 0.30), (4, 0.72), (6, 0.72), (8, 0.71)], patience=4, seconds_per_epoch=20.0, images_per_second=90.0,
...            cap=100)
''

A run that its epoch cap ended (not its time) is told `--epochs`, which a longer budget would not buy:

>>> capped = short_line([(25, 0.15), (50, 0.24), (75, 0.28), (100, 0.30)], patience=20, seconds_per_epoch=4.5,
...                     images_per_second=60.0, cap=100)
>>> capped.split("; ")[1]
'about 165 epochs would reach its plateau: --epochs 165 (about 13m at the 60.0 images/s trained here)'
"""

from __future__ import annotations

import math

from components.train.time_budget import plateaued

# A gain over the next `patience` epochs smaller than this counts as flat: about the sd of an mAP on
# HOLDOUT_MAX_IMAGES held-out images (0.011 on the demo's, holdout_size.py), a gain the curve
# could not show.
PLATEAU_GAIN = 0.01
# A run its epoch cap ended: the plateau is estimated up to this many times the cap (the estimate
# beyond what the curve showed grows loose; a farther one is said as this bound).
BEYOND_CAP = 5
SHORT_OF_PLATEAU = "short of its plateau"  # how the run's length line marks it (TrainResult.length_line)


def log_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares `score = a + b ln(epoch)` over (epoch, score) points with epoch > 0.

    >>> a, b = log_fit([(1, 0.1), (math.e, 0.3), (math.e ** 2, 0.5)]); round(a, 6), round(b, 6)
    (0.1, 0.2)
    """
    xs = [math.log(epoch) for epoch, _ in points]
    ys = [score for _, score in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def plateau_epoch(slope: float, patience: int, cap: int) -> int:
    """The epoch from which `patience` more epochs gain less than PLATEAU_GAIN on a curve rising
    `slope` per unit of ln(epoch), at most `cap`: b ln((E + P) / E) < gain  <=>  E > P / (e^(gain/b) - 1).

    >>> plateau_epoch(0.05, 10, 100), plateau_epoch(0.5, 10, 100), plateau_epoch(0.0, 10, 100)
    (46, 100, 0)
    """
    if slope <= 0:
        return 0
    return min(cap, math.ceil(max(1, patience) / math.expm1(PLATEAU_GAIN / slope)))


def short_line(scored: list[tuple[float, float]], patience: int, seconds_per_epoch: float, images_per_second: float,
               cap: int, every: int = 1, budget_seconds: float = 0.0) -> str:
    """One line when a run that ended by its budget still had a rising held-out curve, else "".
    `scored`: (epoch, held-out mAP) of every score; `patience`: the run's (epochs); `every`: epochs
    between scores; `seconds_per_epoch`: the run's own pace, scores and checkpoints included;
    `cap`: the most epochs a budget buys; `budget_seconds`: the budget the run had (0: not known).
    When that budget would already buy the plateau at the pace trained (the run planned fewer
    epochs on a slower pace measured early), the line names `--epochs`, not a budget no longer
    than the one given."""
    points = [(epoch, score) for epoch, score in scored if epoch > 0]
    if len(points) < 2:
        return ""
    scores = [score for _, score in points]
    if plateaued(scores, max(1, patience), max(1, every)):
        return ""
    tail = points[-max(3, len(points) // 2):]  # the late curve: its first epochs rise faster than it ends
    _, slope = log_fit(tail)
    done = points[-1][0]
    if slope <= 0 or slope * math.log((done + max(1, patience)) / done) < PLATEAU_GAIN:
        return ""
    first_epoch, first = points[0]
    rising = (f"stopped short: the held-out curve was still rising (mAP {first:.3f} at epoch {first_epoch:g} to "
              f"{scores[-1]:.3f} at epoch {done:g})")
    at_cap = done >= cap  # the cap ended it, not the time: a longer budget buys nothing more, --epochs does
    reach = max(math.ceil(done) + 1, plateau_epoch(slope, patience, BEYOND_CAP * cap if at_cap else cap))
    if at_cap:
        return (f"{rising}, at the most epochs a budget buys ({cap}); about {reach} epochs would reach its "
                f"plateau: --epochs {reach} (about {_duration(reach * seconds_per_epoch)} at the "
                f"{images_per_second:.1f} images/s trained here)")
    needed = reach * seconds_per_epoch
    if 0 < needed <= budget_seconds:
        return (f"{rising}; about {reach} epochs would reach its plateau, which the {_duration(budget_seconds)} "
                f"given buys at the {images_per_second:.1f} images/s trained here (the run planned fewer on a slower "
                f"pace early on): --epochs {reach}")
    return (f"{rising}; about {reach} epochs would reach its plateau"
            + (" (the most a budget buys)" if reach >= cap else "")
            + f": --time-budget {_duration(needed)} at the {images_per_second:.1f} images/s "
              "trained here")


def _duration(seconds: float) -> str:
    """A budget as `--time-budget` takes it, rounded up: `8m`, `45s`."""
    return f"{math.ceil(seconds / 60)}m" if seconds >= 60 else f"{math.ceil(seconds)}s"
