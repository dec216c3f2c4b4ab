"""How fast training will go on this machine: a few real training steps of the model, and
a few seconds of the real input pipeline on the real shards.

The storage check needs the rate the trainer will read records at; an assumed figure (a
guess per device kind) is wrong by an order of magnitude between a tiny model on a laptop
CPU and a fitted P3 model on a GPU. So the probe times real steps of the model training will
build (the fitted shape when the data is known), on synthetic images, after one step that
traces the graph. On a GPU machine the host's CPUs, decoding and augmenting, often set the
pace instead: the input check compares the two, and the storage check asks of storage only
the slower of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Steps timed after the tracing step: enough to average out a hiccup, few enough for a probe.
TIMED_STEPS = 2
# The input pipeline: batches to fill its buffers first, then seconds timed.
INPUT_WARMUP_BATCHES = 3
INPUT_SECONDS = 2.0


@dataclass(frozen=True)
class TrainingRate:
    images_per_second: float
    source: str  # how it was obtained, for people

    def to_dict(self) -> dict:
        return {"images_per_second": round(self.images_per_second, 1), "source": self.source}


def measure_training_rate(model_config, batch: int, boxes_per_image: int = 1) -> TrainingRate:
    """Images/s of TIMED_STEPS real training steps of the detector `model_config` describes,
    on images with `boxes_per_image` boxes (the loss's anchor matching grows with them)."""
    import keras
    import tensorflow as tf

    from components.detector.losses import build_for_fit, compile_detector
    from components.detector.model import build_detector, synthetic_batch

    model = build_detector(model_config)
    compile_detector(model, keras.optimizers.AdamW(1e-4))
    data = tf.data.Dataset.from_tensors(synthetic_batch(batch, model_config.image_size, boxes_per_image)).repeat()
    build_for_fit(model, data.element_spec)
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # traces the step
    started = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=TIMED_STEPS, verbose=0)
    rate = batch * TIMED_STEPS / (time.perf_counter() - started)
    return TrainingRate(rate, f"measured: {TIMED_STEPS} training steps of batch {batch} of this model "
                              f"({model_config.image_size} px"
                              + (f", {boxes_per_image} boxes an image" if boxes_per_image > 1 else "")
                              + ") on this machine")


def measure_input_rate(data_dir: str, image_size: int, batch: int, seconds: float = INPUT_SECONDS,
                       tiled: bool = False) -> TrainingRate:
    """Images/s of the training input pipeline (`train_dataset`, augmentation as training does
    it) on the train shards of `data_dir` at `image_size` (windows of the photos at full
    resolution when `tiled`), for about `seconds` after a warm-up."""
    import time

    from components.train.input_pipeline import InputConfig, on_accelerator, train_dataset

    # Where training does the flip and photometric jitter: in the step on a GPU, on the host on a CPU.
    config = InputConfig(image_size=image_size, batch_size=batch, finish_in_step=on_accelerator(), tiled=tiled)
    batches = iter(train_dataset(data_dir, config))
    for _ in range(INPUT_WARMUP_BATCHES):
        next(batches)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        next(batches)
        count += batch
    rate = count / (time.perf_counter() - started)
    what = "tiles of the train photos at full resolution" if tiled else "images of the train shards"
    return TrainingRate(rate, f"measured: {count} {what} in batches of {batch} at {image_size} px, decoded and "
                              f"augmented as training does on this machine")
