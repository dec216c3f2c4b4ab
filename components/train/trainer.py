"""Train a RetinaNet on the shards: plain function, used by the CLI and the KFP component.

`train_detector` gathers the facts (where it runs, the data), lets `plan.plan_training`
decide every number with its reason, builds the model under the strategy
(distribution.py), runs `loop.fit_with_recovery` and writes the outputs: `model.keras`,
`history.json`, `train_config.json`, `train_report.md` (train_report.py), the loss curve,
TensorBoard logs and checkpoints. Under several workers only the chief writes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import keras
import tensorflow as tf

from beam.contract.label_map import num_class_slots, read_dataset_label_map
from beam.contract.train_keys import copy_train_keys
from components.detector.artifacts import (CHECKPOINT_DIR, LOSS_CURVE_FILE, MODEL_FILE, REPORT_FILE, TENSORBOARD_DIR,
                                           HistoryFile, TrainConfigFile)
from components.detector.fitted_shape import FittedShape, shape_for_sample
from components.detector.holdout import TooFewToHoldOut, TuningSplit, carve_tuning_split
from components.detector.holdout_size import HOLDOUT_MAX_IMAGES
from components.detector.losses import AveragedAdamW, compile_detector, finite_on_every_replica, use_weight_average
from components.detector.model import build_detector, count_params
from components.detector.precision import choose_precision, choose_xla
from components.detector.records import count_records, read_box_sample
from components.detector.shard_check import check_shards, naming_bad_records
from components.detector.tile_choice import windows_per_photo
from components.train.accumulation import use_micro_batches
from components.train.afforded_size import budget_shape
from components.train.augment_settings import MOSAIC_IMAGES, MOSAIC_SCALE, ORIENTATION_WHAT
from components.train.batch_search import GPU_BATCH_LIMIT, measure_auto_batch
from components.train.checkpoints import StepCheckpoints
from components.train.config import ProbeAdvice, TrainConfig
from components.train.curve import STOP_BUDGET, CurvePlan, LearningCurve
from components.train.distribution import (ClusterRole, agreement, cluster_role, fit_across_workers, make_strategy,
                                           synchronise_batch_norm, vector_logs, weights_digest)
from components.train.faults import FaultPlan, FiniteGuard
from components.train.input_pipeline import InputConfig, finishing, on_accelerator, shuffle_buffer_for
from components.train.loop import (PREEMPTED_EXIT_CODE, LoopParts, Preempted, StopRequest, StoppedAtChunk,
                                   fit_with_recovery)
from components.train.mosaic import boxes_per_image, clean_from, takes_mosaic
from components.train.observe import StepClock, TrainingMonitor, draw_loss_curve
from components.train.plan import (MachineFacts, TrainPlan, auto_batch_ceiling, choose_batch_size,
                                   fine_tune_share, plan_training)
from components.train.run_length import budget_length, keep_length
from components.train.refit_choice import REFIT_NOTE
from components.train.stopped_short import SHORT_OF_PLATEAU, short_line
from components.train.time_budget import (END_RESERVE_SECONDS, SCORE_SHARE, SMOOTHED_SCORES, RunLength, epoch_cap,
                                          patience_epochs, score_every)
from components.train.process_state import training_state
from components.train.schedules import ScaledSchedule, WarmupCosine
from components.train.train_report import training_report
from components.train.warm_start import WarmStart, apply_warm_weights, choose_warm_start, warm_weights
from components.train.xla import xla_step

# What callers outside the train step use (the tuner, the label review's folds): the
# function, its config and result, the plan it makes, how a SIGTERM ends it and how its
# chunk-end hook stops it.
__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "StoppedAtChunk", "ProbeAdvice", "TrainConfig", "TrainResult",
           "plan_training", "planned_run", "train_detector"]

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model_path: str
    num_train: int
    batch_size: int  # effective (global) batch: images per optimizer step
    micro_batch_size: int  # images per forward/backward pass on one device (smaller after an OOM)
    steps: int
    images_per_second: float
    input_wait_share: float | None  # share of step time waiting for input; None: not measured (--deterministic)
    final_loss: float | None  # None when a resumed run found nothing left to train
    seconds: float
    weights_sha256: str = ""  # of the final weights: the same on every worker
    stopped: str = ""  # why training ended: its epochs, its budget, or a plateau of the held-out curve (curve.py)
    # A budget ended it while the held-out curve still rose: one line with what would reach the
    # plateau (stopped_short.py); "" otherwise.
    short: str = ""
    epochs: float = 0.0  # epochs trained (of the train split, or of its fit part when budgeted)
    best_step: int = 0  # the step whose weights (their average) are the model; 0: the last step's
    shape: dict = field(default_factory=dict)  # the fitted input size, levels, anchors, coverage (FittedShape.metadata)
    warm_start: dict = field(default_factory=dict)  # WarmStart.to_dict(): where training started from, and why
    decisions: dict[str, str] = field(default_factory=dict)
    # This process is the chief: only it writes the job's outputs, and only it may finish
    # them (export, reports); another replica's job ends when training ends.
    is_chief: bool = True
    held_out: int = 0  # train images the curve was scored on (a budgeted run's carve); 0: none
    budget_seconds: float = 0.0  # the time budget a budgeted run was given (0: epochs were given)
    refit: str = ""  # the model is a second training's on the whole split (refit.py): what it trained; "": none
    afforded_size: int = 0  # the input size the budget afforded above the fitted one (afforded_size.py); 0: none

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def length_line(self) -> str:
        """How long it trained and why it stopped, one line: `24 epochs (744 steps), stopped: plateau: ...`
        (and `; short of its plateau` when the budget ended a rising curve: `short` says more)."""
        return (f"{self.epochs:g} epoch{'' if self.epochs == 1 else 's'} ({self.steps} steps), stopped: {self.stopped}"
                + (f"; {REFIT_NOTE} ({self.refit})" if self.refit else "") + (f"; {SHORT_OF_PLATEAU}" if self.short else ""))


def _machine_facts(role: ClusterRole, strategy: tf.distribute.Strategy, description: str) -> MachineFacts:
    gpus = tf.config.list_physical_devices("GPU")
    majors = tuple((tf.config.experimental.get_device_details(g).get("compute_capability") or (0, 0))[0]
                   for g in gpus)
    return MachineFacts(local_replicas=strategy.num_replicas_in_sync // role.workers, workers=role.workers,
                        gpu_majors=majors, strategy=description)


@dataclass(frozen=True)
class RunFacts:
    """What training found before planning: the data, the shape fitted to its boxes, the
    machine, and the run's config with `image_size` resolved to the fitted number."""

    config: TrainConfig
    label_map: dict[str, int]
    num_train: int
    shape: FittedShape
    machine: MachineFacts  # with the measured auto batch when `--batch-size auto`
    warm: WarmStart  # where training starts from (warm_start.py)
    warm_weights: list | None = None  # the source's weights (numpy, model.weights order) when warm.used
    windows_per_photo: int = 1  # a tiled model: training windows of each photo per epoch (a median photo's tiles)
    # A budgeted run (no --epochs): the epochs its budget bought, and the train split carved into
    # the part it trains on and the part its curve is scored on (holdout.py). None: all of train.
    length: RunLength | None = None
    held_out: TuningSplit | None = None

    @property
    def boxes_per_image(self) -> int:
        """The most boxes a training image holds (mosaic.boxes_per_image): four photos' in a mosaic."""
        return boxes_per_image(self.shape.densest_image_boxes, self.mosaic)

    @property
    def mosaic(self) -> bool:
        """Whether training takes mosaics (mosaic.takes_mosaic)."""
        return takes_mosaic(self.config.mosaic, self.shape.model.tiled)

    @property
    def fine_tune_share(self) -> float:
        """The share of a from-scratch run's epochs this run may take (a warm start's is smaller)."""
        return fine_tune_share(self.warm.used)

    @property
    def fit_dir(self) -> str:
        """The shards training reads: the fit part of a budgeted run's carve, else the data."""
        return self.held_out.folder if self.held_out else self.config.data_dir

    @property
    def examples_per_epoch(self) -> int:
        """What an epoch trains on: each photo, or each photo's windows when tiled."""
        return self.num_train * self.windows_per_photo


