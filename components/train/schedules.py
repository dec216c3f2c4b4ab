"""Learning-rate schedule whose scale can be lowered during training (NaN recovery)
and is saved with the checkpoints."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="detpipe")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale * base(step)`; `scale` is a variable so a recovery can lower it in place."""

    def __init__(self, base: keras.optimizers.schedules.LearningRateSchedule, scale: float = 1.0):
        self.base = base
        self.scale = tf.Variable(float(scale), trainable=False, dtype=tf.float32, name="lr_scale")

    def __call__(self, step):
        return self.scale * tf.cast(self.base(step), tf.float32)

    def get_config(self):
        return {"base": keras.optimizers.schedules.serialize(self.base), "scale": float(self.scale.numpy())}

    @classmethod
    def from_config(cls, config):
        return cls(keras.optimizers.schedules.deserialize(config["base"]), config["scale"])
