"""The training loop: `model.fit` from the last checkpoint to the end, through faults.

- A non-finite loss or update: restore the last checkpoint, lower the learning rate, go
  on; at most `max_nan_recoveries` times (faults.py).
- Out of memory on one machine: restore, halve the micro-batch and accumulate gradients to
  keep the batch (accumulation.py), until a micro-batch of one image does not fit. Under
  several workers one worker cannot change its step alone: it stops with the fix instead.
- SIGTERM (a spot VM being taken back, a cancelled job): every worker finishes the current
  step, saves a checkpoint at it, and `Preempted` ends the process with code 143; the
  restarted run resumes at that step.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import keras
import tensorflow as tf

from components.detector.losses import build_for_fit
from components.train.accumulation import next_micro_batches, use_micro_batches
from components.train.checkpoints import SaveEveryChunk, StepCheckpoints
from components.train.curve import LearningCurve
from components.train.config import TrainConfig
from components.train.faults import (FaultPlan, FiniteGuard, InjectFault, NonFiniteLoss, OutOfMemory, RaiseOnNonFinite,
                                     TrainingDiverged)
from components.train.global_step import GlobalStep
from components.train.input_pipeline import InputConfig, model_element_spec, train_dataset
from components.train.mosaic import clean_from, takes_mosaic
from components.train.observe import TrainingMonitor
from components.train.schedules import ScaledSchedule

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what a process ended by SIGTERM reports; Vertex restarts it


class Preempted(RuntimeError):
    """A SIGTERM stopped training after a checkpoint at the current step."""

    def __init__(self, step: int, path: str):
        super().__init__(f"SIGTERM: stopped at step {step} after saving checkpoint {path}; "
                         "run the same command again to resume from it")
        self.step, self.path = step, path


class WorkerLost(RuntimeError):
    """Another worker of the cluster stopped (killed, out of memory, its VM taken back)."""


class StopRequest:
    """A SIGTERM on any worker, seen by every worker at the end of the same step.

    The handler only sets an event; before the next step the flag variable is raised, and
    the train step all-reduces it first (a sum over every replica of every worker) into `seen`,
    so all workers stop after the same step without any other coordination."""

    def __init__(self):
        self.event = threading.Event()
        self.flag = tf.Variable(0.0, trainable=False, name="stop_requested")
        self.seen = tf.Variable(0.0, trainable=False, name="stop_seen")
        self._previous = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        logger.warning("train: SIGTERM received: saving a checkpoint after the current step")
        self.event.set()

    def reported(self, train_step):
        """A train step that also all-reduces the stop flag into `seen`, before anything else
        of the step: with no data dependency between them, two workers could start this and the
        gradients' all-reduce in opposite orders, and on a CPU with few threads each then waits
        for the other (seen as a hang of the two-worker test under mixed_float16)."""

        def step(data):
            context = tf.distribute.get_replica_context()
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, self.flag.read_value())
            with tf.control_dependencies([self.seen.assign(reduced)]):
                return train_step(data)

        return step


class StopAtRequest(GlobalStep):
    """Save a checkpoint at the step where a stop was seen, then raise `Preempted`."""

    def __init__(self, stop: StopRequest, checkpoints: StepCheckpoints):
        super().__init__()
        self._stop, self._checkpoints = stop, checkpoints

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self._stop.event.is_set() and not float(self._stop.flag.numpy()):
            self._stop.flag.assign(1.0)

    def on_train_batch_end(self, batch, logs=None):
        if float(self._stop.seen.numpy()):
            path = self._checkpoints.save(self.step)
            logger.warning("train: checkpoint %s at step %d after SIGTERM", path, self.step)
            raise Preempted(self.step, path)


class StoppedAtChunk(RuntimeError):
    """The caller's chunk-end hook asked training to stop at `step` (a pruned tuning trial)."""

    def __init__(self, step: int):
        super().__init__(f"stopped at step {step}: the chunk-end hook asked to")
        self.step = step


