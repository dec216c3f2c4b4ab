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
