"""Training sets process-wide TensorFlow and Keras state (seeds, op determinism, the
mixed-precision policy) in one place and puts it back when it ends, also after a failure,
so two trainings in one process do not leak into each other."""

import json
import random

import keras
import numpy as np
import pytest
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config

from components.train.config import TrainConfig
from components.train.process_state import training_state
from components.train.trainer import train_detector


def _state():
    return (random.getstate(), np.random.get_state()[1].tobytes(), context.global_seed(),
            keras.mixed_precision.global_policy().name, tf_config.is_op_determinism_enabled())


def test_the_state_is_set_inside_and_restored_after_a_failure():
    before = _state()
    with pytest.raises(RuntimeError, match="inside"):
        with training_state(seed=7, deterministic=True, precision="mixed_float16"):
            assert keras.mixed_precision.global_policy().name == "mixed_float16"
            assert tf_config.is_op_determinism_enabled() and context.global_seed() == 7
            np.random.rand(3)  # the run draws from the seeded generators
            raise RuntimeError("inside")
    assert _state() == before


def test_a_failed_training_leaves_the_process_as_it_found_it(tmp_path):
    (tmp_path / "label_map.json").write_text(json.dumps({"cat": 1}))  # a dataset folder without shards
    before = _state()
    with pytest.raises(FileNotFoundError, match="no train shards"):
        train_detector(TrainConfig(data_dir=str(tmp_path), output_dir=str(tmp_path / "out"), deterministic=True,
                                   seed=3))
    assert _state() == before