# Called after each chunk's checkpoint with the global step and the live model; True stops there.
ChunkHook = Callable[[int, keras.Model], bool]


class AtChunkEnd(GlobalStep):
    """Runs a `ChunkHook` after each chunk (after SaveEveryChunk's checkpoint); raises
    `StoppedAtChunk` when it returns True."""

    def __init__(self, hook: ChunkHook):
        super().__init__()
        self._hook = hook

    def on_epoch_end(self, epoch, logs=None):
        if self._hook(self.step, self.model):
            raise StoppedAtChunk(self.step)


@dataclass
class LoopParts:
    """The live objects the loop drives and a recovery changes."""

    model: keras.Model
    schedule: ScaledSchedule
    micro_batches: tf.Variable  # parts per batch (more than 1 after an OOM), saved with the checkpoints
    checkpoints: StepCheckpoints
    monitor: TrainingMonitor
    faults: FaultPlan
    guard: FiniteGuard
    stop: StopRequest
    wrap: Callable  # what every train step is wrapped in (timing, finiteness, stop flag)
    multi_worker: bool = False


def _fit_to_end(parts: LoopParts, config: TrainConfig, input_config: InputConfig, steps_done: int, chunk: int,
                end: Callable[[], int], callbacks: list[keras.callbacks.Callback]) -> dict[str, list[float]]:
    """`model.fit` from `steps_done` to `end()` (a budget's length may change as it trains): first
    the rest of a chunk a SIGTERM interrupted, then whole chunks. Returns the per-chunk logs."""
    verbose = "auto" if os.isatty(2) else 2
    logs: dict[str, list[float]] = {}
    while steps_done < (total_steps := end()):
        into_chunk = steps_done % chunk
        if into_chunk:  # resumed mid-chunk: finish it, so checkpoints stay on chunk boundaries
            epochs, initial_epoch, per_epoch = 1, 0, chunk - into_chunk
        else:
            epochs, initial_epoch, per_epoch = total_steps // chunk, steps_done // chunk, chunk
        clean = clean_from(total_steps) if takes_mosaic(config.mosaic, input_config.tiled) else 0
        data = train_dataset(config.data_dir, replace(input_config, skip_steps=steps_done, mosaic_until_step=clean))
        # Else the first step is traced twice; and under several workers this is the only
        # build (fit_across_workers skips Keras's own, which fails there).
        build_for_fit(parts.model, model_element_spec(data.element_spec))
        for callback in callbacks:
            if isinstance(callback, GlobalStep):
                callback.start_segment(steps_done, per_epoch)
        history = parts.model.fit(data, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=per_epoch,
                                  callbacks=callbacks, verbose=verbose)
        _say_slow_teardown(parts.monitor)
        for name, values in history.history.items():
            logs.setdefault(name, []).extend(float(v) for v in values)
        if parts.model.stop_training:  # the learning curve ended the run (curve.py): a plateau, the budget
            break
        steps_done += (epochs - initial_epoch) * per_epoch
    return logs


# A fit that took longer than this to return after its last callback is said in the log: 3 of 10
# demo trainings here spent 16-54 s there, in the input iterator's destructor waiting for tf.data's
# autotuning thread, which train_dataset now turns off; kept so that a pause there shows again.
SLOW_TEARDOWN_SECONDS = 5.0


def _say_slow_teardown(monitor: TrainingMonitor) -> None:
    seconds = time.monotonic() - monitor.fit_ended if monitor.fit_ended is not None else 0.0
    if seconds > SLOW_TEARDOWN_SECONDS:
        logger.warning("train: Keras' fit returned %.1f s after its last callback (its input pipeline's teardown)",
                       seconds)


