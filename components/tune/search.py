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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from components.train.config import TrainConfig
from components.tune.budget import HOLDOUT_FRACTION, SearchBudget, choose_search, trials_or_auto
from components.tune.hparams_file import DEFAULTS, SEARCH_SPACE, BestHparams

if TYPE_CHECKING:  # the holdout module imports Beam's file systems: not at the CLI's start
    from components.tune.holdout import TuningSplit

logger = logging.getLogger(__name__)

STUDY_FILE = "study.journal"  # Optuna's journal: every trial's parameters, rung scores and state
SPLIT_DIR = "tuning_split"  # the tuning split's shards (holdout.py)
PLAN_FILE = "search_plan.json"  # the trial regime, for the worker processes
TRIALS_DIR = "trials"
WORK_DIR = "tune-work"  # under the pipeline root: searches kept between runs (TuneConfig.work_dir)
METRIC = "mAP@[.5:.95] on the tuning split"
REDUCTION = 3  # the pruner keeps the best third at each rung; a trial's first rung is a third of it


@dataclass(frozen=True)
class TuneConfig:
    data_dir: str
    output_dir: str
    trials: int | str = "auto"  # "auto": budget.choose_search decides from the machine and the data
    trial_epochs: int = 0  # 0: budget.trial_epochs_for
    holdout: float = HOLDOUT_FRACTION  # the share of train held out to score trials
    parallel: int = 0  # trials at once, each in its own process; 0: one per GPU (one on a CPU)
    seed: int = TrainConfig.seed
    train: dict = field(default_factory=dict)  # TrainConfig fields of the training tuned (epochs, batch_size, ...)
    start: dict = field(default_factory=dict)  # the first trial's values of SEARCH_SPACE (the rest: DEFAULTS)
    # Where the trials run (vertex_job.choose_backend): here, or a Vertex AI tuning job whose trials
    # run on `trial_machine` (vertex_job.TrialMachine as JSON, set by the compiled pipeline) in `region`.
    backend: str = "local"
    trial_machine: str = ""
    region: str = ""
    # A folder kept between runs (the pipeline's: PIPELINE_ROOT/tune-work): the search's split,
    # study and trials go in a subfolder named for the data and these options, so a run killed
    # in its tune step (even by SIGKILL) and run again continues the search there; "": the output folder.
    work_dir: str = ""

    def __post_init__(self):
        object.__setattr__(self, "trials", trials_or_auto(self.trials))


@dataclass(frozen=True)
class TrialRegime:
    """How every trial trains: the real training's batch, size and precision on the fit part."""

    base: TrainConfig  # data_dir: the tuning split; checkpoint_every: one rung
    stops: tuple[int, ...]  # the steps a trial is scored at (the last is its end)
    planned_steps: int  # the training tuned: its steps, to compare the search's cost with
    batch_size: int
    reason: str

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), "stops": list(self.stops), "planned_steps": self.planned_steps,
                "batch_size": self.batch_size, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict) -> "TrialRegime":
        return cls(TrainConfig.from_dict(data["base"]), tuple(data["stops"]), data["planned_steps"],
                   data["batch_size"], data["reason"])


