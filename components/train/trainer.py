"""Train a RetinaNet on the shards: plain function, used by the CLI and the KFP component.

Learning rate scales linearly with the batch from a base rate per 64 images, with
linear warmup and cosine decay; AdamW with gradient clipping. Every chosen value and
the reason for it goes into `train_config.json` and `train_report.md`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import keras
import tensorflow as tf

from components.train.checkpoints import CHECKPOINT_DIR, ChunkCheckpoints, SaveEveryChunk
from components.train.faults import FaultPlan, NonFiniteLoss, RaiseOnNonFiniteLoss, TrainingDiverged
from components.train.input_pipeline import InputConfig, count_records, train_dataset
from components.train.model import ModelConfig, build_detector, count_params
from components.train.schedules import ScaledSchedule

logger = logging.getLogger(__name__)

MODEL_FILE = "model.keras"
CONFIG_FILE = "train_config.json"
HISTORY_FILE = "history.json"
REPORT_FILE = "train_report.md"

# Named model sizes: (backbone filters, blocks per stage, head conv layers).
MODEL_SIZES = {
    "tiny": ((64, 64, 96, 128), (1, 1, 1, 1), 1),
    "small": ((64, 96, 128, 192), (1, 1, 1, 1), 2),
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2), 4),
}


def model_config_for(model_size: str, image_size: int, num_classes: int) -> ModelConfig:
    """The detector config of a named size. Pyramid levels 4-6 with 2x anchors: P3's
    heads would cost most of the compute for little gain at the image sizes used here."""
    if model_size not in MODEL_SIZES:
        raise ValueError(f"--model-size must be one of {', '.join(MODEL_SIZES)}, got {model_size!r}")
    filters, blocks, head_layers = MODEL_SIZES[model_size]
    return ModelConfig(num_classes=num_classes, image_size=image_size, backbone_filters=filters,
                       backbone_blocks=blocks, head_conv_layers=head_layers, min_level=4, max_level=6,
                       anchor_size=2.0)


def build_model_for(model_size: str, image_size: int, num_classes: int):
    return build_detector(model_config_for(model_size, image_size, num_classes))


@dataclass(frozen=True)
class ProbeAdvice:
    """What the probe measured on this machine (components/probe): starting points."""

    safe_batch: int | None = None
    precision: str | None = None  # "mixed_bfloat16" | "mixed_float16" | "float32"
    input_parallelism: int | None = None


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    output_dir: str
    epochs: int = 10
    batch_size: str | int = "auto"
    image_size: int = 128
    model_size: str = "tiny"
    base_lr_per_64: float = 8e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 1e-4
    clipnorm: float = 10.0
    augment: bool = True
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
    batch_size: int
    steps: int
    images_per_second: float
    final_loss: float | None  # None when a resumed run found nothing left to train
    seconds: float
    decisions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _num_classes(data_dir: str) -> dict[str, int]:
    path = Path(data_dir) / "label_map.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {data_dir} the output of `detpipe data build`?")
    return json.loads(path.read_text())


def choose_batch_size(requested: str | int, num_train: int, safe_batch: int | None = None) -> tuple[int, str]:
    """The batch size and why. `auto` takes the probe's largest safe batch on a GPU
    (capped at 64 and the data size), else 16; the trial-step search is issue 5."""
    if requested != "auto":
        size = int(requested)
        if size < 1:
            raise ValueError(f"--batch-size must be >= 1 or 'auto', got {requested}")
        return min(size, num_train), "given on the command line" + (" (capped at the dataset size)" if size > num_train else "")
    if tf.config.list_physical_devices("GPU"):
        if safe_batch:
            return min(safe_batch, 64, num_train), f"auto: the probe's largest safe batch {safe_batch}, capped at 64"
        return min(32, num_train), "auto: 32 on a GPU (the trial-step search is not built yet)"
    return min(16, num_train), "auto: 16 on a CPU, where larger batches only add latency"


def _mixed_precision(advised: str | None = None) -> tuple[str, str]:
    gpus = tf.config.list_physical_devices("GPU")
    if advised and gpus:
        return advised, "as the probe measured on this machine"
    if not gpus:
        return "float32", "no GPU: float32"
    details = tf.config.experimental.get_device_details(gpus[0])
    major = (details.get("compute_capability") or (0, 0))[0]
    if major >= 8:
        return "mixed_bfloat16", f"GPU compute capability {major}.x supports bfloat16"
    if major >= 7:
        return "mixed_float16", f"GPU compute capability {major}.x: float16 with loss scaling"
    return "float32", f"GPU compute capability {major}.x is too old for fast mixed precision"


class _Throughput(keras.callbacks.Callback):
    """Images per second over all steps after the first (which includes tracing)."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        self.started: float | None = None
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.started is None:
            self.started = time.perf_counter()
        else:
            self.steps += 1

    @property
    def images_per_second(self) -> float:
        if self.started is None or not self.steps:
            return 0.0
        return self.steps * self.batch_size / (time.perf_counter() - self.started)