def fit_with_recovery(parts: LoopParts, config: TrainConfig, input_config: InputConfig, steps_done: int, chunk: int,
                      total_steps: int, at_chunk_end: ChunkHook | None = None,
                      curve: LearningCurve | None = None) -> tuple[dict[str, list[float]], list[str]]:
    """Train from `steps_done` to `total_steps`, recovering from faults from the last
    checkpoint; returns the per-chunk logs of the last uninterrupted stretch and what was
    recovered from. `curve` (curve.LearningCurve): after each chunk's checkpoint, records it and
    may end training there; `at_chunk_end`: called after it (`AtChunkEnd`)."""
    recoveries, nan_recoveries = [], 0
    batch = input_config.batch_size
    per_replica = batch // parts.model.distribute_strategy.num_replicas_in_sync
    # What a recovery changes, and the schedule's length (a budget's correction, a plateau's anneal):
    # a restore keeps them.
    recovery_state = (parts.schedule.scale, parts.micro_batches, *parts.schedule.base.variables.values())
    step = RaiseOnNonFinite(parts.guard)
    callbacks = [parts.monitor, SaveEveryChunk(parts.checkpoints), step, InjectFault(parts.faults),
                 StopAtRequest(parts.stop, parts.checkpoints)] + ([curve] if curve else []) + (
                    [AtChunkEnd(at_chunk_end)] if at_chunk_end else [])
    end = (lambda: curve.plan.end_step) if curve is not None else (lambda: total_steps)
    parts.stop.install()
    try:
        while True:
            try:
                return _fit_to_end(parts, config, input_config, steps_done, chunk, end, callbacks), recoveries
            except NonFiniteLoss as err:
                parts.faults.mark_fired()
                if nan_recoveries >= config.max_nan_recoveries:
                    raise TrainingDiverged(
                        f"{err}; still non-finite after {nan_recoveries} recoveries that lowered the learning rate "
                        f"to {float(parts.schedule.scale.numpy()):g}x. Check the data (rejects-*.jsonl, box "
                        "coordinates) or lower --base-lr") from err
                steps_done = parts.checkpoints.restore(keep=recovery_state)
                parts.schedule.scale.assign(parts.schedule.scale * config.nan_lr_factor)
                nan_recoveries += 1
                event = (f"{err}: restored the checkpoint after step {steps_done}, learning rate scaled "
                         f"to {float(parts.schedule.scale.numpy()):g}x")
            except tf.errors.ResourceExhaustedError as err:
                if parts.multi_worker:
                    raise OutOfMemory(
                        f"out of memory at step {step.step}: one worker of several cannot shrink its micro-batch "
                        f"alone; use a smaller --batch-size than {batch // input_config.workers} per machine, or "
                        "GPUs with more memory") from err
                current = int(parts.micro_batches.numpy())
                more = next_micro_batches(per_replica, current)
                if more is None:
                    raise OutOfMemory(
                        f"out of memory at step {step.step} even with a micro-batch of 1 image: use a smaller "
                        "--image-size or --model-size, or a GPU with more memory") from err
                steps_done = parts.checkpoints.restore(keep=recovery_state)
                parts.micro_batches.assign(more)
                use_micro_batches(parts.model, more, wrap=parts.wrap)
                event = (f"out of memory at step {step.step}: micro-batch {per_replica // current} -> "
                         f"{per_replica // more} images{' per GPU' if per_replica != batch else ''}, {more} "
                         f"accumulated parts per step keep the effective batch at {batch}; "
                         f"restored the checkpoint after step {steps_done}")
            except tf.errors.UnavailableError as err:
                if not parts.multi_worker:
                    raise
                first_line = str(err).strip().splitlines()[0][:300]
                raise WorkerLost(
                    f"training stopped at step {step.step}: a worker of the cluster is gone ({first_line}); run the "
                    "job again (Vertex restarts it): every worker resumes from the chief's last checkpoint") from err
            logger.warning("train: %s", event)
            recoveries.append(event)
    finally:
        parts.stop.uninstall()
