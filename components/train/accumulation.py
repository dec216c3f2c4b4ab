"""Gradient accumulation inside one training step, for OOM recovery.

After an out-of-memory error the trainer splits every batch into `micro_batches` equal
parts, runs forward and backward on one part at a time (so activations need memory for
one micro-batch only), averages the gradients and applies them once. The effective
batch, the optimizer step count, the learning-rate schedule, the input pipeline and the
checkpoints all stay exactly as they were.

Why not Keras' own `gradient_accumulation_steps`: it counts micro-steps in the optimizer's
step counter, which drives the learning-rate schedule and is saved in checkpoints, so a
mid-run switch would change the schedule and break resuming. This replaces Keras'
`train_step` (backend/tensorflow/trainer.py) with the same steps in a loop; it uses the
trainer's `_compute_loss` and `_loss_tracker` exactly as Keras' own `train_step` does.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def next_micro_batches(batch_size: int, micro_batches: int) -> int | None:
    """The number of parts after halving the micro-batch: the smallest divisor of the
    batch whose part is at most half the current part; None when parts are already 1 image."""
    current = batch_size // micro_batches
    if current <= 1:
        return None
    target = current // 2
    return next(n for n in range(micro_batches + 1, batch_size + 1)
                if batch_size % n == 0 and batch_size // n <= target)


def _slice(tree, start, size):
    return tf.nest.map_structure(lambda t: t[start:start + size], tree)


def make_accumulating_step(model: keras.Model, micro_batches: int):
    """A `train_step` for `model` that accumulates gradients over `micro_batches` parts."""

    def train_step(data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        batch = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
        size = batch // micro_batches
        variables = model.trainable_variables

        def body(i, loss_sum, sums):
            xs, ys = _slice(x, i * size, size), _slice(y, i * size, size)
            with tf.GradientTape() as tape:
                y_pred = model(xs, training=True)
                loss = model._compute_loss(x=xs, y=ys, y_pred=y_pred, sample_weight=None, training=True)
                scaled = model.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            sums = [s + (tf.zeros_like(s) if g is None else tf.cast(g, s.dtype)) for s, g in zip(sums, grads)]
            return i + 1, loss_sum + tf.cast(loss, tf.float32), sums

        zeros = [tf.zeros(v.shape, dtype=v.dtype) for v in variables]
        _, loss_sum, sums = tf.while_loop(lambda i, *_: i < micro_batches, body,
                                          (tf.constant(0), tf.constant(0.0), zeros))
        model.optimizer.apply_gradients(zip([s / micro_batches for s in sums], variables))
        # Under tf.distribute, `_compute_loss` divides by the replica count (so replica
        # gradients sum right); the logged loss is not divided (as in Keras' own step).
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        model._loss_tracker.update_state(loss_sum / micro_batches * replicas, sample_weight=batch)
        return model.get_metrics_result()

    return train_step


def use_micro_batches(model: keras.Model, micro_batches: int, wrap=None) -> None:
    """Make `model.fit` train with `micro_batches` parts per batch (1: Keras' own step),
    optionally wrapped (e.g. by observe.StepClock.timed)."""
    step = make_accumulating_step(model, micro_batches) if micro_batches > 1 else type(model).train_step.__get__(model)
    model.train_step = wrap(step) if wrap else step
    model.make_train_function(force=True)