@dataclass
class BuiltRun:
    """The model and everything the fit loop drives, built under the strategy."""

    parts: LoopParts
    input_config: InputConfig
    steps_done: int  # restored from a checkpoint; 0 for a fresh run
    monitor: TrainingMonitor
    write_dir: Path  # the chief's output folder, or this worker's scratch


HELD_OUT_DIR = "held_out"  # a budgeted run's carve of train: `train-*` it trains on, `val-*` its curve's images

# `train_detector`'s chunk-end hook: the global step, the live model, its train_config.json record.
RunHook = Callable[[int, keras.Model, TrainConfigFile], bool]


def train_detector(config: TrainConfig, at_chunk_end: RunHook | None = None) -> TrainResult:
    """Train and save `model.keras`, `history.json`, `train_config.json`, `train_report.md`.
    `at_chunk_end(step, model, record)`: called after each chunk's checkpoint with the live
    model and what `train_config.json` will say of it; True stops training there
    (`StoppedAtChunk`, nothing saved but the checkpoints): a tuning trial scores its rungs so.

    Phases: facts (data, fitted shape, machine, measured batch), plan (plan.plan_training:
    pure, every number with its reason), build, fit (loop.fit_with_recovery), report. The
    process-wide TensorFlow state (seeds, determinism, precision policy) is set once around
    them and restored afterwards, also after a failure (process_state.py)."""
    started = time.monotonic()
    role, strategy, machine, precision = _where(config)
    try:  # a read error of the shards (a damaged record) stops with the record and its shard named
        with naming_bad_records(config.data_dir), training_state(config.seed, config.deterministic, precision):
            agree = agreement(strategy, role.workers)
            facts, plan = _facts_and_plan(config, machine, role, lambda: time.monotonic() - started, agree)
            built = build_run(facts, plan, role, strategy)
            end = min(plan.total_steps, config.stop_after_steps or plan.total_steps)
            watch = curve_plan(facts, plan, end, started if not built.steps_done else 0.0)
            decisions = _decisions(plan, facts, built.parts.model, Path(config.output_dir), built.steps_done, watch)
            for key, value in decisions.items():
                (logger.warning if "WARNING" in value else logger.info)("train: %s = %s", key, value)
            record = _config_record(facts, result={})
            curve = LearningCurve(watch, lambda: record, built.monitor.writer, agree,
                                  schedule=built.parts.schedule.base,
                                  on_length=lambda epochs, why: _keep_corrected(facts, role, epochs, why))
            hook = (lambda step, model: at_chunk_end(step, model, record)) if at_chunk_end else None
            losses, recoveries = fit_with_recovery(built.parts, replace(facts.config, data_dir=facts.fit_dir),
                                                   built.input_config, built.steps_done, plan.chunk, end, hook, curve)
            return finish_run(facts, plan, built, role, decisions, losses, recoveries, started, curve)
    finally:
        role.clean_up(config.output_dir)