def train_detector(config: TrainConfig) -> TrainResult:
    """Train and save `model.keras`, `history.json`, `train_config.json`, `train_report.md`."""
    started = time.monotonic()
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    label_map = _num_classes(config.data_dir)
    num_train = count_records(config.data_dir, "train")
    if num_train == 0:
        raise ValueError(f"the train split in {config.data_dir} has no records")
    batch_size, batch_reason = choose_batch_size(config.batch_size, num_train, config.probe.safe_batch)
    policy, policy_reason = _mixed_precision(config.probe.precision)
    keras.mixed_precision.set_global_policy(policy)

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

    model_config = model_config_for(config.model_size, config.image_size, len(label_map))
    model = build_detector(model_config)
    model.compile(optimizer=keras.optimizers.AdamW(
        schedule, weight_decay=config.weight_decay, global_clipnorm=config.clipnorm))

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = ChunkCheckpoints(model, str(out / CHECKPOINT_DIR), lr_scale=schedule.scale)
    chunks_done = checkpoints.restore()
    resumed_at = chunks_done * chunk
    if chunks_done == 0:
        checkpoints.save(0)  # the state a NaN in the first chunk goes back to
    decisions = {
        "batch_size": f"{batch_size}: {batch_reason}",
        "learning_rate": f"peak {peak_lr:.2e} = {config.base_lr_per_64:g} per 64 images x {batch_size}/64; "
                         f"linear warmup {warmup} steps, cosine decay to 0 at step {total_steps}",
        "precision": f"{policy}: {policy_reason}",
        "model": f"{config.model_size}: {count_params(model):,} parameters, {config.image_size}px input",
        "checkpoints": f"every {chunk} steps to {out / CHECKPOINT_DIR}"
                       + (f"; resumed after step {resumed_at}" if resumed_at else ""),
    }
    for key, value in decisions.items():
        logger.info("train: %s = %s", key, value)

    throughput = _Throughput(batch_size)
    input_config = InputConfig(
        image_size=config.image_size, batch_size=batch_size, augment=config.augment,
        seed=config.seed, deterministic=config.deterministic, parallelism=config.probe.input_parallelism)
    history, recoveries = _fit_with_recovery(model, schedule, checkpoints, config, input_config,
                                             chunks_done, chunk, num_chunks, throughput)
    if recoveries:
        decisions["recoveries"] = "; ".join(recoveries)
    model.save(out / MODEL_FILE)
    losses = {k: [float(v) for v in vs] for k, vs in history.history.items()}  # {} if nothing was left
    (out / HISTORY_FILE).write_text(json.dumps(losses, indent=2) + "\n")
    result = TrainResult(
        model_path=str(out / MODEL_FILE), num_train=num_train, batch_size=batch_size,
        steps=total_steps,
        images_per_second=round(throughput.images_per_second, 2),
        final_loss=losses["loss"][-1] if losses.get("loss") else None,
        seconds=round(time.monotonic() - started, 1), decisions=decisions)
    (out / CONFIG_FILE).write_text(json.dumps(
        {"model": model_config.to_dict(), "train": asdict(config), "result": result.to_dict(),
         "label_map": label_map}, indent=2, default=str) + "\n")
    (out / REPORT_FILE).write_text(_report(result, losses))
    return result


def _fit_with_recovery(model, schedule: ScaledSchedule, checkpoints: ChunkCheckpoints, config: TrainConfig,
                       input_config: InputConfig, chunks_done: int, chunk: int, num_chunks: int,
                       throughput: "_Throughput") -> tuple[keras.callbacks.History, list[str]]:
    """`model.fit` over the remaining chunks. On a non-finite loss: restore the last
    checkpoint, lower the learning rate and go on, at most `max_nan_recoveries` times."""
    verbose = "auto" if os.isatty(2) else 2
    faults, recoveries = FaultPlan.from_env(), []
    while True:
        first_step = chunks_done * chunk
        data = train_dataset(config.data_dir, replace(input_config, skip_examples=first_step * input_config.batch_size))
        data = faults.poison(data, first_step)
        try:
            history = model.fit(data, epochs=num_chunks, initial_epoch=chunks_done, steps_per_epoch=chunk,
                                callbacks=[throughput, SaveEveryChunk(checkpoints),
                                           RaiseOnNonFiniteLoss(first_step, chunk, chunks_done)], verbose=verbose)
            return history, recoveries
        except NonFiniteLoss as err:
            faults.fired = True
            if len(recoveries) >= config.max_nan_recoveries:
                raise TrainingDiverged(
                    f"{err}; still non-finite after {len(recoveries)} recoveries that lowered the learning rate "
                    f"to {float(schedule.scale.numpy()):g}x. Check the data (rejects.jsonl, box coordinates) "
                    "or lower --base-lr") from err
            lowered = float(schedule.scale.numpy()) * config.nan_lr_factor
            chunks_done = checkpoints.restore()  # also restores the older, higher scale
            schedule.scale.assign(lowered)
            event = (f"{err}: restored the checkpoint after step {chunks_done * chunk}, learning rate scaled "
                     f"to {float(schedule.scale.numpy()):g}x")
            logger.warning("train: %s", event)
            recoveries.append(event)


def _report(result: TrainResult, losses: dict[str, list[float]]) -> str:
    lines = ["# Training report", "", "| decision | value and reason |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result.decisions.items()]
    lines += ["", f"- train images: {result.num_train}", f"- steps: {result.steps}",
              f"- throughput: {result.images_per_second} images/s",
              f"- final loss: {'n/a' if result.final_loss is None else f'{result.final_loss:.4f}'}",
              f"- wall time: {result.seconds} s", "",
              "| chunk | loss |", "|---|---|"]
    lines += [f"| {i + 1} | {v:.4f} |" for i, v in enumerate(losses.get("loss", []))]
    return "\n".join(lines) + "\n"
