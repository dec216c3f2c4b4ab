"""`detpipe tune`: a hyperparameter search whose winner transfers to the training it tunes,
and whose score never comes from the val split.

- **Trials are short versions of the real training.** The training tuned is planned first
  (`trainer.planned_run`: the fitted input size, the measured batch, the precision); every
  trial trains at that batch, size and precision, with the same warmup and cosine schedule,
  for `trial_epochs` epochs of the fit part of train (budget.py).
- **Scored on held-out train images** (holdout.py): trials train on the fit part and are
  scored by COCO mAP on the held-out part; the folder they read holds no val record.
- **Optuna** (TPE sampler; successive-halving pruner fed by each trial's mAP at a third of
  its steps, `trainer`'s `stop_after_steps`): the defaults (the given values) are the
  first trial and are never pruned, so the report can say what the search gained over them.
- **A stop is not a failure.** The study is a journal file in the step's output: a SIGTERM
  checkpoints the running trial and ends the step (`Preempted`, exit 143); the same command
  continues that trial from its checkpoint and never repeats a finished one. A SIGKILL
  leaves the trial running in the journal: it is continued the same way.
- **Trials in parallel**, one per GPU (`parallel`), each in a worker process (worker.py)
  sharing the journal.

Writes `best_hparams.json` (hparams_file.py), `trials.jsonl`, `tune_report.md` and its
pictures (tune_report.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from components.train.config import TrainConfig
from components.train.time_budget import AUTO
from components.tune.budget import HOLDOUT_FRACTION, SearchBudget, choose_search, trials_or_auto
from components.tune.hparams_file import DEFAULTS, BestHparams
from components.tune.study import STUDY_FILE, open_study, run_trials, run_workers, trial_records
from components.tune.trials import (METRIC, PLAN_FILE, TRIALS_DIR, TrialRecord, TrialRegime, search_record,
                                    trial_regime)

if TYPE_CHECKING:  # the holdout module imports Beam's file systems: not at the CLI's start
    from components.detector.holdout import TuningSplit

logger = logging.getLogger(__name__)

SPLIT_DIR = "tuning_split"  # the tuning split's shards (holdout.py)
WORK_DIR = "tune-work"  # under the pipeline root: searches kept between runs (TuneConfig.work_dir)


@dataclass(frozen=True)
class TuneConfig:
    data_dir: str
    output_dir: str
    trials: int | str = "auto"  # "auto": budget.choose_search decides from the machine and the data
    trial_epochs: int = 0  # 0: budget.trial_epochs_for
    parallel: int = 0  # trials at once, each in its own process; 0: one per GPU (one on a CPU)
    seed: int = TrainConfig.seed
    train: dict = field(default_factory=dict)  # TrainConfig fields of the training tuned (epochs, batch_size, ...)
    start: dict = field(default_factory=dict)  # the first trial's values of SEARCH_SPACE (the rest: DEFAULTS)
    # Where the trials run (vertex_job.choose_backend): here, or a Vertex AI tuning job whose trials
    # run on `trial_machine` (vertex_job.TrialMachine as JSON, set by the compiled pipeline) in `vertex_region`;
    # auto: on Vertex AI when the step runs there (its output on Cloud Storage), else here.
    backend: str = "auto"
    trial_machine: str = ""
    vertex_region: str = ""
    cloud: str = ""  # components.cloud CloudSettings as JSON: the tuning job's labels and key
    gcp_resources: str = ""  # the step's output naming the tuning job (the console links it); "": none
    # A folder kept between runs (the pipeline's: PIPELINE_ROOT/tune-work): the search's split,
    # study and trials go in a subfolder named for the data and these options, so a run killed
    # in its tune step (even by SIGKILL) and run again continues the search there; "": the output folder.
    work_dir: str = ""

    def __post_init__(self):
        object.__setattr__(self, "trials", trials_or_auto(self.trials))

    @property
    def holdout(self) -> float:
        """The share of train held out to score trials: the training's own (`holdout`), so the
        trials and the training's learning curve are scored on the same carve."""
        return self.train.get("holdout", HOLDOUT_FRACTION)


