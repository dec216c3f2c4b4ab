"""What training did, step by step: TensorBoard scalars, input wait vs compute, the loss curve.

Step time is split by a timestamp taken inside the compiled train step once its batch
has arrived (`timed_step`): input wait = from the step's start in Python to that moment,
compute = the rest. On a GPU the compute share also holds the host-to-device copy.

TensorBoard logs (OUTPUT/tensorboard) are written with `tf.summary` directly rather than
keras.callbacks.TensorBoard, which logs neither the input wait nor images/s per step.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import tensorflow as tf

from components.detector.artifacts import HistoryFile
from components.train.global_step import GlobalStep


class StepClock:
    """Holds the time (seconds since the epoch) at which the last step's batch was ready.
    Disabled under op determinism, which forbids tf.timestamp."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.data_ready = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="data_ready")

    def timed(self, train_step):
        """Wrap a `train_step` so it records when its batch arrived."""
        if not self.enabled:
            return train_step

        def step(data):
            with tf.control_dependencies(tf.nest.flatten(data)):
                self.data_ready.assign(tf.timestamp())
            return train_step(data)

        return step


class TrainingMonitor(GlobalStep):
    """Per-step loss parts, learning rate, images/s and input wait to TensorBoard; totals
    and the per-step loss for the report."""

    def __init__(self, log_dir: str, batch_size: int, clock: StepClock, log_every: int = 10):
        super().__init__()
        self.batch_size, self.clock, self.log_every = batch_size, clock, log_every
        self.writer = tf.summary.create_file_writer(log_dir)
        self._began = 0.0
        self.step_losses: list[tuple[int, float]] = []  # (global step, loss of that step)
        self.steps_timed = 0  # steps after the first (the first includes tracing)
        self.input_wait = 0.0
        self.compute = 0.0
        self.fit_ended: float | None = None  # when the last fit's last callback ran (on_train_end)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._previous_mean = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        self._began = time.time()

    def on_train_batch_end(self, batch, logs=None):
        ended = time.time()
        logs = logs or {}
        step = self.step
        wait = (min(max(float(self.clock.data_ready.numpy()) - self._began, 0.0), ended - self._began)
                if self.clock.enabled else 0.0)
        compute = ended - self._began - wait
        if "loss" in logs:  # Keras reports the running mean over the chunk: recover this step's loss
            mean = float(logs["loss"])
            self.step_losses.append((step, mean * (batch + 1) - self._previous_mean * batch))
            self._previous_mean = mean
        if step > self.first_step + 1:  # the first step of a fit includes tracing
            self.steps_timed += 1
            self.input_wait += wait
            self.compute += compute
        if step % self.log_every == 0 or step == 1:
            with self.writer.as_default(step=step):
                for name, value in logs.items():
                    tf.summary.scalar(f"train/{name}", float(value))
                tf.summary.scalar("train/learning_rate", float(self.model.optimizer.learning_rate.numpy()))
                tf.summary.scalar("speed/images_per_second", self.batch_size / max(ended - self._began, 1e-9))
                if self.clock.enabled:
                    tf.summary.scalar("speed/input_wait_ms", 1000 * wait)
                    tf.summary.scalar("speed/compute_ms", 1000 * compute)

    def on_train_end(self, logs=None):
        self.writer.flush()
        self.fit_ended = time.monotonic()  # the last callback of a fit: what follows is Keras' teardown

    @property
    def images_per_second(self) -> float:
        seconds = self.input_wait + self.compute
        return self.steps_timed * self.batch_size / seconds if seconds else 0.0

    @property
    def input_wait_share(self) -> float | None:
        """None when not measured (--deterministic)."""
        seconds = self.input_wait + self.compute
        if not self.clock.enabled:
            return None
        return self.input_wait / seconds if seconds else 0.0


def draw_loss_curve(step_losses: list[tuple[int, float]], path: Path, history: HistoryFile | None = None,
                    steps_per_epoch: int = 1, size: tuple[int, int] = (640, 320)) -> bool:
    """A PNG of the learning curve against epochs: per-step loss (faint) and its moving average
    (bold) on a log scale, so the late steps are not flattened by the first ones; with a
    `history` that has held-out scores, a second panel of them with the kept (best) point and
    the stop marked (matplotlib, Agg backend). Returns False (and writes nothing) when there is
    no positive finite loss to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    points = [(s, v) for s, v in step_losses if math.isfinite(v) and v > 0]
    if not points:
        return False
    scored = history.scored() if history is not None else []
    per_epoch = max(1, steps_per_epoch)
    epochs, losses = np.array([s for s, _ in points]) / per_epoch, np.array([v for _, v in points])
    window = max(1, len(points) // 25)
    smooth = np.convolve(np.log10(losses), np.ones(window) / window, mode="valid")
    rows = 2 if scored else 1
    fig, axes = plt.subplots(rows, 1, sharex=True, squeeze=False, figsize=(size[0] / 100, size[1] * rows / 100))
    ax = axes[0][0]
    ax.plot(epochs, losses, color="#b8c8e8", linewidth=1, label="per step")
    ax.plot(epochs[window - 1:], 10 ** smooth, color="#1f4e9e", linewidth=2.5, label=f"moving average ({window})")
    ax.set(yscale="log", ylabel="loss", title="Training loss" + (" and held-out mAP" if scored else ""))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if scored:
        curve = axes[1][0]
        x = [s / per_epoch for s, _ in scored]
        curve.plot(x, [v for _, v in scored], marker="o", color="#2e7d32", linewidth=1.5,
                   label="mAP@[.5:.95], held-out train images")
        best = [(s, v) for s, v in scored if s == history.best_step]
        if best:
            curve.plot([best[0][0] / per_epoch], [best[0][1]], marker="*", markersize=14, color="#f9a825",
                       linestyle="none", label="kept (best)")
        end = max(s for s, _ in points) / per_epoch
        for axis in (ax, curve):
            axis.axvline(end, color="#888", linestyle="--", linewidth=1)
        curve.text(end, curve.get_ylim()[1], f"stopped: {history.stop.split(':')[0]} ", fontsize=8, va="top",
                   ha="right", color="#555")
        curve.set(ylabel="held-out mAP")
        curve.grid(alpha=0.3)
        curve.legend(fontsize=8, loc="lower right")
    axes[-1][0].set(xlabel="epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