def planned_run(config: TrainConfig) -> tuple[RunFacts, TrainPlan]:
    """What `train_detector(config)` would decide on this machine (the fitted shape, the
    measured batch, the plan), without building the model or training: the tuner's trials
    train at this batch and input size."""
    started = time.monotonic()
    role, strategy, machine, precision = _where(config)
    with naming_bad_records(config.data_dir), training_state(config.seed, config.deterministic, precision):
        return _facts_and_plan(config, machine, role, lambda: time.monotonic() - started,
                               agreement(strategy, role.workers))


def _where(config: TrainConfig) -> tuple[ClusterRole, tf.distribute.Strategy, MachineFacts, str]:
    """This process's role, the strategy over its devices, the machine's facts and the precision."""
    role = cluster_role()
    strategy, description = make_strategy(role)  # first: several workers must set up collectives before other work
    machine = _machine_facts(role, strategy, description)
    precision, _ = choose_precision(config.precision, config.probe.precision, machine.gpu_majors)
    return role, strategy, machine, precision


def _facts_and_plan(config: TrainConfig, machine: MachineFacts, role: ClusterRole, spent: Callable[[], float],
                    agree: Callable[[list[float]], list[float]]) -> tuple[RunFacts, TrainPlan]:
    facts = gather_facts(config, machine, role, spent, agree)
    plan = plan_training(facts.config, facts.machine, facts.examples_per_epoch, facts.warm.used, facts.length)
    if role.is_chief and facts.length is not None:
        keep_length(facts.length, str(Path(config.output_dir) / CHECKPOINT_DIR))
    return facts, plan