@dataclass
class TuneResult:
    best: BestHparams
    budget: SearchBudget
    trials: list[TrialRecord] = field(default_factory=list)
    split: TuningSplit | None = None
    regime: TrialRegime | None = None
    seconds: float = 0.0

    @property
    def best_score(self) -> float:
        return math.nan if self.best.score is None else self.best.score


def _train_images(data_dir: str) -> int | None:
    """Train records by the data step's manifest (None without one: shards of other converters)."""
    from beam.contract.files import read_manifest

    try:
        return read_manifest(data_dir).written.get("train")
    except Exception:  # no manifest, or one of another version: `auto` then decides on the machine alone
        return None


def _gpus(config: TrainConfig) -> int:
    if config.probe.gpus is not None:
        return config.probe.gpus
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _planned_budget(config: TuneConfig, training: TrainConfig, gpus: int):
    """For a training whose length a time budget decides: what it would plan on this machine
    (trainer.planned_run: its epochs and what the budget could pay for), which decides `auto`
    and the trials' length. None for a training of given epochs, for no search asked, and for
    `auto` on a machine without a GPU (time_budget.CPU_AUTO_IMAGES: no search fits beside the training)."""
    if not training.budgeted or config.trials == 0 or (config.trials == "auto" and not gpus
                                                         and training.time_budget == AUTO):
        return None
    import tempfile

    from components.train.trainer import planned_run

    with tempfile.TemporaryDirectory(prefix="detpipe-tune-plan-") as scratch:
        return planned_run(replace(training, output_dir=scratch, init_from=None))


def tune(config: TuneConfig) -> TuneResult:
    """Decide the budget; without trials write the given values; else carve the tuning split,
    plan the trials, run (or continue) the study, and write its files."""
    from components.tune.tune_report import write_tune_files

    started = time.monotonic()
    out = config.output_dir.rstrip("/")
    os.makedirs(out, exist_ok=True)
    training = TrainConfig(data_dir=config.data_dir, output_dir="", **config.train)
    first = {**DEFAULTS, **config.start}
    gpus = _gpus(training) if config.trials == "auto" or training.budgeted else 0
    planned = _planned_budget(config, training, gpus)
    epochs = planned[0].config.epochs if planned else training.epochs
    affordable = planned[0].length.affordable if planned else None
    from components.detector.holdout_size import held_out_share

    num_train = _train_images(config.data_dir)
    share = held_out_share(config.holdout, num_train) if num_train else config.holdout  # what the carve holds out
    budget = choose_search(config.trials, gpus, num_train, epochs, share, config.trial_epochs, affordable)
    logger.info("tune: %s", budget.reason)
    if not budget.trials:
        result = TuneResult(BestHparams(first, None, None, METRIC, 0, budget.reason), budget)
        write_tune_files(result, out)
        return result

    from components.detector.holdout import TooFewToHoldOut, carve_tuning_split

    work = search_folder(config, budget)
    try:
        split = carve_tuning_split(config.data_dir, f"{work}/{SPLIT_DIR}", config.holdout, config.seed)
    except TooFewToHoldOut as err:  # a search asked for on a handful of images: the given values, and why
        logger.warning("tune: %s", err)
        result = TuneResult(BestHparams(first, None, None, METRIC, 0, f"no search: {err}"),
                            replace(budget, short="too few images to hold out"))
        write_tune_files(result, out)
        return result
    regime = trial_regime(training, split, budget.trial_epochs, planned)
    logger.info("tune: each trial: %s", regime.reason)
    write_plan(work, {"regime": regime.to_dict(), "trials": budget.trials, "seed": config.seed, "first": first})
    from components.tune.vertex_job import choose_backend

    if choose_backend(config.backend, out) == "vertex":
        from components.tune.vertex_job import search_on_vertex

        best, records = search_on_vertex(work, budget, split, regime, first, config.trial_machine, config.vertex_region,
                                         config.parallel, config.seed, config.cloud, config.gcp_resources)
        result, study = TuneResult(best, budget, records, split, regime, round(time.monotonic() - started, 1)), None
    else:
        result, study = _search_here(config, training, work, budget, split, regime, first, started)
    write_tune_files(result, out, study)
    shutil.rmtree(split.folder, ignore_errors=True)  # a copy of the train shards; carved again if ever needed
    return result


