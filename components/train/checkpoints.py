"""Checkpoints every N steps, and resuming from the latest one.

Training runs as chunks of `every` steps (Keras epochs of `steps_per_epoch=every` over an
endless, seeded dataset). After each chunk a checkpoint holds the weights, the optimizer
state (its step count drives the learning-rate schedule) and the number of chunks done.
A restarted run restores it and skips the input forward by exactly the examples already
consumed, so with `--deterministic` it continues where the killed run stopped, and it
never loses more than `every` steps. Paths may be local or gs:// (tf.train.CheckpointManager).
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)


class ChunkCheckpoints:
    """Save after every chunk; `restore()` returns how many chunks are already done."""

    def __init__(self, model: keras.Model, directory: str, max_to_keep: int = 2, **extra: tf.Variable):
        model.optimizer.build(model.trainable_variables)  # create slots so they can be restored
        self.chunks_done = tf.Variable(0, dtype=tf.int64, trainable=False, name="chunks_done")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, chunks_done=self.chunks_done,
                                               **extra)
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=max_to_keep)

    def restore(self, keep: tuple[tf.Variable, ...] = ()) -> int:
        """Restore the latest checkpoint (if any); returns the chunks it had done. The
        variables in `keep` keep their current values: a recovery goes back to the weights
        but not to the learning-rate scale or micro-batch it had before."""
        latest = self._manager.latest_checkpoint
        if not latest:
            return 0
        current = [v.numpy() for v in keep]
        self._checkpoint.restore(latest).assert_existing_objects_matched()
        for variable, value in zip(keep, current):
            variable.assign(value)
        logger.info("resuming from checkpoint %s: %d chunk(s) already done", latest, int(self.chunks_done.numpy()))
        return int(self.chunks_done.numpy())

    def save(self, chunks_done: int) -> str:
        self.chunks_done.assign(chunks_done)
        return self._manager.save(checkpoint_number=chunks_done)


class SaveEveryChunk(keras.callbacks.Callback):
    """Keras callback: a checkpoint at the end of every chunk (Keras epoch)."""

    def __init__(self, checkpoints: ChunkCheckpoints):
        super().__init__()
        self._checkpoints = checkpoints

    def on_epoch_end(self, epoch, logs=None):
        path = self._checkpoints.save(epoch + 1)
        logger.info("checkpoint %s (chunk %d)", path, epoch + 1)
