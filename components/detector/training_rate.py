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
import time
from dataclasses import dataclass

# After the tracing step and one more, MIN_TIMED_STEPS say how long a step takes; then as many
# steps as take about MIN_TIMED_SECONDS are timed (a hiccup averages out: 2 steps measured 51
# and 76 images/s in two runs of the same model here), within MIN_ and MAX_TIMED_STEPS.
MIN_TIMED_SECONDS = 1.0
MIN_TIMED_STEPS = 2
MAX_TIMED_STEPS = 50


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
        self.model.fit(data, epochs=1, steps_per_epoch=MIN_TIMED_STEPS, verbose=0)  # how long a step takes, about
        short = time.perf_counter() - traced
        steps = min(MAX_TIMED_STEPS, max(MIN_TIMED_STEPS, math.ceil(MIN_TIMED_SECONDS * MIN_TIMED_STEPS / short)))
        timed = time.perf_counter()
        self.model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        long = time.perf_counter() - timed
        # The difference of the two calls: what `fit` costs to start (~0.5 s here, as much as 10
        # steps of the tiny model at 128 px) is in both and cancels.
        rate = batch * (steps - MIN_TIMED_STEPS) / (long - short) if long > short and steps > MIN_TIMED_STEPS \
            else batch * steps / long
        source = (f"measured: {steps} training steps of batch {batch} of this model ({self.config.image_size} px"
                  + (f", {self.boxes} boxes an image" if self.boxes > 1 else "") + ") on this machine")
        return TrainingRate(rate, source, trace_seconds=self.build_seconds + traced - began)


def measure_training_rate(model_config, batch: int, boxes_per_image: int = 1) -> TrainingRate:
    """Images/s of real training steps of the detector `model_config` describes (`RateMeter`)."""
    return RateMeter(model_config, boxes_per_image).measure(batch)