@dataclass
class TrialRecord:
    """One row of trials.jsonl."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL (RUNNING: stopped, continued by the next run)
    hparams: dict[str, float]
    score: float | None  # at its last scored step
    rungs: dict[str, float]  # step -> mAP on the tuning split
    steps: int  # steps trained
    seconds: float
    error: str | None = None


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


class SearchStopped(RuntimeError):
    """A SIGTERM stopped the search; the running trials checkpointed. Run the same command to go on."""


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


def tune(config: TuneConfig) -> TuneResult:
    """Decide the budget; without trials write the given values; else carve the tuning split,
    plan the trials, run (or continue) the study, and write its files."""
    from components.tune.tune_report import write_tune_files

    started = time.monotonic()
    out = config.output_dir.rstrip("/")
    os.makedirs(out, exist_ok=True)
    training = TrainConfig(data_dir=config.data_dir, output_dir="", **config.train)
    first = {**DEFAULTS, **config.start}
    budget = choose_search(config.trials, _gpus(training) if config.trials == "auto" else 0,
                           _train_images(config.data_dir), training.epochs, config.holdout, config.trial_epochs)
    logger.info("tune: %s", budget.reason)
    if not budget.trials:
        result = TuneResult(BestHparams(first, None, None, METRIC, 0, budget.reason), budget)
        write_tune_files(result, out)
        return result

    from components.tune.holdout import TooFewToHoldOut, carve_tuning_split

    work = search_folder(config, budget)
    try:
        split = carve_tuning_split(config.data_dir, f"{work}/{SPLIT_DIR}", config.holdout, config.seed)
    except TooFewToHoldOut as err:  # a search asked for on a handful of images: the given values, and why
        logger.warning("tune: %s", err)
        result = TuneResult(BestHparams(first, None, None, METRIC, 0, f"no search: {err}"), budget)
        write_tune_files(result, out)
        return result
    regime = trial_regime(training, split, budget.trial_epochs)
    logger.info("tune: %s", regime.reason)
    write_plan(work, {"regime": regime.to_dict(), "trials": budget.trials, "seed": config.seed, "first": first})
    from components.tune.vertex_job import choose_backend

    if choose_backend(config.backend, out) == "vertex":
        result = search_on_vertex(config, work, budget, split, regime, first, started)
        write_tune_files(result, out)
        return result
    study = open_study(work, regime, first)
    stale = [t._trial_id for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    if stale:
        logger.info("tune: continuing %d trial(s) a stopped run left running", len(stale))
    parallel = min(budget.trials, config.parallel or max(1, _gpus(training)))
    if parallel > 1:
        run_workers(work, parallel, stale, gpus=_gpus(training))
    else:
        run_trials(study, regime, budget.trials, work, stale, stream=config.seed * 1000)
    result = summarise(study, budget, split, regime, first, time.monotonic() - started)
    write_tune_files(result, out, study)
    return result


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


def trial_regime(training: TrainConfig, split: TuningSplit, trial_epochs: int) -> TrialRegime:
    """The real training's plan on this machine, and the trials' config from it."""
    from components.train.trainer import plan_training, planned_run

    with tempfile.TemporaryDirectory(prefix="detpipe-tune-plan-") as scratch:
        facts, plan = planned_run(replace(training, output_dir=scratch, init_from=None))
    base = replace(facts.config, data_dir=split.folder, output_dir="", epochs=trial_epochs,
                   batch_size=plan.machine_batch, precision=plan.precision, max_steps=0, checkpoint_every=0,
                   stop_after_steps=0, init_from=None, init_name="", init_champion=False, fine_tune_epochs=0,
                   init_note="a tuning trial starts from scratch")
    trial = plan_training(base, replace(facts.machine, auto_batch=None), split.fit * facts.windows_per_photo)
    rung = max(1, math.ceil(trial.total_steps / REDUCTION))
    base = replace(base, checkpoint_every=rung)
    total = math.ceil(trial.total_steps / rung) * rung
    stops = (rung, total) if total > rung else (total,)
    reason = (f"each trial: {trial_epochs} epoch(s) of the {split.fit} fit images at batch {plan.machine_batch}, "
              f"{base.image_size} px, {plan.precision} (the training's own), {total} steps with the training's "
              f"warmup and cosine decay; scored on the {split.held_out} held-out images at step "
              + " and ".join(str(s) for s in stops) + f"; the training tuned: {plan.total_steps} steps")
    return TrialRegime(base, stops, plan.total_steps, plan.machine_batch, reason)


def open_study(out: str, regime: TrialRegime, first: dict[str, float]):
    """The study in OUT's journal, created with the defaults as its first trial, or as left."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own log lines say what each trial did
    storage = JournalStorage(JournalFileBackend(f"{out}/{STUDY_FILE}"))
    study = optuna.create_study(
        study_name="detpipe-tune", storage=storage, direction="maximize", load_if_exists=True,
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=regime.stops[0], reduction_factor=REDUCTION,
                                                      min_early_stopping_rate=0))
    if not study.get_trials(deepcopy=False):
        study.enqueue_trial(first)
    return study


def _ask(study, stream: int):
    """A new trial, sampled with a seed fixed by the seed, the worker's stream and how many
    trials the study holds: the same search proposes the same values whether or not it was
    stopped on the way, and a continued one never the values of a trial it already ran (which
    one sampler seeded once per process would, started again)."""
    import optuna

    begun = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=stream * 10_000 + begun,
                                               multivariate=True, n_startup_trials=4)
    return study.ask()