def _search_here(config: TuneConfig, training: TrainConfig, work: str, budget: SearchBudget, split, regime,
                 first: dict, started: float):
    """The search on this machine (Optuna's study, continued when a stopped run left one): the
    result and the study."""
    study = open_study(work, regime, first)
    stale = [t._trial_id for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    if stale:
        logger.info("tune: continuing %d trial(s) a stopped run left running", len(stale))
    gpus = _gpus(training)
    parallel = min(budget.trials, config.parallel or max(1, gpus))
    if parallel > 1:
        run_workers(work, parallel, stale, gpus=gpus)
    else:
        run_trials(study, regime, budget.trials, work, stale, stream=config.seed * 1000)
    return summarise(study, budget, split, regime, first, time.monotonic() - started), study


def search_folder(config: TuneConfig, budget: SearchBudget) -> str:
    """Where the search keeps its split, plan, study and trials: the output folder, or a
    subfolder of `work_dir` named for what decides the search (the train shards' bytes, the
    training's options and the search's), the same for the same search in any run."""
    out = config.output_dir.rstrip("/")
    if not config.work_dir:
        return out
    from components.detector.records import shard_files

    import tensorflow as tf

    shards = [(path.rsplit("/", 1)[-1], tf.io.gfile.stat(path).length) for path in shard_files(config.data_dir, "train")]
    try:
        from beam.contract.files import read_manifest

        shards = [(s["name"], s["sha256"]) for s in read_manifest(config.data_dir).shards if s["split"] == "train"]
    except Exception:  # shards of other converters: their names and sizes
        pass
    key = hashlib.sha256(json.dumps(
        {"shards": shards, "train": TrainConfig(data_dir="", output_dir="", **config.train).to_dict(),
         "start": config.start, "trials": budget.trials, "trial_epochs": budget.trial_epochs,
         "holdout": config.holdout, "seed": config.seed}, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = f"{config.work_dir.rstrip('/')}/{key}"
    os.makedirs(folder, exist_ok=True)
    logger.info("tune: the search's study and trials in %s (kept between runs of the same search)", folder)
    return folder


def write_plan(work: str, plan: dict) -> None:
    """The plan the workers (and a resumed run) read; a study made for another regime (this
    machine's batch or precision differ from the one it ran on) is put aside, not continued."""
    path = f"{work}/{PLAN_FILE}"
    if os.path.exists(path) and os.path.exists(f"{work}/{STUDY_FILE}"):
        with open(path) as handle:
            earlier = json.load(handle)
        if earlier != json.loads(json.dumps(plan)):
            os.replace(f"{work}/{STUDY_FILE}", f"{work}/{STUDY_FILE}.{int(time.time())}.other-plan")
            shutil.rmtree(f"{work}/{TRIALS_DIR}", ignore_errors=True)
            logger.warning("tune: the study in %s was made for another plan (another machine?): starting afresh", work)
    with open(path, "w") as handle:
        json.dump(plan, handle, indent=2)


def summarise(study, budget: SearchBudget, split: TuningSplit, regime: TrialRegime, first: dict[str, float],
              seconds: float) -> TuneResult:
    """The winner: the best finished trial, the defaults unless another scored higher."""
    rows = trial_records(study)
    finished = [r for r in rows if r.state == "COMPLETE"]
    if not finished:
        raise RuntimeError("tune: no trial finished: " + "; ".join(f"trial {r.number}: {r.error or r.state}"
                                                                   for r in rows))
    defaults = next((r for r in rows if r.number == 0 and r.state == "COMPLETE"), None)
    best = max(finished, key=lambda r: (r.score, r.number == 0))  # a tie goes to the defaults
    hparams = {**first, **best.hparams} if best.number else dict(first)
    trained = sum(r.steps for r in rows)
    search = search_record(split, budget.trial_epochs, regime, trained, seconds, best.number)
    chosen = BestHparams(hparams, best.score, defaults.score if defaults else None, METRIC, len(rows),
                         budget.reason, search)
    gain = "n/a (the defaults' trial did not finish)" if chosen.gain is None else f"{chosen.gain:+.4f}"
    logger.info("tune: trial %d wins (%s %.4f; over the defaults %s); the search trained %d steps, %.1fx the "
                "training's, in %.0f s", best.number, METRIC, best.score, gain, trained, search["cost"], seconds)
    return TuneResult(chosen, budget, rows, split, regime, round(seconds, 1))
