"""Checkpoints every N steps (and at a SIGTERM), and resuming from the latest one.

Training runs as chunks of `every` steps (Keras epochs of `steps_per_epoch=every` over an
endless, seeded dataset). After each chunk a checkpoint holds the weights, the optimizer
state (its step count drives the learning-rate schedule) and the global step it was taken
at; a SIGTERM adds one at the current step (loop.py). A restarted run restores the latest
and skips the input forward by exactly the examples already consumed, so with
`--deterministic` it continues where the killed run stopped, and it never loses more than
`every` steps. Paths may be local or gs:// (tf.train.CheckpointManager).

Under several workers (distribution.py) every worker saves, but only the chief into the
output folder; every worker restores from the chief's checkpoints (`read_dir`).
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from components.train.global_step import GlobalStep

logger = logging.getLogger(__name__)


class StepCheckpoints:
    """Save at a global step; `restore()` returns the step of the latest checkpoint."""

    def __init__(self, model: keras.Model, read_dir: str, write_dir: str | None = None, max_to_keep: int = 2,
                 **extra: tf.Variable):
        model.optimizer.build(model.trainable_variables)  # create slots so they can be restored
        self.steps_done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, steps_done=self.steps_done,
                                               **extra)
        self._read = tf.train.CheckpointManager(self._checkpoint, read_dir, max_to_keep=max_to_keep)
        self._write = (self._read if write_dir in (None, read_dir) else
                       tf.train.CheckpointManager(self._checkpoint, write_dir, max_to_keep=1))

    def restore(self, keep: tuple[tf.Variable, ...] = ()) -> int:
        """Restore the latest checkpoint (if any); returns the steps it had done. The
        variables in `keep` keep their current values: a recovery goes back to the weights
        but not to the learning-rate scale or micro-batch it had before."""
        latest = self._read.latest_checkpoint
        if not latest:
            return 0
        current = [v.numpy() for v in keep]
        self._checkpoint.restore(latest).assert_existing_objects_matched()
        for variable, value in zip(keep, current):
            variable.assign(value)
        logger.info("resuming from checkpoint %s: %d step(s) already done", latest, int(self.steps_done.numpy()))
        return int(self.steps_done.numpy())

    def save(self, steps_done: int) -> str:
        self.steps_done.assign(steps_done)
        return self._write.save(checkpoint_number=steps_done)


class SaveEveryChunk(GlobalStep):
    """Keras callback: a checkpoint at the end of every chunk (Keras epoch)."""

    def __init__(self, checkpoints: StepCheckpoints):
        super().__init__()
        self._checkpoints = checkpoints

    def on_epoch_end(self, epoch, logs=None):
        path = self._checkpoints.save(self.step)
        logger.info("checkpoint %s (step %d)", path, self.step)
