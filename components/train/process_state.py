"""The process-wide TensorFlow and Keras state a training run sets, in one place, and put
back when the run ends, also when it fails: the random seeds (Python, NumPy, TensorFlow,
Keras), op determinism and Keras' global mixed-precision policy. Without this, a second
training in the same process (a tuning trial after another, a test after a test) starts
from whatever the first left: a float16 policy, deterministic kernels, a reseeded NumPy.

Example:
    >>> import keras
    >>> with training_state(seed=3, deterministic=False, precision="mixed_bfloat16"):
    ...     keras.mixed_precision.global_policy().name
    'mixed_bfloat16'
    >>> keras.mixed_precision.global_policy().name
    'float32'
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.common import global_state
from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config


@contextlib.contextmanager
def training_state(seed: int, deterministic: bool, precision: str) -> Iterator[None]:
    """Seed everything with `seed`, turn on op determinism when asked, and set the Keras
    policy `precision` ("float32", "mixed_float16", "mixed_bfloat16") for the block."""
    # Neither TensorFlow nor Keras offers a public getter for its global seed, nor
    # TensorFlow a way to turn op determinism off again: the private ones below are what
    # their own tests use.
    saved = (random.getstate(), np.random.get_state(), context.global_seed(),
             {name: global_state.get_global_attribute(name) for name in (GLOBAL_RANDOM_SEED, GLOBAL_SEED_GENERATOR)},
             keras.mixed_precision.global_policy(), tf_config.is_op_determinism_enabled())
    keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        python_state, numpy_state, tf_seed, keras_seed, policy, was_deterministic = saved
        keras.mixed_precision.set_global_policy(policy)
        if deterministic and not was_deterministic:
            tf_config.disable_op_determinism()
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        tf.random.set_seed(tf_seed)
        for name, value in keras_seed.items():
            global_state.set_global_attribute(name, value)