def _started(study) -> int:
    """Trials begun (running, or finished in any state), the enqueued defaults not yet begun aside."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name != "WAITING")


def run_trials(study, regime: TrialRegime, trials: int, out: str, resume: list[int] = (), stream: int = 0) -> None:
    """Continue the trials `resume` names (their ids), then ask for new ones until `trials` began.
    `stream`: the seed's stream this process samples from (`_ask`; a worker of a parallel
    search has its own, else they would propose the same values)."""
    import optuna

    for trial_id in resume:
        run_trial(study, optuna.trial.Trial(study, trial_id), regime, out)
    while _started(study) < trials:
        run_trial(study, _ask(study, stream), regime, out)


def run_trial(study, trial, regime: TrialRegime, out: str) -> None:
    """`score_trial`, then its checkpoints and model removed: the journal holds what it found."""
    score_trial(study, trial, regime, out)
    shutil.rmtree(f"{out}/{TRIALS_DIR}/{trial.number:03d}", ignore_errors=True)


def train_rungs(regime: TrialRegime, model_dir: str, hparams: dict[str, float], done: dict[int, float],
                on_score: Callable[[int, float], bool]) -> float:
    """Train one trial rung by rung (each continuing from the checkpoint before it) and score
    every rung on the held-out images; a rung in `done` (scored before a stop) is not trained
    again. `on_score(step, score)` returns True to stop there (pruned). Returns the last score."""
    from components.evaluate.evaluator import split_metrics
    from components.train.trainer import train_detector

    score = math.nan
    for stop in regime.stops:
        if stop in done:
            score = done[stop]
            continue
        train_detector(replace(regime.base, output_dir=model_dir, stop_after_steps=stop, **hparams))
        score = split_metrics(model_dir, regime.base.data_dir)["mAP"]
        if on_score(stop, score):
            break
    return score


def score_trial(study, trial, regime: TrialRegime, out: str) -> None:
    """Run one Optuna trial (`train_rungs`, continuing it where a stop left it): report each
    rung, prune (never the defaults) or finish; a failure is recorded and the search goes on;
    a SIGTERM (`Preempted`) is not recorded: the trial stays running, for the next run to continue."""
    from optuna.trial import TrialState

    from components.train.trainer import Preempted

    hparams = {name: trial.suggest_float(name, low, high, log=log) for name, (low, high, log) in SEARCH_SPACE.items()}
    stored = study._storage.get_trial(trial._trial_id)  # what a stopped run of this trial recorded
    spent = {"seconds": float(stored.user_attrs.get("seconds", 0.0)), "since": time.monotonic()}
    logger.info("tune: trial %d %s", trial.number, _shown(hparams))

    def on_score(step: int, score: float) -> bool:
        now = time.monotonic()
        spent["seconds"] += now - spent["since"]
        spent["since"] = now
        trial.set_user_attr("seconds", round(spent["seconds"], 1))
        trial.report(score, step)
        logger.info("tune: trial %d at step %d: %s %.4f", trial.number, step, METRIC, score)
        return step != regime.stops[-1] and trial.number > 0 and trial.should_prune()

    try:
        score = train_rungs(regime, f"{out}/{TRIALS_DIR}/{trial.number:03d}/model", hparams,
                            dict(stored.intermediate_values), on_score)
        if not math.isfinite(score):
            raise ValueError(f"the score is {score}")
    except Preempted:
        raise
    except Exception as err:  # a diverged or failed trial must not end the search
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        trial.set_user_attr("error", f"{type(err).__name__}: {first}")
        study.tell(trial, state=TrialState.FAIL)
        logger.warning("tune: trial %d failed: %s", trial.number, err)
        return
    last = max(study._storage.get_trial(trial._trial_id).intermediate_values, default=0)
    if last != regime.stops[-1]:
        study.tell(trial, state=TrialState.PRUNED)
        logger.info("tune: trial %d pruned at step %d", trial.number, last)
    else:
        study.tell(trial, score)


def _shown(hparams: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in hparams.items())


def run_workers(out: str, parallel: int, stale: list[int], gpus: int) -> None:
    """`parallel` worker processes (worker.py) over the one journal, each on its own GPU; the
    stale trials shared out among them. A SIGTERM is passed on to every worker; the search
    stops (SearchStopped) when one of them was stopped."""
    from components.train.trainer import PREEMPTED_EXIT_CODE

    env = dict(os.environ)
    procs = []
    for index in range(parallel):
        if gpus:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        mine = ",".join(str(t) for t in stale[index::parallel])
        procs.append(subprocess.Popen([sys.executable, "-m", "components.tune.worker", out, str(index + 1), mine],
                                      env=env))
    logger.info("tune: %d trials at once, one process each", parallel)
    previous = signal.signal(signal.SIGTERM, lambda *_: [p.send_signal(signal.SIGTERM) for p in procs])
    try:
        codes = [p.wait() for p in procs]
    finally:
        signal.signal(signal.SIGTERM, previous)
    if PREEMPTED_EXIT_CODE in codes or -signal.SIGTERM in codes:
        raise SearchStopped("SIGTERM: the running trials checkpointed; run the same command again to continue the "
                            "search")
    if any(codes):
        raise RuntimeError(f"tune: a trial worker exited with {max(codes, key=abs)} (its log is above)")


def search_on_vertex(config: TuneConfig, out: str, budget: SearchBudget, split: TuningSplit, regime: TrialRegime,
                     first: dict[str, float], started: float) -> TuneResult:
    """The trials but the defaults as a Vertex AI tuning job (vertex_job.py), the defaults
    trained here meanwhile (this step runs on the training machine; Vizier has no way to be
    given a first trial), the winner the best of them."""
    from components.tune import vertex_job as vj

    if not config.trial_machine or not config.region:
        raise ValueError("tune_backend vertex needs the trials' machine and region (the compiled pipeline gives both: "
                         "run it on Vertex AI, or use tune_backend local)")
    machine = vj.TrialMachine.from_json(config.trial_machine)
    parallel = config.parallel or vj.DEFAULT_PARALLEL
    job = vj.submit(vj.tuning_job(vj.fuse_path(f"{out}/{PLAN_FILE}"), vj.fuse_path(f"{out}/vertex_trials"), machine,
                                  budget.trials - 1, parallel, config.region, seed=config.seed), out, machine.spot)
    logger.info("tune: the defaults train here while Vertex AI runs %d trial(s), %d at once", budget.trials - 1,
                parallel)
    defaults = train_rungs(regime, f"{out}/{TRIALS_DIR}/defaults/model", first, {}, lambda step, score: False)
    job.wait()
    hparams, score, rows = vj.best_of(job.trials)
    records = [TrialRecord(0, "COMPLETE", dict(first), defaults, {}, regime.stops[-1], 0.0)] + [
        TrialRecord(r["number"], r["state"], r["hparams"], r["score"], {}, regime.stops[-1], 0.0, r["error"])
        for r in rows]
    better = score > defaults
    chosen = BestHparams({**first, **hparams} if better else dict(first), max(score, defaults), defaults, METRIC,
                         len(records), budget.reason,
                         {"tuning_split": split.to_dict(), "trial_epochs": budget.trial_epochs,
                          "trial_steps": list(regime.stops), "batch_size": regime.batch_size, "regime": regime.reason,
                          "space": {k: list(v) for k, v in SEARCH_SPACE.items()}, "backend": "vertex",
                          "job": job.resource_name, "parallel": parallel,
                          "steps_trained": regime.stops[-1] * len(records), "training_steps": regime.planned_steps,
                          "cost": round(regime.stops[-1] * len(records) / max(1, regime.planned_steps), 2),
                          "seconds": round(time.monotonic() - started, 1),
                          "best_trial": next(r.number for r in records[1:] if r.hparams == hparams) if better else 0})
    return TuneResult(chosen, budget, records, split, regime, round(time.monotonic() - started, 1))


def vertex_trial(plan_path: str, output: str, hparams: dict[str, float]) -> float:
    """One trial of a Vertex AI tuning job (`detpipe tune-trial`): the plan's regime with
    these values, every rung's score reported to the service (cloudml-hypertune), in a folder
    of its own under OUTPUT (Vertex's trial id), so a restarted trial resumes from its checkpoints."""
    import hypertune

    from components.tune.vertex_job import METRIC_ID

    with open(plan_path) as handle:
        regime = TrialRegime.from_dict(json.load(handle)["regime"])
    reporter = hypertune.HyperTune()

    def report(step: int, score: float) -> bool:
        logger.info("tune-trial: step %d: %s %.4f", step, METRIC, score)
        reporter.report_hyperparameter_tuning_metric(hyperparameter_metric_tag=METRIC_ID, metric_value=score,
                                                     global_step=step)
        return False  # the service's stopping rule ends a poor trial

    trial = os.environ.get("CLOUD_ML_TRIAL_ID", "0")
    return train_rungs(regime, f"{output.rstrip('/')}/trial-{trial}/model", {**DEFAULTS, **hparams}, {}, report)


def trial_records(study) -> list[TrialRecord]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "WAITING":
            continue
        rungs = {str(step): value for step, value in sorted(t.intermediate_values.items())}
        rows.append(TrialRecord(t.number, t.state.name, dict(t.params),
                                t.value if t.value is not None else (list(rungs.values())[-1] if rungs else None),
                                rungs, max(t.intermediate_values, default=0), float(t.user_attrs.get("seconds", 0.0)),
                                t.user_attrs.get("error")))
    return rows


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
    search = {"tuning_split": split.to_dict(), "trial_epochs": budget.trial_epochs, "trial_steps": list(regime.stops),
              "batch_size": regime.batch_size, "regime": regime.reason, "space": {k: list(v) for k, v in
                                                                                SEARCH_SPACE.items()},
              "steps_trained": trained, "training_steps": regime.planned_steps,
              "cost": round(trained / max(1, regime.planned_steps), 2), "seconds": round(seconds, 1),
              "best_trial": best.number}
    chosen = BestHparams(hparams, best.score, defaults.score if defaults else None, METRIC, len(rows),
                         budget.reason, search)
    gain = "n/a (the defaults' trial did not finish)" if chosen.gain is None else f"{chosen.gain:+.4f}"
    logger.info("tune: trial %d wins (%s %.4f; over the defaults %s); the search trained %d steps, %.1fx the "
                "training's, in %.0f s", best.number, METRIC, best.score, gain, trained, search["cost"], seconds)
    return TuneResult(chosen, budget, rows, split, regime, round(seconds, 1))
