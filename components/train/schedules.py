"""Learning-rate schedule whose scale can be lowered during training (NaN recovery)
and is saved with the checkpoints."""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="detpipe")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale * base(step)`; `scale` is a variable so a recovery can lower it in place."""

    def __init__(self, base: keras.optimizers.schedules.LearningRateSchedule, scale: float = 1.0):
        self.base = base
        self.scale = tf.Variable(float(scale), trainable=False, dtype=tf.float32, name="lr_scale")
        self._traced = weakref.WeakKeyDictionary()  # graph -> (step, its rate): see __call__

    def __call__(self, step):
        if tf.executing_eagerly():
            return self._rate(step)
        # Keras's AdamW asks for the rate once for each variable it decays (about 100 times a
        # step), and CosineDecay's warmup is a cond: every ask added two branch graphs to the
        # traced train step, 8 of the 40 s a tiny CPU run took. Within one graph every ask
        # before the optimizer counts the step sees the same step, so the rate is built once a
        # graph (a cond branch or a replica's update in another graph builds its own).
        graph = tf.compat.v1.get_default_graph()
        seen = self._traced.get(graph)
        if seen is None or seen[0] is not step:
            seen = (step, self._rate(step))
            self._traced[graph] = seen
        return seen[1]

    def _rate(self, step):
        return self.scale * tf.cast(self.base(step), tf.float32)

    def get_config(self):
        return {"base": keras.optimizers.schedules.serialize(self.base), "scale": float(self.scale.numpy())}

    @classmethod
    def from_config(cls, config):
        return cls(keras.optimizers.schedules.deserialize(config["base"]), config["scale"])
