"""A budgeted run's epochs on this machine, first estimated: the time budget (time_budget.py) at
the training rate measured here, by the probe (`ProbeAdvice.images_per_second`) or, without one,
by a few real steps of the fitted model. The trainer corrects them by the pace of its own first
chunks (curve.py), which also holds the input pipeline, checkpoints and callbacks.

The length is kept in the checkpoint folder: a run restarted from a checkpoint (a preempted
spot VM) continues the schedule it started, not one re-measured on another machine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from components.detector.model import ModelConfig
from components.detector.training_rate import TrainingRate, measure_training_rate
from components.train.config import TrainConfig
from components.train.time_budget import RunLength, chosen_length, epochs_for_budget

logger = logging.getLogger(__name__)

RUN_LENGTH_FILE = "run_length.json"


def training_rate(config: TrainConfig, model: ModelConfig, batch: int, boxes: int, replicas: int) -> TrainingRate:
    """Images/s this run will train at, a first estimate: the probe's figure when it measured one,
    else a few real steps of the model on synthetic images here (on one device, times the
    replicas). The trainer corrects the length by its own pace after its first chunks (curve.py)."""
    if config.probe.images_per_second:
        return TrainingRate(config.probe.images_per_second, "the probe's measurement on this machine")
    steps = measure_training_rate(model, batch, boxes)
    return replace(steps, images_per_second=steps.images_per_second * replicas,
                   source=steps.source + (f" x {replicas} devices" if replicas > 1 else ""))


def budget_length(config: TrainConfig, model: ModelConfig, examples_per_epoch: int, batch: int, boxes: int,
                  replicas: int, on_gpu: bool, spent: Callable[[], float], fine_tune_share: float,
                  agree: Callable[[list[float]], list[float]], checkpoint_dir: str) -> RunLength:
    """The epochs the budget buys (or the length a checkpointed run started with), at the rate
    estimated at `batch` images a device. `spent()`: the seconds the step has run so far, read
    after measuring; `agree`: averages the rate and the time spent over the workers, so every
    worker plans the same steps."""
    kept = Path(checkpoint_dir) / RUN_LENGTH_FILE
    if kept.is_file():
        length = RunLength(**json.loads(kept.read_text()))
        logger.info("train: the run length this run started with (%s): %d epochs", kept, length.epochs)
        return length
    bounds = chosen_length(config.time_budget, on_gpu)
    rate = training_rate(config, model, batch, boxes, replicas)
    images_per_second, taken = agree([rate.images_per_second, spent() + rate.trace_seconds])
    length = epochs_for_budget(bounds.seconds, taken, images_per_second, examples_per_epoch, fine_tune_share,
                               bounds.reason, rate.source, bounds.images)
    logger.info("train: %s (corrected by the pace of the first chunks of training)", length.reason)
    return length


def keep_length(length: RunLength, checkpoint_dir: str) -> None:
    """Write the length beside the checkpoints (the chief's)."""
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    (Path(checkpoint_dir) / RUN_LENGTH_FILE).write_text(json.dumps(asdict(length), indent=2) + "\n")
