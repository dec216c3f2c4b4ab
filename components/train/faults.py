"""Training faults: non-finite losses and updates, out-of-memory errors, and a switch that
injects them so recovery is testable on a CPU.

`DETPIPE_INJECT_FAULT=nan@K` makes the loss of global step K (1-based) NaN, once: the NaN is
added to the loss inside the compiled step, so it reaches the loss and the update on every
machine (NaN pixels do not: oneDNN's CPU kernels drop them before the loss and poison only
the update). K is the step as the callbacks count it (checkpoints, `term@K`, `oom@K`), not
the optimizer's update count: under mixed_float16 the LossScaleOptimizer skips the updates
whose gradients overflowed, so its count falls behind the steps trained. `oom@K` raises `tf.errors.ResourceExhaustedError` when step K starts, once.
`term@K` sends this process a SIGTERM as step K starts, once, as Vertex does before it
takes a spot VM back. With `:always` (`nan@K:always`, `oom@K:always`) it happens every time
step K comes round again, to test the failure paths.

Detection (`FiniteGuard`, `RaiseOnNonFinite`): after every step the loss is checked, and so
is every model variable after the update, in the compiled step (one reduction per
variable), so a step whose update went non-finite is named even when its own loss looked
finite. The step named is the step whose update first went non-finite.

Recovery policy (loop.py): on a non-finite loss or update, restore the last checkpoint,
halve the learning rate and go on; after `max_nan_recoveries` recoveries, fail with a clear
message. On out-of-memory, restore the last checkpoint, halve the micro-batch and keep the
effective batch by gradient accumulation (accumulation.py); fail when a micro-batch of 1
image does not fit.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from components.train.global_step import GlobalStep

logger = logging.getLogger(__name__)

FAULT_ENV = "DETPIPE_INJECT_FAULT"
_SPEC = re.compile(r"^(nan|oom|term)@(\d+)(:always)?$")


class NonFiniteLoss(RuntimeError):
    """The training loss, or the weights after an update, became NaN or Inf."""


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
    _armed: tf.Variable | None = field(default=None, repr=False)
    _step_now: tf.Variable | None = field(default=None, repr=False)  # the global step training (InjectFault sets it)

    @classmethod
    def from_env(cls) -> "FaultPlan":
        spec = os.environ.get(FAULT_ENV, "").strip()
        if not spec:
            return cls()
        match = _SPEC.match(spec)
        if not match:
            raise ValueError(f"{FAULT_ENV}={spec!r}: expected nan@STEP, oom@STEP or term@STEP, optionally with :always")
        return cls(kind=match.group(1), step=int(match.group(2)), always=bool(match.group(3)))

    def poison_loss(self, model: keras.Model) -> None:
        """For `nan@K`: make the loss of global step K NaN inside the compiled step (the step
        `InjectFault` reports before each batch, so it holds across chunks, restores and
        micro-batches). Call before the train function is built."""
        if self.kind != "nan":
            return
        logger.warning("fault injection: NaN loss at step %d (%s)", self.step, FAULT_ENV)
        self._armed = tf.Variable(True, trainable=False, name="nan_fault_armed")
        self._step_now = tf.Variable(0, dtype=tf.int64, trainable=False, name="nan_fault_step")
        armed, step_now, target, compute_loss = self._armed, self._step_now, self.step, model.compute_loss

        def poisoned(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            hit = tf.logical_and(armed, tf.equal(step_now, target))
            return loss + tf.cast(tf.where(hit, float("nan"), 0.0), loss.dtype)

        model.compute_loss = poisoned

    def starting(self, step: int) -> None:
        """Step `step` (global, 1-based) is about to train: what the poisoned loss compares with."""
        if self._step_now is not None:
            self._step_now.assign(step)

    def mark_fired(self) -> None:
        """The fault happened: without `:always` it does not happen again."""
        self.fired = True
        if self.kind == "nan" and not self.always:
            self._armed.assign(False)


class FiniteGuard:
    """Whether every float variable of the model was finite after the last training step,
    computed inside the compiled step (after the update: automatic control dependencies
    order the reads after the optimizer's writes)."""

    def __init__(self, model: keras.Model):
        self._model = model
        self.finite = tf.Variable(True, trainable=False, name="weights_finite")

    def checked(self, train_step):
        """Wrap a `train_step` so it records whether the updated variables are finite."""

        def step(data):
            logs = train_step(data)
            variables = [v for v in self._model.variables if tf.as_dtype(v.dtype).is_floating]
            self.finite.assign(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables]))
            return logs

        return step


class RaiseOnNonFinite(GlobalStep):
    """Stop at the first step whose loss is non-finite (Keras' running mean stays NaN once it
    is) or whose update left a non-finite variable (`FiniteGuard`), naming that step."""

    def __init__(self, guard: FiniteGuard):
        super().__init__()
        self._guard = guard

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise NonFiniteLoss(f"loss is {float(loss)} at step {self.step}")
        if not bool(self._guard.finite.numpy()):
            shown = "" if loss is None else f" (its running loss was {float(loss):.4g})"
            raise NonFiniteLoss(f"the update made the weights non-finite{shown} at step {self.step}")


class InjectFault(GlobalStep):
    """The `oom@K` fault: a ResourceExhaustedError as step K starts, as a too-large batch
    would raise from the training step on a GPU; the `term@K` fault: a SIGTERM to this
    process as step K starts; for `nan@K`, the step about to train, for the poisoned loss."""

    def __init__(self, plan: FaultPlan):
        super().__init__()
        self._plan = plan

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        plan = self._plan
        plan.starting(self.step)
        if plan.kind not in ("oom", "term") or self.step != plan.step or (plan.fired and not plan.always):
            return
        plan.fired = True
        if plan.kind == "term":
            logger.warning("fault injection: SIGTERM at step %d (%s)", self.step, FAULT_ENV)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            logger.warning("fault injection: out of memory at step %d (%s)", self.step, FAULT_ENV)
            raise tf.errors.ResourceExhaustedError(None, None, f"injected out of memory at step {self.step}")
