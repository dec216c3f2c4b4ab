"""Training faults: NaN/Inf losses and out-of-memory errors, and a switch that injects
them so recovery is testable on a CPU.

`DETPIPE_INJECT_FAULT=nan@K` makes the batch of global step K (1-based) all NaN once;
`oom@K` raises `tf.errors.ResourceExhaustedError` when step K starts, once. With
`:always` (`nan@K:always`, `oom@K:always`) it happens every time step K comes round again,
to test the failure paths.

Recovery policy (trainer.py): on a non-finite loss, restore the last checkpoint, halve the
learning rate and go on; after `max_nan_recoveries` recoveries, fail with a clear message.
On out-of-memory, restore the last checkpoint, halve the micro-batch and keep the effective
batch by gradient accumulation (accumulation.py); fail when a micro-batch of 1 image
does not fit.
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
_SPEC = re.compile(r"^(nan|oom)@(\d+)(:always)?$")


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or Inf."""


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite after every allowed recovery."""


class OutOfMemory(RuntimeError):
    """Even a micro-batch of one image does not fit in memory."""


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
            raise ValueError(f"{FAULT_ENV}={spec!r}: expected nan@STEP or oom@STEP, optionally with :always")
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


class GlobalStep(keras.callbacks.Callback):
    """Knows the 1-based global step of the current batch while training runs in chunks
    (Keras epochs of `steps_per_chunk` steps)."""

    def __init__(self, steps_per_chunk: int, initial_chunk: int):
        super().__init__()
        self._per_chunk, self._epoch = steps_per_chunk, initial_chunk
        self.step = initial_chunk * steps_per_chunk

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.step = self._epoch * self._per_chunk + batch + 1


class RaiseOnNonFiniteLoss(GlobalStep):
    """Stop at the first non-finite loss (Keras' running mean stays NaN once it is)."""

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise NonFiniteLoss(f"loss is {float(loss)} at step {self.step}")


class InjectOutOfMemory(GlobalStep):
    """The `oom@K` fault: a ResourceExhaustedError as step K starts, as a too-large batch
    would raise from the training step on a GPU."""

    def __init__(self, plan: FaultPlan, steps_per_chunk: int, initial_chunk: int):
        super().__init__(steps_per_chunk, initial_chunk)
        self._plan = plan

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        plan = self._plan
        if plan.kind == "oom" and self.step == plan.step and (plan.always or not plan.fired):
            plan.fired = True
            logger.warning("fault injection: out of memory at step %d (%s)", self.step, FAULT_ENV)
            raise tf.errors.ResourceExhaustedError(None, None, f"injected out of memory at step {self.step}")