def gather_facts(config: TrainConfig, machine: MachineFacts, role: ClusterRole = ClusterRole(),
                 spent: Callable[[], float] = lambda: 0.0,
                 agree: Callable[[list[float]], list[float]] = lambda values: values) -> RunFacts:
    """The label map and train count, the input size (for "auto"), pyramid levels and
    anchors fitted to the train boxes (refuses with PoorAnchors when too few boxes could
    match an anchor), whether training starts from `config.init_from` (then with its shape
    and weights), for a budgeted run (no --epochs) the held-out carve and the epochs the
    budget buys here, and on `--batch-size auto` the batch measured on this machine."""
    label_map = read_dataset_label_map(config.data_dir)
    check_shards(config.data_dir, config.verify_shards)  # a damaged record named now, not hours in
    num_train = count_records(config.data_dir, "train")
    if num_train == 0:
        raise ValueError(f"the train split in {config.data_dir} has no records")
    held_out = None
    if config.budgeted:  # the curve's images, held out of training: written once, kept for a resumed run
        try:
            held_out = carve_tuning_split(config.data_dir, f"{role.write_dir(config.output_dir)}/{HELD_OUT_DIR}",
                                          config.holdout, config.seed)
            num_train = held_out.fit
        except TooFewToHoldOut as err:  # a handful of images: trained on all of them, no curve to watch
            logger.warning("train: no held-out curve: %s", err)
    sample = read_box_sample(config.data_dir, label_map=label_map)
    fresh = shape_for_sample(sample, config.model_size, num_class_slots(label_map), config.image_size,
                             on_gpu=bool(machine.gpu_majors), preset=config.preset,
                             allow_poor_anchors=config.allow_poor_anchors, tile=config.tile)
    warm, shape = choose_warm_start(config, label_map, sample, fresh)
    logger.info("train: starts %s", warm.line())
    windows = windows_per_photo(sample, shape.model.tiling) if shape.model.tiled else 1
    boxes = boxes_per_image(sample.densest_image_boxes, takes_mosaic(config.mosaic, shape.model.tiled))
    resolved = replace(config, image_size=shape.model.image_size)  # from here on the size is a number
    length = None
    if config.budgeted:
        guess, _ = choose_batch_size(config.batch_size, num_train * windows, config.probe.safe_batch)
        length = budget_length(resolved, shape.model, num_train * windows, max(1, guess // machine.local_replicas),
                               boxes, machine.replicas, bool(machine.gpu_majors), spent,
                               fine_tune_share(warm.used), agree,
                               str(Path(config.output_dir) / CHECKPOINT_DIR))
        shape, length = budget_shape(config, sample, num_class_slots(label_map), shape, length, held_out, warm.used,
                                     machine.workers, bool(machine.gpu_majors))
        # from here on the epochs are a number
        resolved = replace(resolved, image_size=shape.model.image_size, epochs=length.epochs)
    measured = machine
    if config.batch_size == "auto":
        # A from-scratch run's batch is bounded by its steps (plan.steps_bound): search no higher.
        limit = auto_batch_ceiling(GPU_BATCH_LIMIT, num_train * windows, resolved.epochs,
                                   machine.workers * machine.local_replicas, fine_tune=warm.used)
        # The trials compile as training will (XLA or not): memory differs between the two.
        xla, _ = choose_xla(config.xla, machine.gpu_majors, machine.replicas, config.deterministic)
        measured = replace(machine, auto_batch=measure_auto_batch(resolved, shape.model, machine.local_replicas,
                                                                  boxes, limit, xla))
    return RunFacts(resolved, label_map, num_train, shape, measured, warm,
                    warm_weights(warm) if warm.used else None, windows, length, held_out)


def _keep_corrected(facts: RunFacts, role: ClusterRole, epochs: int, why: str) -> None:
    """The budget's corrected length, kept for a run resumed from a checkpoint (the chief's)."""
    if role.is_chief and facts.length is not None:
        keep_length(replace(facts.length, epochs=epochs, reason=f"{facts.length.reason}; corrected: {why}"),
                    str(Path(facts.config.output_dir) / CHECKPOINT_DIR))


def curve_plan(facts: RunFacts, plan: TrainPlan, end: int, started: float) -> CurvePlan:
    """What the run's curve watches: for a budgeted run the held-out images, how often they are
    scored (time_budget.score_every), the patience and the budget's deadline (`started`: when
    the step began; 0: none, as for a run resumed from a checkpoint, which ends at its planned steps)."""
    held, length = facts.held_out, facts.length
    if length is None:
        return CurvePlan(plan.steps_per_epoch, end_step=end)
    deadline = started + length.seconds - END_RESERVE_SECONDS if started and length.seconds else 0.0
    every = score_every(held.held_out, facts.examples_per_epoch, length.images_per_second) if held else 1
    patience, _ = patience_epochs(facts.config.patience, length.epochs)
    return CurvePlan(plan.steps_per_epoch, held.folder if held else "", held.held_out if held else 0, every,
                     patience if held else 0, deadline, budgeted=True, end_step=end,
                     examples_per_epoch=facts.examples_per_epoch, chunk=plan.chunk,
                     warmup_share=plan.warmup_steps / plan.total_steps,
                     max_epochs=length.cap or epoch_cap(facts.fine_tune_share),
                     max_step=plan.total_steps if facts.config.max_steps else 0)


def build_run(facts: RunFacts, plan: TrainPlan, role: ClusterRole, strategy: tf.distribute.Strategy) -> BuiltRun:
    """The model, optimizer and checkpoints under the strategy (restored when a checkpoint
    exists), the input config, and each train step wrapped: timed, checked for NaN/Inf and
    carrying the stop flag."""
    config = facts.config
    out = Path(config.output_dir)
    write_dir = Path(role.write_dir(config.output_dir))
    write_dir.mkdir(parents=True, exist_ok=True)
    schedule = ScaledSchedule(WarmupCosine(plan.peak_lr, plan.warmup_steps, plan.total_steps))
    # The number of parts each batch is split into; more than 1 after an OOM recovery,
    # saved with the checkpoints so a restarted run keeps the smaller micro-batch.
    micro_batches = tf.Variable(1, dtype=tf.int64, trainable=False, name="micro_batches")
    with strategy.scope():  # weights and optimizer state mirrored on every device (a no-op on one)
        model = build_detector(facts.shape.model)
        if facts.warm.used:  # before the optimizer is built: the weight average starts from these weights
            apply_warm_weights(model, facts.warm_weights, facts.warm, facts.label_map)
        compile_detector(model, AveragedAdamW(schedule, weight_decay=config.weight_decay,
                                              global_clipnorm=config.clipnorm, use_ema=config.ema,
                                              ema_momentum=plan.ema_momentum), config.box_loss)
        finite_on_every_replica(model)
        checkpoints = StepCheckpoints(model, str(out / CHECKPOINT_DIR), str(write_dir / CHECKPOINT_DIR),
                                      lr_scale=schedule.scale, micro_batches=micro_batches, **schedule.base.variables)
    steps_done = checkpoints.restore()
    input_config = InputConfig(
        image_size=config.image_size, batch_size=plan.batch_size, augment=config.augment,
        augment_strength=plan.augment_strength, flip=config.flip, cache=config.cache,
        seed=config.seed, deterministic=config.deterministic, parallelism=config.probe.input_parallelism,
        finish_in_step=on_accelerator() or plan.xla,
        workers=role.workers, worker_index=role.index,
        box_floor=facts.boxes_per_image if plan.xla else 0,
        orientations=config.orientations,
        tiled=facts.shape.model.tiled, windows_per_photo=facts.windows_per_photo,
        shuffle_buffer=shuffle_buffer_for(config.data_dir))
    multi_worker = role.workers > 1  # make_strategy chose MultiWorkerMirroredStrategy
    if multi_worker:
        fit_across_workers(model)
        synchronise_batch_norm(model)
    clock, stop = StepClock(enabled=not config.deterministic), StopRequest()
    faults, guard = FaultPlan.from_env(), FiniteGuard(model)
    faults.poison_loss(model)

    def wrap(train_step):  # every train step: timed, checked for NaN/Inf, carrying the stop flag; XLA inside,
        # on a GPU or under XLA finishing the batch's augmentation first (input_pipeline.finishing)
        inner = finishing(train_step) if input_config.finish_in_step else train_step
        wrapped = clock.timed(guard.checked(stop.reported(xla_step(inner, plan.xla))))
        return vector_logs(wrapped) if multi_worker else wrapped

    use_micro_batches(model, int(micro_batches.numpy()), wrap=wrap)
    if steps_done == 0:
        checkpoints.save(0)  # the state a NaN in the first chunk goes back to
    monitor = TrainingMonitor(str(write_dir / TENSORBOARD_DIR), plan.batch_size, clock)
    parts = LoopParts(model=model, schedule=schedule, micro_batches=micro_batches, checkpoints=checkpoints,
                      monitor=monitor, faults=faults, guard=guard, stop=stop, wrap=wrap, multi_worker=multi_worker)
    return BuiltRun(parts, input_config, steps_done, monitor, write_dir)


def finish_run(facts: RunFacts, plan: TrainPlan, built: BuiltRun, role: ClusterRole, decisions: dict[str, str],
               losses: dict[str, list[float]], recoveries: list[str], started: float,
               curve: LearningCurve) -> TrainResult:
    """The weight average put in place, the model saved, the result; on the chief also the
    history, `train_config.json`, the loss curve and `train_report.md`."""
    model, out = built.parts.model, Path(facts.config.output_dir)
    pieces = int(built.parts.micro_batches.numpy())
    micro_batch_size = plan.batch_size // plan.replicas // pieces  # images per forward/backward pass on one device
    decisions = dict(decisions)
    if pieces > 1:
        decisions["micro_batch"] = (f"{micro_batch_size} images x {pieces} accumulated parts"
                                    + (f" x {plan.replicas} GPUs" if plan.replicas > 1 else "")
                                    + f" = effective batch {plan.batch_size} (smaller micro-batch after out-of-memory)")
    if recoveries:
        decisions["recoveries"] = "; ".join(recoveries)
    synchronise_batch_norm(model, on=False)
    use_weight_average(model)  # the moving average is the model (with --ema)
    stop, history = curve.finish()
    state = curve.state
    if state.best_weights is not None and state.best_step != history.columns["step"][-1]:
        model.set_weights(state.best_weights)  # a later point scored worse: the best point's weights are the model
    if state.corrected:
        decisions["epochs"] += f"; corrected after the first steps: {state.corrected}"
    decisions["stopped"] = stop + (f"; kept the weights of step {state.best_step} (held-out mAP "
                                   f"{state.best_score:.4f})" if state.best_weights is not None else "")
    monitor = built.monitor
    short = _short_of_plateau(facts, plan, curve, history, stop, monitor.images_per_second)
    if short:
        decisions["stopped_short"] = short
        logger.warning("train: %s", short)
    model.save(built.write_dir / MODEL_FILE)  # every worker saves (it may read synchronised variables); only the chief's stays
    digest = weights_digest(model)
    logger.info("train: %s final weights sha256 %s", role.name, digest)
    result = TrainResult(
        model_path=str(out / MODEL_FILE), num_train=facts.num_train, batch_size=plan.batch_size,
        micro_batch_size=micro_batch_size, steps=state.stop_step or curve.plan.end_step, stopped=stop, short=short,
        epochs=round((state.stop_step or curve.plan.end_step) / plan.steps_per_epoch, 2),
        best_step=state.best_step if state.best_weights is not None else 0,
        images_per_second=round(monitor.images_per_second, 2),
        input_wait_share=None if monitor.input_wait_share is None else round(monitor.input_wait_share, 3),
        final_loss=losses["loss"][-1] if losses.get("loss") else None,  # no losses: nothing was left to train
        seconds=round(time.monotonic() - started, 1), weights_sha256=digest, decisions=decisions,
        shape=facts.shape.metadata(), warm_start=facts.warm.to_dict(), is_chief=role.is_chief,
        held_out=facts.held_out.held_out if facts.held_out else 0,
        budget_seconds=facts.length.seconds if facts.length else 0.0,
        afforded_size=facts.length.image_size if facts.length else 0)
    if role.is_chief:
        history.write(out)
        _config_record(facts, result=result.to_dict()).write(out)
        has_curve = draw_loss_curve(monitor.step_losses, out / LOSS_CURVE_FILE, history, plan.steps_per_epoch)
        (out / REPORT_FILE).write_text(training_report(result, losses, has_curve))
        copy_train_keys(facts.config.data_dir, str(out))  # kept with the model: what a warm start from it compares with
    if facts.held_out is not None:  # a copy of the train shards, kept only for a resumed run: not in the model's folder
        tf.io.gfile.rmtree(facts.held_out.folder)
    return result


def _short_of_plateau(facts: RunFacts, plan: TrainPlan, curve: LearningCurve, history: HistoryFile, stop: str,
                      images_per_second: float) -> str:
    """The stopped-short line of a budgeted run that its budget ended while its held-out curve still
    rose ("" otherwise): the epochs to the plateau at this run's pace (an epoch's images at the rate
    trained, plus the held-out scores' share)."""
    if facts.length is None or not stop.startswith(STOP_BUDGET) or images_per_second <= 0:
        return ""
    scored = [(step / plan.steps_per_epoch, value) for step, value in history.scored()]
    per_epoch = facts.examples_per_epoch / images_per_second * (1 + SCORE_SHARE)
    return short_line(scored, curve.plan.plateau_epochs, per_epoch, images_per_second,
                      epoch_cap(facts.fine_tune_share), curve.plan.score_every, facts.length.seconds)


def _config_record(facts: RunFacts, result: dict) -> TrainConfigFile:
    """What train_config.json says of this run: the model's shape, the config, `result` (empty
    while training runs) and the label map."""
    return TrainConfigFile(model=facts.shape.model.to_dict(), train=asdict(facts.config), result=result,
                           label_map=facts.label_map)


def _decisions(plan: TrainPlan, facts: RunFacts, model: keras.Model, out: Path, steps_done: int,
               watch: CurvePlan) -> dict[str, str]:
    """The plan's and the shape fit's decisions plus what only the built model tells."""
    config, shape, warm = facts.config, facts.shape, facts.warm
    decisions = {"warm_start": warm.line() + (f" (resumed from this run's own checkpoint at step {steps_done})"
                                              if warm.used and steps_done else ""),
                 **shape.decisions, **plan.decisions}
    fitted = shape.model
    width = f"; FPN {fitted.fpn_filters} wide, {fitted.head_conv_layers} conv layer(s) per head" if not config.preset else ""
    decisions["model"] = ((f"preset {config.preset} (pretrained backbone, new heads)" if config.preset
                           else config.model_size) + f": {count_params(model):,} parameters, {config.image_size}px input"
                          + width)
    if watch.held_out_dir:
        _, patience_why = patience_epochs(config.patience, config.epochs)
        decisions["held_out_curve"] = (
            f"{watch.held_out} train images held out ({facts.held_out.fraction:.0%} by the split's hash rule, at most "
            f"{HOLDOUT_MAX_IMAGES}; never val), scored every {watch.score_every} epoch(s); training is on the other "
            f"{facts.num_train}; "
            + (f"stops after {watch.plateau_epochs} epochs without a better score, the curve smoothed over "
               f"{SMOOTHED_SCORES} scores (patience {patience_why}); " if watch.plateau_epochs
               else "patience 0: no early stop; ")
            + "the best point's weights are kept")
    elif facts.length is not None:
        decisions["held_out_curve"] = (f"off: too few train images to hold out {config.holdout:.0%} of them: every "
                                       "epoch on the whole train split, the last weights kept")
    else:
        decisions["held_out_curve"] = "off: --epochs given: every epoch on the whole train split, the last weights kept"
    decisions["checkpoints"] = (f"every {plan.chunk} steps to {out / CHECKPOINT_DIR}"
                                + (f"; resumed after step {steps_done}" if steps_done else ""))
    strength = plan.augment_strength
    decisions["augmentation"] = (f"{plan.decisions['augmentation']}; {'flips, ' if config.flip else ''}scale jitter "
                                 f"±{40 * strength:.0f}% (zoom in and out, boxes cut away dropped), brightness "
                                 f"±{0.3 * strength:.2g}, contrast ±{40 * strength:.0f}%"
                                 + ("" if config.orientations == "upright" else
                                    f"; turned: {config.orientations} ({ORIENTATION_WHAT[config.orientations]})")
                                 + (f"; mosaic of {MOSAIC_IMAGES} until step {clean_from(plan.total_steps)} of "
                                    f"{plan.total_steps}, zoom ±{MOSAIC_SCALE:.0%}"
                                    if facts.mosaic else "")
                                 if config.augment else "off")
    return decisions
