"""How a tuning trial trains: the regime every trial shares (the training's own batch, input
size, precision and schedule shape, fewer epochs, on the fit part of train) and the training of
one trial in one go, each rung scored on the held-out images as training passes it. Used by the local search
(study.py), its worker processes and a Vertex AI trial (vertex_job.py)."""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from components.train.config import TrainConfig
from components.tune.hparams_file import SEARCH_SPACE

if TYPE_CHECKING:  # the holdout module imports Beam's file systems: not at the CLI's start
    from components.detector.holdout import TuningSplit

logger = logging.getLogger(__name__)

PLAN_FILE = "search_plan.json"  # the trial regime, for the worker processes and Vertex's trials
TRIALS_DIR = "trials"
METRIC = "mAP@[.5:.95] on the tuning split"
REDUCTION = 3  # the pruner keeps the best third at each rung; a trial's first rung is a third of it


@dataclass(frozen=True)
class TrialRegime:
    """How every trial trains: the real training's batch, size and precision on the fit part."""

    base: TrainConfig  # data_dir: the tuning split; checkpoint_every: one rung
    stops: tuple[int, ...]  # the steps a trial is scored at (the last is its end)
    planned_steps: int  # the training tuned: its steps, to compare the search's cost with
    reason: str

    @property
    def batch_size(self) -> int:
        """The training's batch, at which every trial trains."""
        return self.base.batch_size

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), "stops": list(self.stops), "planned_steps": self.planned_steps,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict) -> "TrialRegime":
        return cls(TrainConfig.from_dict(data["base"]), tuple(data["stops"]), data["planned_steps"], data["reason"])


TRIALS_FILE = "trials.jsonl"


@dataclass
class TrialRecord:
    """One row of `trials.jsonl`: written by the tune step (tune_report.py), read by the run
    report (`read_trials`)."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL (RUNNING: stopped, continued by the next run)
    hparams: dict[str, float]
    score: float | None  # at its last scored step
    rungs: dict[str, float]  # step -> mAP on the tuning split
    steps: int  # steps trained
    seconds: float
    error: str | None = None

    def rungs_line(self, digits: int = 3) -> str:
        """Each rung's score as people read it: `0.075 @42, 0.164 @126`."""
        return ", ".join(f"{v:.{digits}f} @{s}" for s, v in self.rungs.items())


def read_trials(folder: str) -> list[TrialRecord]:
    """The rows of FOLDER/trials.jsonl (none when there is no such file)."""
    import json
    from pathlib import Path

    path = Path(folder) / TRIALS_FILE
    return [TrialRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()] \
        if path.is_file() else []


# What a trial sets itself whatever the training it stands for asks: it starts from scratch, and
# its length and checkpoints are the search's (the rungs). `detpipe tune` offers none of these.
TRIAL_OWN = {"max_steps": 0, "checkpoint_every": 0, "stop_after_steps": 0, "fine_tune_epochs": 0, "init_from": None,
             "init_name": "", "init_champion": False, "init_note": "a tuning trial starts from scratch"}


def trial_regime(training: TrainConfig, split: TuningSplit, trial_epochs: int, planned=None) -> TrialRegime:
    """The real training's plan on this machine (`planned`: trainer.planned_run's, when the
    caller has it), and the trials' config from it."""
    from components.train.trainer import plan_training, planned_run

    if planned is None:
        with tempfile.TemporaryDirectory(prefix="detpipe-tune-plan-") as scratch:
            planned = planned_run(replace(training, output_dir=scratch, init_from=None))
    facts, plan = planned
    # A cache file would be shared by every trial (and hold the whole train split): memory or none.
    base = replace(facts.config, data_dir=split.folder, output_dir="", epochs=trial_epochs,
                   cache="memory" if facts.config.cache == "memory" else "",
                   batch_size=plan.machine_batch, precision=plan.precision, **TRIAL_OWN)
    trial = plan_training(base, replace(facts.machine, auto_batch=None), split.fit * facts.windows_per_photo)
    rung = max(1, math.ceil(trial.total_steps / REDUCTION))
    base = replace(base, checkpoint_every=rung)
    total = math.ceil(trial.total_steps / rung) * rung
    stops = (rung, total) if total > rung else (total,)
    reason = (f"{trial_epochs} epoch(s) of the {split.fit} fit images at batch {plan.machine_batch}, "
              f"{base.image_size} px, {plan.precision} (the training's own), {total} steps with the training's "
              f"warmup and cosine decay; scored on the {split.held_out} held-out images at step "
              + " and ".join(str(s) for s in stops) + f"; the training tuned: {plan.total_steps} steps")
    return TrialRegime(base, stops, plan.total_steps, reason)


def train_rungs(regime: TrialRegime, model_dir: str, hparams: dict[str, float], done: dict[int, float],
                on_score: Callable[[int, float], bool]) -> float:
    """Train one trial in one go and score each rung on the held-out images as training
    passes it (the weight average in place, as a finished run has it; the trained weights back
    after): one model build and one trace per trial, not one per rung. A rung in `done`
    (scored before a stop) is not scored again, and training continues from the trial's
    last checkpoint. `on_score(step, score)` returns True to stop there (pruned). Returns the
    last score."""
    from components.detector.losses import weight_average_in_place
    from components.detector.split_prediction import model_metrics
    from components.train.trainer import StoppedAtChunk, train_detector

    scores = dict(done)
    if all(stop in scores for stop in regime.stops):
        return scores[regime.stops[-1]]

    def at_chunk_end(step: int, model, record) -> bool:
        if step not in regime.stops or step in scores:  # a chunk between rungs, or one scored before a recovery
            return False
        with weight_average_in_place(model):
            scores[step] = model_metrics(model, record, regime.base.data_dir)["mAP"]
        return on_score(step, scores[step])

    try:
        train_detector(replace(regime.base, output_dir=model_dir, stop_after_steps=regime.stops[-1], **hparams),
                       at_chunk_end=at_chunk_end)
    except StoppedAtChunk:
        pass  # pruned at the rung just scored
    return scores[max(scores)] if scores else math.nan


def search_record(split: TuningSplit, trial_epochs: int, regime: TrialRegime, steps_trained: int, seconds: float,
                  best_trial: int, **more) -> dict:
    """`best_hparams.json`'s `search`: the tuning split, how trials trained, what the search cost
    (its training steps against the training's) and which trial won; `more` for a backend's own."""
    return {"tuning_split": split.to_dict(), "trial_epochs": trial_epochs, "trial_steps": list(regime.stops),
            "batch_size": regime.batch_size, "regime": regime.reason,
            "space": {k: list(v) for k, v in SEARCH_SPACE.items()}, "steps_trained": steps_trained,
            "training_steps": regime.planned_steps, "cost": round(steps_trained / max(1, regime.planned_steps), 2),
            "seconds": round(seconds, 1), "best_trial": best_trial, **more}

