"""How fast training will go on this machine: a few real training steps of the model
(`measure_training_rate`; the input pipeline's own rate is train's `measure_input_rate`).
The probe's storage check and a time budget's epochs (components/train/time_budget.py) use them.

The storage check needs the rate the trainer will read records at; an assumed figure (a
guess per device kind) is wrong by an order of magnitude between a tiny model on a laptop
CPU and a fitted P3 model on a GPU. So the probe times real steps of the model training will
build (the fitted shape when the data is known), on synthetic images, after one step that
traces the graph. On a GPU machine the host's CPUs, decoding and augmenting, often set the
pace instead: the input check compares the two, and the storage check asks of storage only
the slower of them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

# After the tracing step and one more, MIN_TIMED_STEPS say how long a step takes; then as many
# steps as take about MIN_TIMED_SECONDS are timed one by one, within MIN_ and MAX_TIMED_STEPS,
# and the median step sets the rate (`median_step_rate`).
MIN_TIMED_SECONDS = 1.0
MIN_TIMED_STEPS = 3
MAX_TIMED_STEPS = 50


def median_step_rate(step_ends: list[float], batch: int) -> float:
    """Images/s from the times at which consecutive training steps ended: `batch` over the
    median gap. A hiccup (a step the OS or a neighbour delayed) moves a median by at most a
    neighbouring gap, and what `fit` costs to start is before the first end, outside every gap.
    The rule before, the difference of two `fit` calls' times, measured 2,226 images/s on the
    demo here for a model that trains at 85: a hiccup in the shorter call left the longer one
    barely longer.

    >>> median_step_rate([0.0, 0.1, 0.2, 0.3, 1.3, 1.4], 8)  # one 1 s hiccup among 0.1 s steps
    80.0
    """
    if len(step_ends) < 2:
        raise ValueError("median_step_rate needs the ends of at least two steps")
    return batch / max(statistics.median(b - a for a, b in zip(step_ends, step_ends[1:])), 1e-9)


@dataclass(frozen=True)
class TrainingRate:
    images_per_second: float
    source: str  # how it was obtained, for people
    trace_seconds: float = 0.0  # the first step's tracing (and the model's build): what a fit pays once

    def to_dict(self) -> dict:
        return {"images_per_second": round(self.images_per_second, 1), "source": self.source}


class RateMeter:
    """Real training steps of the detector `model_config` describes on synthetic images with
    `boxes_per_image` boxes (the loss's anchor matching grows with them), built once and timed
    at any batch (each new batch traces the step again)."""

    def __init__(self, model_config, boxes_per_image: int = 1):
        import keras

        from components.detector.losses import compile_detector
        from components.detector.model import build_detector

        began = time.perf_counter()
        self.config, self.boxes = model_config, boxes_per_image
        self.model = build_detector(model_config)
        compile_detector(self.model, keras.optimizers.AdamW(1e-4))
        self.build_seconds = time.perf_counter() - began

    def measure(self, batch: int) -> TrainingRate:
        import tensorflow as tf

        from components.detector.losses import build_for_fit
        from components.detector.model import synthetic_batch

        began = time.perf_counter()
        data = tf.data.Dataset.from_tensors(synthetic_batch(batch, self.config.image_size, self.boxes)).repeat()
        build_for_fit(self.model, data.element_spec)
        self.model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # traces the step, then one untimed step
        traced = time.perf_counter()
        step = batch / self._rate_of(data, batch, MIN_TIMED_STEPS)  # how long a step takes, about
        steps = min(MAX_TIMED_STEPS, max(MIN_TIMED_STEPS, 1 + math.ceil(MIN_TIMED_SECONDS / step)))
        rate = self._rate_of(data, batch, steps)
        source = (f"measured: the median step of {steps} training steps of batch {batch} of this model "
                  f"({self.config.image_size} px" + (f", {self.boxes} boxes an image" if self.boxes > 1 else "")
                  + ") on this machine")
        return TrainingRate(rate, source, trace_seconds=self.build_seconds + traced - began)

    def _rate_of(self, data, batch: int, steps: int) -> float:
        """`median_step_rate` of `steps` steps of `fit` on `data`. A callback with a batch end
        makes Keras turn each step's logs into numbers, so an end is also the device's end."""
        import keras

        ends: list[float] = []
        clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter()))
        self.model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
        return median_step_rate(ends, batch)


def measure_training_rate(model_config, batch: int, boxes_per_image: int = 1) -> TrainingRate:
    """Images/s of real training steps of the detector `model_config` describes (`RateMeter`)."""
    return RateMeter(model_config, boxes_per_image).measure(batch)
