"""The learning curve a run watches: after each chunk (an epoch, by default) the losses and the
learning rate; every `score_every` epochs the model's mAP on the held-out part of train (the
tuning split's carve, never val), with the weight average in place as a finished run has it.

It decides when training ends before its planned steps: `patience` epochs without a better
held-out score (a plateau: the learning rate then decays to 0 over a tail, and the run ends),
or the time budget's deadline, which the next chunk would pass.
It keeps the weights of the best scored point (their average), which the trainer saves.

Under several workers each worker scores the same held-out images and the numbers that decide
(score, elapsed time) are averaged across them first (`agree`), so all stop after the same step.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import keras
import numpy as np
import tensorflow as tf

from components.detector.artifacts import HistoryFile, TrainConfigFile
from components.detector.detect import BatchDetector
from components.detector.holdout import HELD_OUT
from components.detector.losses import weight_average_in_place
from components.detector.split_prediction import kept_batches, model_metrics
from components.train.global_step import GlobalStep
from components.train.schedules import WarmupCosine
from components.train.time_budget import ANNEAL_SHARE, SCORE_SHARE, plateaued

logger = logging.getLogger(__name__)

# Vertex AI sets this in a custom job that has a TensorBoard instance: the curve goes there too.
VERTEX_TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"

# Why a run ended, as the summary line and the report say it.
STOP_PLANNED_EPOCHS = "epochs"  # --epochs given, all trained
STOP_BUDGET = "budget"  # the budget's planned steps done, or its deadline reached
STOP_PLATEAU = "plateau"  # patience epochs without a better held-out score

# A budgeted run corrects its length at its second chunk and its first score, each by one chunk's
# pace, which early on runs slower than the run's average (the demo at 25 minutes: 100.7 images/s
# at step 309 against 112.7 over the run, 216 s of its 1500 left unspent). So it corrects again,
# by the mean pace of every chunk since its first, when it has trained these shares of its planned
# steps (later, a longer cosine would lift a learning rate already low).
RECHECK_SHARES = (0.25, 0.5)


@dataclass(frozen=True)
class CurvePlan:
    """What the curve watches for (from the run's plan)."""

    steps_per_epoch: int
    held_out_dir: str = ""  # the carved folder whose `val` shards are scored; "": no scores
    held_out: int = 0  # images scored
    score_every: int = 1  # epochs between scores
    plateau_epochs: int = 0  # the run's patience: epochs without a better score that stop it; 0: never
    deadline: float = 0.0  # time.monotonic() at which the budget ends; 0: none
    budgeted: bool = False
    end_step: int = 0  # the planned last step: always scored
    # For the budget's length corrected by the rate measured in training (`_correct`): images an
    # epoch, steps a chunk, the warmup's share of the steps, the most epochs a budget buys.
    examples_per_epoch: int = 0
    chunk: int = 1
    warmup_share: float = 0.1
    max_epochs: int = 0
    max_step: int = 0  # a cap on the steps (`max_steps`) a correction never passes; 0: none


@dataclass
class CurveState:
    rows: dict[int, dict] = field(default_factory=dict)  # global step -> that chunk's row
    best_step: int = 0
    best_score: float = float("-inf")
    best_weights: list | None = None
    stop_reason: str = ""
    stop_step: int = 0
    score_seconds: float = 0.0
    corrected: str = ""  # how the budget's length was corrected after the first epoch, if it was
    annealing: str = ""  # the plateau that ended the run, and the decay after it


class LearningCurve(GlobalStep):
    """Keras callback at each chunk's end (after its checkpoint): the row, the held-out score,
    the stop decision (`model.stop_training`, which ends `fit` after this chunk)."""

    def __init__(self, plan: CurvePlan, record: Callable[[], TrainConfigFile], writer,
                 agree: Callable[[list[float]], list[float]] = lambda values: values,
                 schedule: WarmupCosine | None = None, on_length: Callable[[int, str], None] = lambda epochs, why: None):
        """`schedule`: the learning rate's, whose length a correction sets; `on_length(epochs, why)`:
        told the corrected length (the trainer keeps it for a resumed run)."""
        super().__init__()
        self.plan, self._record, self._writer, self._agree = plan, record, writer, agree
        self._schedule, self._on_length = schedule, on_length
        self.state = CurveState()
        self._batch_detector: BatchDetector | None = None
        self._batches: list | None = None
        self._chunk_began = time.monotonic()
        self._chunk_seconds = 0.0
        self._chunk_end = 0.0  # when the last chunk's end (its checkpoint, its score) was done
        self._corrections = 0  # of the budget's length (`_correct`)
        self._rechecks = 0  # of RECHECK_SHARES passed
        self._paced_seconds, self._paced_chunks = 0.0, 0  # of the whole chunks timed (all but the first)
        self._score_seconds = 0.0  # the last held-out score's
        self._scored_epoch = 0  # the whole epochs done at the last score
        self._vertex = (tf.summary.create_file_writer(os.environ[VERTEX_TENSORBOARD_ENV])
                        if os.environ.get(VERTEX_TENSORBOARD_ENV) else None)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._chunk_began = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        step = self.step
        self._chunk_seconds = time.monotonic() - self._chunk_began
        for later in [s for s in self.state.rows if s >= step]:  # re-run after a recovery
            del self.state.rows[later]
        chunk_time = time.monotonic() - self._chunk_end if self._chunk_end else 0.0  # steps, input, checkpoint
        if chunk_time > 0:
            self._paced_seconds, self._paced_chunks = self._paced_seconds + chunk_time, self._paced_chunks + 1
        row = {"step": step, "epoch": round(step / self.plan.steps_per_epoch, 3),
               "learning_rate": float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
               **{name: float(value) for name, value in (logs or {}).items()}, "held_out_mAP": None}
        epoch_number = step // self.plan.steps_per_epoch
        out_of_time = self._out_of_time(step)
        last = self._last_chunk(step) or out_of_time  # the last point is always scored
        if self.plan.held_out_dir and (epoch_number - self._scored_epoch >= self.plan.score_every or last):
            row["held_out_mAP"] = self._score(step)  # every `score_every` epochs, however long a chunk is
            self._scored_epoch = epoch_number
        self.state.rows[step] = row
        self._summaries(row)
        if self._due_correction(step, chunk_time):
            self._correct(step, chunk_time)
        if self._last_chunk(step):  # the end (a corrected length may be shorter than this `fit` was asked)
            self.model.stop_training = True
        if not self.state.annealing and plateaued(self.scores(), self.plan.plateau_epochs, self.plan.score_every):
            self._anneal(step)
        if out_of_time:
            reason = f"{STOP_BUDGET}: the time budget's deadline (the next epoch would pass it)"
            self.state.stop_reason, self.state.stop_step = reason, step
            logger.info("train: stops at step %d: %s", step, reason)
            self.model.stop_training = True
        self._chunk_end = time.monotonic()

    def _due_correction(self, step: int, chunk_time: float) -> bool:
        """A budgeted run corrects its length at the end of its second chunk (the first traces the
        step), once more after its first held-out score, whose cost is then known, and at each of
        RECHECK_SHARES of its planned steps."""
        if not (self.plan.deadline and self._schedule is not None and chunk_time > 0 and not self.state.annealing):
            return False
        first_scored = bool(self.plan.held_out_dir) and len(self.scores()) == 1 and self._corrections == 1
        return self._corrections == 0 or first_scored or self._recheck_due(step)

    def _recheck_due(self, step: int) -> bool:
        return self._rechecks < len(RECHECK_SHARES) and step >= RECHECK_SHARES[self._rechecks] * self.plan.end_step

    def _correct(self, step: int, chunk_seconds: float) -> None:
        """The budget's epochs again, at the pace this run trains at (the estimate before it came
        from a few steps on synthetic images, or the probe): a whole chunk's time (its steps, its
        input, its checkpoint; at a recheck the mean of every chunk timed so far) and a held-out
        score's (measured once one ran, else its planned share) an epoch, into what is left before
        the deadline; the schedule's warmup and decay stretched or shortened to the new end."""
        plan = self.plan
        recheck = self._corrections >= 1 and self._recheck_due(step)
        while self._recheck_due(step):
            self._rechecks += 1
        self._corrections += 1
        if recheck:
            chunk_seconds = self._paced_seconds / max(1, self._paced_chunks)
        chunk_seconds, score, left = self._agree([chunk_seconds, self._score_seconds,
                                                  plan.deadline - time.monotonic()])
        done = step / plan.steps_per_epoch
        per_epoch = chunk_seconds * plan.steps_per_epoch / plan.chunk
        scoring = (score / plan.score_every if score else per_epoch * SCORE_SHARE) if plan.held_out_dir else 0.0
        more = math.floor(max(0.0, left) / max(per_epoch + scoring, 1e-9))
        epochs = max(math.ceil(done), min(plan.max_epochs or 10**9, math.floor(done) + more))
        total = max(step, math.ceil(epochs * plan.steps_per_epoch / plan.chunk) * plan.chunk)
        total = min(total, plan.max_step) if plan.max_step else total
        if recheck and total == plan.end_step:
            return
        rate = plan.examples_per_epoch / per_epoch
        timed = self._paced_chunks
        pace = (f"at {rate:.1f} images/s, the mean pace of the {timed} chunks timed by step {step}," if recheck
                else f"at the {rate:.1f} images/s trained by step {step} (a whole chunk's time)")
        line = (f"{epochs} epochs ({total} steps) {pace}" + (f" and {score:.1f} s a held-out score" if score else "")
                + f", {left:.0f} s before the budget's end" + ("" if total != plan.end_step else ": as planned"))
        self.state.corrected = f"{self.state.corrected}; then {line}" if self.state.corrected else line
        if total != plan.end_step:
            warmup = int(self._schedule.warmup_steps.numpy())  # a warmup already done stays as it was
            self._schedule.set_length(warmup if step >= warmup else max(1, int(total * plan.warmup_share)), total)
            self.plan = replace(plan, end_step=total)
            logger.info("train: the budget's length corrected: %s (was %d steps)", line, plan.end_step)
            self._on_length(epochs, self.state.corrected)

    def _last_chunk(self, step: int) -> bool:
        return step >= self.plan.end_step

    def _kept(self, record: TrainConfigFile) -> tuple[BatchDetector | None, list | None]:
        """One BatchDetector for every score (its graph reads the weights as they are at each
        call) and the held-out photos decoded once; a tiled model's photos go through
        model_metrics' own tiled path."""
        if self._batch_detector is None and record.tiling is None:
            self._batch_detector = BatchDetector(self.model, record.image_size)
            self._batches = kept_batches(self.plan.held_out_dir, record.image_size, self.plan.held_out, HELD_OUT)
        return self._batch_detector, self._batches

    def _score(self, step: int) -> float:
        began = time.monotonic()
        record = self._record()
        with weight_average_in_place(self.model):
            score = model_metrics(self.model, record, self.plan.held_out_dir, HELD_OUT, *self._kept(record))["mAP"]
            score = self._agree([score])[0]
            if score > self.state.best_score:  # the weights evaluated and exported if nothing later beats them
                self.state.best_step, self.state.best_score = step, score
                self.state.best_weights = [np.array(w) for w in self.model.get_weights()]
        self._score_seconds = time.monotonic() - began
        self.state.score_seconds += self._score_seconds
        logger.info("train: held-out mAP %.4f at step %d (best %.4f at step %d)", score, step,
                    self.state.best_score, self.state.best_step)
        return score

    def scores(self) -> list[float]:
        return [row["held_out_mAP"] for _, row in sorted(self.state.rows.items()) if row["held_out_mAP"] is not None]

    def _out_of_time(self, step: int) -> bool:
        """The next chunk (and a score after it) would end past the budget's deadline: stop here."""
        if not self.plan.deadline or self._last_chunk(step):
            return False
        scoring = self.state.score_seconds / max(1, len(self.scores()))
        return self._agree([self.plan.deadline - time.monotonic() - self._chunk_seconds - scoring])[0] < 0

    def _anneal(self, step: int) -> None:
        """A plateau: the learning rate decays from where it is to 0 over ANNEAL_SHARE of the epochs
        done (within the planned end), then the run ends; at once when there is no room left."""
        plan = self.plan
        tail = max(1, math.ceil(ANNEAL_SHARE * step / plan.steps_per_epoch))
        end = min(plan.end_step, step + math.ceil(tail * plan.steps_per_epoch / plan.chunk) * plan.chunk)
        self.state.annealing = (f"no better held-out mAP for {plan.plateau_epochs} epochs (patience) after "
                                f"{self.state.best_score:.4f} at epoch {self.state.best_step / plan.steps_per_epoch:g}")
        if end <= step or self._schedule is None:
            self.state.stop_reason, self.state.stop_step = f"{STOP_PLATEAU}: {self.state.annealing}", step
            self.model.stop_training = True
            return
        self._schedule.anneal(step, end - step)
        self.state.annealing += (f"; then the learning rate decayed to 0 over {(end - step) / plan.steps_per_epoch:g} "
                                 "epochs")
        self.plan = replace(plan, end_step=end)
        logger.info("train: plateau at step %d: %s", step, self.state.annealing)
        self._on_length(math.ceil(end / plan.steps_per_epoch), self.state.annealing)

    def _summaries(self, row: dict) -> None:
        for writer in (self._writer, self._vertex):
            if writer is None:
                continue
            with writer.as_default(step=row["step"]):
                for name, value in row.items():
                    if name not in ("step", "epoch") and value is not None:
                        tf.summary.scalar(f"{'held_out' if name == 'held_out_mAP' else 'epoch'}/{name}", value)
            writer.flush()

    def finish(self) -> tuple[str, HistoryFile]:
        """Why training ended, and the history file's columns."""
        end_step = max(self.state.rows, default=self.plan.end_step)
        if not self.state.stop_reason:
            self.state.stop_reason = (f"{STOP_PLATEAU}: {self.state.annealing}" if self.state.annealing else
                                      f"{STOP_BUDGET}: the budget's planned epochs are done" if self.plan.budgeted
                                      else f"{STOP_PLANNED_EPOCHS}: the given epochs are done")
            self.state.stop_step = end_step
        rows = [row for _, row in sorted(self.state.rows.items())]
        best = self.state.best_step if self.state.best_weights is not None else 0
        return self.state.stop_reason, HistoryFile.from_rows(rows, stop=self.state.stop_reason, best_step=best,
                                                             score_seconds=round(self.state.score_seconds, 1))
