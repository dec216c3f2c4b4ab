"""Learning-rate schedules: linear warmup and cosine decay whose length can change during
training (a time budget's length corrected by the rate of its first epoch), and a scale that
can be lowered during training (NaN recovery) and is saved with the checkpoints."""

from __future__ import annotations

import math
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


@keras.saving.register_keras_serializable(package="detpipe")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak` over `warmup_steps`, then cosine decay to 0 at
    `total_steps`: Keras' CosineDecay(0, total - warmup, warmup_target=peak, warmup_steps=warmup),
    written here with variables for the lengths, because Keras' schedules bake them into the
    traced step as constants and a budgeted run sets its length after its first epoch (`set_length`).

    >>> s = WarmupCosine(1.0, warmup_steps=10, total_steps=110)
    >>> [round(float(s(step)), 3) for step in (0, 5, 10, 60, 110, 200)]
    [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    >>> s.set_length(warmup_steps=20, total_steps=220); round(float(s(120)), 3)
    0.5

    `anneal(from_step, steps)` ends the run sooner (a plateau of the held-out curve): from
    `from_step` the rate decays from where it is to 0 over `steps`, in a cosine of its own.

    >>> s.anneal(120, 40); [round(float(s(step)), 3) for step in (100, 120, 140, 160)]
    [0.655, 0.5, 0.25, 0.0]
    """

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, anneal_from: int = 0, anneal_steps: int = 0):
        self.peak = float(peak)
        self.warmup_steps = tf.Variable(float(warmup_steps), trainable=False, dtype=tf.float32, name="lr_warmup")
        self.total_steps = tf.Variable(float(total_steps), trainable=False, dtype=tf.float32, name="lr_total")
        self.anneal_from = tf.Variable(float(anneal_from), trainable=False, dtype=tf.float32, name="lr_anneal_from")
        self.anneal_steps = tf.Variable(float(anneal_steps), trainable=False, dtype=tf.float32, name="lr_anneal_steps")

    @property
    def variables(self) -> dict[str, tf.Variable]:
        """What a checkpoint keeps of the schedule (a resumed run goes on with its anneal)."""
        return {"lr_warmup": self.warmup_steps, "lr_total": self.total_steps, "lr_anneal_from": self.anneal_from,
                "lr_anneal_steps": self.anneal_steps}

    def set_length(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps.assign(float(warmup_steps))
        self.total_steps.assign(float(total_steps))

    def anneal(self, from_step: int, steps: int) -> None:
        self.anneal_from.assign(float(from_step))
        self.anneal_steps.assign(float(max(1, steps)))

    def _cosine(self, step):
        warmup = tf.maximum(self.warmup_steps, 1.0)
        decay = tf.maximum(self.total_steps - self.warmup_steps, 1.0)
        done = tf.clip_by_value((step - self.warmup_steps) / decay, 0.0, 1.0)
        return tf.where(step < self.warmup_steps, self.peak * step / warmup,
                        self.peak * 0.5 * (1.0 + tf.cos(math.pi * done)))

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        rate = self._cosine(step)
        done = tf.clip_by_value((step - self.anneal_from) / tf.maximum(self.anneal_steps, 1.0), 0.0, 1.0)
        annealed = self._cosine(self.anneal_from) * 0.5 * (1.0 + tf.cos(math.pi * done))
        return tf.where((self.anneal_steps > 0) & (step >= self.anneal_from), annealed, rate)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": int(self.warmup_steps.numpy()),
                "total_steps": int(self.total_steps.numpy()), "anneal_from": int(self.anneal_from.numpy()),
                "anneal_steps": int(self.anneal_steps.numpy())}
