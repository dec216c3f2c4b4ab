"""Training faults: NaN/Inf losses, and a switch that injects them so recovery is testable on a CPU.

`DETPIPE_INJECT_FAULT=nan@K` makes the batch of global step K (1-based) all NaN once;
`nan@K:always` does it every time step K comes round again (to test the failure path).

Recovery policy (trainer.py): on a non-finite loss, restore the last checkpoint, halve the
learning rate and go on; after `max_recoveries` recoveries, fail with a clear message.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)

FAULT_ENV = "DETPIPE_INJECT_FAULT"
_SPEC = re.compile(r"^(nan)@(\d+)(:always)?$")


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or Inf."""


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite after every allowed recovery."""


@dataclass
class FaultPlan:
    kind: str | None = None
    step: int = 0
    always: bool = False
    fired: bool = False

    @classmethod
    def from_env(cls) -> "FaultPlan":
        spec = os.environ.get(FAULT_ENV, "").strip()
        if not spec:
            return cls()
        match = _SPEC.match(spec)
        if not match:
            raise ValueError(f"{FAULT_ENV}={spec!r}: expected nan@STEP or nan@STEP:always")
        return cls(kind=match.group(1), step=int(match.group(2)), always=bool(match.group(3)))

    def poison(self, batches: tf.data.Dataset, first_step: int) -> tf.data.Dataset:
        """NaN images at the planned step of a batched dataset that starts at `first_step`."""
        if self.kind != "nan" or (self.fired and not self.always):
            return batches
        target = self.step
        logger.warning("fault injection: NaN inputs at step %d (%s)", target, FAULT_ENV)

        def maybe_poison(index, batch):
            images, targets = batch
            hit = tf.equal(index + 1, target)
            return tf.where(hit, images * float("nan"), images), targets

        return batches.enumerate(start=first_step).map(maybe_poison)


class RaiseOnNonFiniteLoss(keras.callbacks.Callback):
    """Stop at the first non-finite loss (Keras' running mean stays NaN once it is)."""

    def __init__(self, first_step: int, steps_per_chunk: int, initial_chunk: int):
        super().__init__()
        self._first_step, self._per_chunk, self._initial = first_step, steps_per_chunk, initial_chunk
        self._epoch = initial_chunk

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            step = self._epoch * self._per_chunk + batch + 1
            raise NonFiniteLoss(f"loss is {float(loss)} at step {step}")
