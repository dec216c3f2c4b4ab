"""How many train images a carve holds out (holdout.py): pure, no TensorFlow or Beam, so the
CLI's help and the plan read it without importing the carve.

>>> held_out_share(0.2, 157), round(held_out_share(0.2, 2080), 4)
(0.2, 0.0962)
"""

from __future__ import annotations

# The most train images held out, whatever the share: what a curve's score needs, not a fifth of
# any split. Measured on the demo's val detections (a model at mAP 0.77, 40 bootstrap draws a
# size): the sd of an mAP on n images is 0.029 at 32, 0.014 at 128, 0.011 at 200 and 0.008 at
# 400, so past 200 the held-out images buy little precision and cost training images (the demo's
# 2,080 train images held out 407 at 20%; 200 leave 1,880 to train on).
HOLDOUT_MAX_IMAGES = 200


def held_out_share(share: float, num_train: int) -> float:
    """The share of `num_train` images held out: `share`, at most HOLDOUT_MAX_IMAGES images."""
    return min(share, HOLDOUT_MAX_IMAGES / max(1, num_train))
