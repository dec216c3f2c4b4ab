"""Train a RetinaNet on the shards: plain function, used by the CLI and the KFP component.

Learning rate scales linearly with the batch from a base rate per 64 images, with
linear warmup and cosine decay; AdamW with gradient clipping. Every chosen value and
the reason for it goes into `train_config.json` and `train_report.md`.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from collections.abc import Callable
from pathlib import Path

import keras
import tensorflow as tf

from beam.label_map import num_class_slots, read_dataset_label_map
from components.train.accumulation import next_micro_batches, use_micro_batches
from components.probe.gpu_facts import nvml_facts
from components.train.anchor_check import WARN_SHARE, anchor_coverage
from components.train.batch_search import (CPU_BATCH_CAP, GPU_BATCH_LIMIT, TARGET_FRACTION, cpu_ram_bound,
                                           search_largest_batch, trial_step_fits)
from components.train.artifacts import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    HISTORY_FILE,
    LOSS_CURVE_FILE,
    MODEL_FILE,
    REPORT_FILE,
    TENSORBOARD_DIR,
)
from components.train.checkpoints import ChunkCheckpoints, SaveEveryChunk
from components.train.faults import (FaultPlan, FiniteGuard, InjectOutOfMemory, NonFiniteLoss, OutOfMemory,
                                     RaiseOnNonFinite, TrainingDiverged)
from components.train.input_pipeline import InputConfig, count_records, train_dataset
from components.train.model import build_detector, count_params, model_config_for
from components.train.observe import StepClock, TrainingMonitor, draw_loss_curve
from components.train.precision import precision_for
from components.train.schedules import ScaledSchedule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeAdvice:
    """What the probe measured on this machine (components/probe): starting points."""

    safe_batch: int | None = None
    precision: str | None = None  # "mixed_bfloat16" | "mixed_float16" | "float32"
    input_parallelism: int | None = None

    @classmethod
    def from_probe_file(cls, path: str) -> "ProbeAdvice":
        """The recommendations of a probe.json (`detpipe probe --json`, the probe step's artifact)."""
        with open(path) as handle:
            rec = json.load(handle)["recommendations"]
        return cls(safe_batch=rec.get("largest_safe_batch") or None, precision=rec.get("mixed_precision"),
                   input_parallelism=rec.get("input_parallelism"))


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    output_dir: str
    epochs: int = 10
    batch_size: str | int = "auto"
    image_size: int = 128
    model_size: str = "tiny"
    preset: str | None = None  # KerasHub preset whose pretrained backbone replaces model_size's
    base_lr_per_64: float = 8e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 1e-4
    clipnorm: float = 10.0
    augment: bool = True
    augment_strength: float = 0.25
    flip: bool = True
    cache: str | None = None  # "memory" or a file path: keep encoded records after the first epoch
    seed: int = 0
    deterministic: bool = False
    max_steps: int | None = None  # cap on total steps (smoke tests)
    checkpoint_every: int | None = None  # steps between checkpoints; None: once an epoch
    max_nan_recoveries: int = 3
    nan_lr_factor: float = 0.5  # learning-rate scale after each NaN recovery
    probe: ProbeAdvice = field(default_factory=ProbeAdvice)


@dataclass
class TrainResult:
    model_path: str
    num_train: int
    batch_size: int  # effective batch: images per optimizer step
    micro_batch_size: int  # images per forward/backward pass (smaller after an OOM)
    steps: int
    images_per_second: float
    input_wait_share: float | None  # share of step time waiting for input; None: not measured (--deterministic)
    final_loss: float | None  # None when a resumed run found nothing left to train
    seconds: float
    decisions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def choose_batch_size(requested: str | int, num_train: int, safe_batch: int | None = None,
                      auto: Callable[[], tuple[int, str]] | None = None) -> tuple[int, str]:
    """The batch size and why: as given (capped at the data size), or `auto()`'s choice
    (batch_search.py), capped at the data size."""
    if requested != "auto":
        size = int(requested)
        if size < 1:
            raise ValueError(f"--batch-size must be >= 1 or 'auto', got {requested}")
        return min(size, num_train), "given on the command line" + (" (capped at the dataset size)" if size > num_train else "")
    size, reason = auto() if auto else (min(safe_batch or 16, 64), "auto: the probe's estimate, or 16")
    if size > num_train:
        return num_train, f"{reason}; capped at the dataset size {num_train}"
    return size, reason


def _auto_batch(config: TrainConfig, num_classes: int, replicas: int = 1) -> tuple[int, str]:
    """`--batch-size auto` for this machine: trial steps on a GPU (the batch of one GPU,
    times the number of GPUs), a RAM bound on a CPU."""
    if not tf.config.list_physical_devices("GPU"):
        import psutil

        available = psutil.virtual_memory().available
        bound = cpu_ram_bound(config.model_size, config.image_size, num_classes, available)
        return max(1, min(CPU_BATCH_CAP, bound)), (
            f"auto on a CPU: RAM allows about {bound} images ({TARGET_FRACTION:.0%} of {available / 2**30:.1f} GiB "
            f"available, estimated from the model's layer outputs); capped at {CPU_BATCH_CAP}, since on a CPU "
            "a larger batch adds step time, not throughput")
    start = config.probe.safe_batch or 32
    gpus = nvml_facts().get("gpus") or []
    if not gpus:
        return start, f"auto: {start} from the probe's estimate (NVML did not report the GPU's memory)"
    total = gpus[0]["memory_total"]
    trial_model = build_detector(model_config_for(config.model_size, config.image_size, num_classes, config.preset))
    trial_model.compile(optimizer=keras.optimizers.AdamW(1e-4, global_clipnorm=config.clipnorm))
    try:
        search = search_largest_batch(trial_step_fits(trial_model, config.image_size, int(total * TARGET_FRACTION)),
                                      start=start, limit=GPU_BATCH_LIMIT)
    except Exception as err:  # the search itself failed: fall back to the probe's estimate
        logger.warning("train: batch search failed (%s); using the probe's estimate %d", err, start)
        return start, f"auto: {start} from the probe's estimate (the trial-step search failed: {err})"
    finally:
        del trial_model
        gc.collect()
    if search.batch == 0:
        return replicas, f"auto: not even 1 image fitted in trial steps ({search.describe()}); trying 1 per GPU"
    return search.batch * replicas, (
        f"auto: the largest batch whose trial steps peaked under {TARGET_FRACTION:.0%} of "
        f"{total / 2**30:.1f} GiB GPU memory, starting from the probe's {start} (trials: {search.describe()})"
        + (f", times {replicas} GPUs" if replicas > 1 else ""))


def _distribution() -> tuple[tf.distribute.Strategy, str]:
    """MirroredStrategy over every GPU when there are several, else the default (one device)."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy(), f"MirroredStrategy over {len(gpus)} GPUs, the batch split evenly"
    return tf.distribute.get_strategy(), "one device"


def _mixed_precision(advised: str | None = None) -> tuple[str, str]:
    gpus = tf.config.list_physical_devices("GPU")
    if advised and gpus:
        return advised, "as the probe measured on this machine"
    majors = [(tf.config.experimental.get_device_details(g).get("compute_capability") or (0, 0))[0] for g in gpus]
    return precision_for(majors)


def cluster_workers(environ=os.environ) -> int:
    """Machines in the training cluster that `TF_CONFIG` describes (Vertex AI sets it for
    every replica of a multi-pool custom job); 1 without one."""
    raw = environ.get("TF_CONFIG", "")
    if not raw:
        return 1
    cluster = json.loads(raw).get("cluster", {})
    return sum(len(cluster.get(role, [])) for role in ("chief", "master", "worker")) or 1


def train_detector(config: TrainConfig) -> TrainResult:
    """Train and save `model.keras`, `history.json`, `train_config.json`, `train_report.md`."""
    workers = cluster_workers()
    if workers > 1:
        raise NotImplementedError(
            f"TF_CONFIG names {workers} machines, and multi-worker training (MultiWorkerMirroredStrategy) is not "
            "built yet: compile with --train-replicas 1 (several GPUs on one machine work)")
    started = time.monotonic()
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    label_map = read_dataset_label_map(config.data_dir)
    num_train = count_records(config.data_dir, "train")
    if num_train == 0:
        raise ValueError(f"the train split in {config.data_dir} has no records")
    policy, policy_reason = _mixed_precision(config.probe.precision)
    keras.mixed_precision.set_global_policy(policy)  # before the batch search: trials use it too
    num_classes = num_class_slots(label_map)
    strategy, strategy_reason = _distribution()
    replicas = strategy.num_replicas_in_sync
    batch_size, batch_reason = choose_batch_size(config.batch_size, num_train,
                                                 auto=lambda: _auto_batch(config, num_classes, replicas))
    if batch_size % replicas:  # every replica takes the same share
        batch_size = max(replicas, batch_size - batch_size % replicas)
        batch_reason += f"; rounded to {batch_size}, a multiple of the {replicas} GPUs"

    steps_per_epoch = max(1, num_train // batch_size)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    # Training runs in chunks of `chunk` steps with a checkpoint after each (checkpoints.py);
    # the total is rounded up to whole chunks so the schedule and the checkpoints agree.
    chunk = max(1, min(config.checkpoint_every or steps_per_epoch, total_steps))
    num_chunks = math.ceil(total_steps / chunk)
    total_steps = num_chunks * chunk
    peak_lr = config.base_lr_per_64 * batch_size / 64
    warmup = max(1, int(total_steps * config.warmup_fraction))
    schedule = ScaledSchedule(keras.optimizers.schedules.CosineDecay(
        0.0, max(1, total_steps - warmup), warmup_target=peak_lr, warmup_steps=warmup))

    model_config = model_config_for(config.model_size, config.image_size, num_classes, config.preset)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # The number of parts each batch is split into; more than 1 after an OOM recovery,
    # saved with the checkpoints so a restarted run keeps the smaller micro-batch.
    micro_batches = tf.Variable(1, dtype=tf.int64, trainable=False, name="micro_batches")
    with strategy.scope():  # weights and optimizer state mirrored on every GPU (a no-op on one device)
        model = build_detector(model_config)
        model.compile(optimizer=keras.optimizers.AdamW(
            schedule, weight_decay=config.weight_decay, global_clipnorm=config.clipnorm))
        checkpoints = ChunkCheckpoints(model, str(out / CHECKPOINT_DIR), lr_scale=schedule.scale,
                                       micro_batches=micro_batches)
    chunks_done = checkpoints.restore()
    clock = StepClock(enabled=not config.deterministic)
    faults, guard = FaultPlan.from_env(), FiniteGuard(model)
    faults.poison_loss(model)

    def wrap(train_step):  # every train step: timed, and its updated weights checked for NaN/Inf
        return clock.timed(guard.checked(train_step))

    use_micro_batches(model, int(micro_batches.numpy()), wrap=wrap)
    resumed_at = chunks_done * chunk
    if chunks_done == 0:
        checkpoints.save(0)  # the state a NaN in the first chunk goes back to
    decisions = {
        "batch_size": f"{batch_size}: {batch_reason}",
        "learning_rate": f"peak {peak_lr:.2e} = {config.base_lr_per_64:g} per 64 images x {batch_size}/64; "
                         f"linear warmup {warmup} steps, cosine decay to 0 at step {total_steps}",
        "precision": f"{policy}: {policy_reason}",
        "devices": strategy_reason,
        "model": (f"preset {config.preset} (pretrained backbone, new heads)" if config.preset else config.model_size)
                 + f": {count_params(model):,} parameters, {config.image_size}px input",
        "checkpoints": f"every {chunk} steps to {out / CHECKPOINT_DIR}"
                       + (f"; resumed after step {resumed_at}" if resumed_at else ""),
    }
    coverage = anchor_coverage(model, config.data_dir, config.image_size, records=500)
    decisions["anchors"] = coverage.describe(config.image_size)
    if coverage.share > WARN_SHARE:
        logger.warning("train: %s", decisions["anchors"])
    for key, value in decisions.items():
        logger.info("train: %s = %s", key, value)

    monitor = TrainingMonitor(str(out / TENSORBOARD_DIR), batch_size, clock, chunk)
    input_config = InputConfig(
        image_size=config.image_size, batch_size=batch_size, augment=config.augment,
        augment_strength=config.augment_strength, flip=config.flip, cache=config.cache,
        seed=config.seed, deterministic=config.deterministic, parallelism=config.probe.input_parallelism)
    strength = min(config.augment_strength, 1.0)
    decisions["augmentation"] = (f"strength {strength:g}: {'flips, ' if config.flip else ''}scale jitter "
                                 f"±{40 * strength:.0f}% (zoom in and out, boxes cut away dropped), brightness "
                                 f"±{0.3 * strength:.2g}, contrast ±{40 * strength:.0f}%" if config.augment else "off")
    history, recoveries = _fit_with_recovery(model, schedule, micro_batches, checkpoints, config, input_config,
                                             chunks_done, chunk, num_chunks, monitor, faults, guard, wrap)
    parts = int(micro_batches.numpy())
    micro_batch_size = batch_size // replicas // parts  # images per forward/backward pass on one device
    if parts > 1:
        decisions["micro_batch"] = (f"{micro_batch_size} images x {parts} accumulated parts"
                                    + (f" x {replicas} GPUs" if replicas > 1 else "")
                                    + f" = effective batch {batch_size} (smaller micro-batch after out-of-memory)")
    if recoveries:
        decisions["recoveries"] = "; ".join(recoveries)
    model.save(out / MODEL_FILE)
    losses = {k: [float(v) for v in vs] for k, vs in history.history.items()}  # {} if nothing was left
    (out / HISTORY_FILE).write_text(json.dumps(losses, indent=2) + "\n")
    result = TrainResult(
        model_path=str(out / MODEL_FILE), num_train=num_train, batch_size=batch_size,
        micro_batch_size=micro_batch_size, steps=total_steps,
        images_per_second=round(monitor.images_per_second, 2),
        input_wait_share=None if monitor.input_wait_share is None else round(monitor.input_wait_share, 3),
        final_loss=losses["loss"][-1] if losses.get("loss") else None,
        seconds=round(time.monotonic() - started, 1), decisions=decisions)
    (out / CONFIG_FILE).write_text(json.dumps(
        {"model": model_config.to_dict(), "train": asdict(config), "result": result.to_dict(),
         "label_map": label_map}, indent=2, default=str) + "\n")
    has_curve = draw_loss_curve(monitor.step_losses, out / LOSS_CURVE_FILE)
    (out / REPORT_FILE).write_text(_report(result, losses, has_curve))
    return result


def _fit_with_recovery(model, schedule: ScaledSchedule, micro_batches: tf.Variable, checkpoints: ChunkCheckpoints,
                       config: TrainConfig, input_config: InputConfig, chunks_done: int, chunk: int, num_chunks: int,
                       monitor: TrainingMonitor, faults: FaultPlan, guard: FiniteGuard,
                       wrap: Callable) -> tuple[keras.callbacks.History, list[str]]:
    """`model.fit` over the remaining chunks, recovering from faults from the last checkpoint:
    - a non-finite loss or update lowers the learning rate, at most `max_nan_recoveries` times;
    - out of memory halves the micro-batch and accumulates gradients to keep the batch,
      until a micro-batch of one image does not fit."""
    verbose = "auto" if os.isatty(2) else 2
    recoveries, nan_recoveries = [], 0
    batch = input_config.batch_size
    per_replica = batch // model.distribute_strategy.num_replicas_in_sync
    recovery_state = (schedule.scale, micro_batches)  # what a recovery changes; a restore keeps it
    while True:
        first_step = chunks_done * chunk
        data = train_dataset(config.data_dir, replace(input_config, skip_examples=first_step * batch))
        step = RaiseOnNonFinite(guard, chunk, chunks_done)
        try:
            history = model.fit(data, epochs=num_chunks, initial_epoch=chunks_done, steps_per_epoch=chunk,
                                callbacks=[monitor, SaveEveryChunk(checkpoints), step,
                                           InjectOutOfMemory(faults, chunk, chunks_done)], verbose=verbose)
            return history, recoveries
        except NonFiniteLoss as err:
            faults.mark_fired()
            if nan_recoveries >= config.max_nan_recoveries:
                raise TrainingDiverged(
                    f"{err}; still non-finite after {nan_recoveries} recoveries that lowered the learning rate "
                    f"to {float(schedule.scale.numpy()):g}x. Check the data (rejects.jsonl, box coordinates) "
                    "or lower --base-lr") from err
            chunks_done = checkpoints.restore(keep=recovery_state)
            schedule.scale.assign(schedule.scale * config.nan_lr_factor)
            nan_recoveries += 1
            event = (f"{err}: restored the checkpoint after step {chunks_done * chunk}, learning rate scaled "
                     f"to {float(schedule.scale.numpy()):g}x")
        except tf.errors.ResourceExhaustedError as err:
            parts = int(micro_batches.numpy())
            more = next_micro_batches(per_replica, parts)
            if more is None:
                raise OutOfMemory(
                    f"out of memory at step {step.step} even with a micro-batch of 1 image: use a smaller "
                    "--image-size or --model-size, or a GPU with more memory") from err
            chunks_done = checkpoints.restore(keep=recovery_state)
            micro_batches.assign(more)
            use_micro_batches(model, more, wrap=wrap)
            event = (f"out of memory at step {step.step}: micro-batch {per_replica // parts} -> "
                     f"{per_replica // more} images{' per GPU' if per_replica != batch else ''}, {more} accumulated "
                     f"parts per step keep the effective batch at {batch}; "
                     f"restored the checkpoint after step {chunks_done * chunk}")
        logger.warning("train: %s", event)
        recoveries.append(event)


def _report(result: TrainResult, losses: dict[str, list[float]], has_curve: bool) -> str:
    lines = ["# Training report", "", "| decision | value and reason |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result.decisions.items()]
    lines += ["", f"- train images: {result.num_train}", f"- steps: {result.steps}",
              f"- effective batch: {result.batch_size} images per step; micro-batch: {result.micro_batch_size}",
              f"- throughput: {result.images_per_second} images/s; " + (
                  "input wait not measured (--deterministic forbids timestamps in the step)"
                  if result.input_wait_share is None else
                  f"{100 * result.input_wait_share:.1f}% of step time waiting for input"),
              f"- final loss: {'n/a' if result.final_loss is None else f'{result.final_loss:.4f}'}",
              f"- wall time: {result.seconds} s",
              f"- TensorBoard: `tensorboard --logdir {Path(result.model_path).parent / TENSORBOARD_DIR}`", "",
              *([f"![training loss]({LOSS_CURVE_FILE})", ""] if has_curve else []),
              "| chunk | loss |", "|---|---|"]
    lines += [f"| {i + 1} | {v:.4f} |" for i, v in enumerate(losses.get("loss", []))]
    return "\n".join(lines) + "\n"
