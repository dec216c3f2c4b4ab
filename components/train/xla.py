"""The train step compiled with XLA (`--xla`), by the trainer rather than by Keras.

Keras' `jit_compile` compiles its whole `one_step_on_data`, and with it everything the
trainer wraps around Keras' `train_step`: the input-wait timestamp (observe.StepClock),
which XLA cannot compile (`tf.timestamp`: "Detected unsupported operations ... on
XLA_CPU_JIT: Timestamp"), the finiteness check and the stop flag's all-reduce. So the model
is compiled with `jit_compile=False` (losses.compile_detector) and only the step's own work
(forward, loss, gradients, the optimizer's update; the gradient accumulation after an OOM)
is an XLA function; the wrappers run around it in the same (non-XLA) tf.function.

Example:
    >>> import tensorflow as tf
    >>> step = xla_step(lambda data: {"loss": tf.reduce_sum(data)}, on=True)
    >>> float(tf.function(step)(tf.ones([3]))["loss"])
    3.0
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def xla_step(train_step: Callable, on: bool) -> Callable:
    """`train_step` compiled with XLA when `on`, else as it is."""
    if not on:
        return train_step
    return tf.function(train_step, jit_compile=True, reduce_retracing=True)
