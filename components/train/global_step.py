"""The global step of the current batch while `model.fit` runs a segment of training.

Training runs in chunks (Keras epochs of `steps_per_epoch` steps) between checkpoints; a
run resumed mid-chunk (after a SIGTERM) first finishes that chunk in a shorter `fit`. Each
`fit` starts at `first_step`, the global step already done; callbacks that name steps
(faults, checkpoints, TensorBoard) derive them from it.
"""

from __future__ import annotations

import keras


class GlobalStep(keras.callbacks.Callback):
    """Knows the 1-based global step of the current batch (`step`)."""

    def __init__(self, first_step: int = 0, steps_per_epoch: int = 1):
        super().__init__()
        self.start_segment(first_step, steps_per_epoch)

    def start_segment(self, first_step: int, steps_per_epoch: int) -> None:
        """Before a `fit` that starts after global step `first_step`."""
        self.first_step, self._per_epoch = first_step, steps_per_epoch
        self._first_epoch: int | None = None
        self._epoch = 0
        self.step = first_step

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is None:
            self._first_epoch = epoch
        self._epoch = epoch - self._first_epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.step = self.first_step + self._epoch * self._per_epoch + batch + 1
