"""The training plan: every number the trainer uses, each with its reason, decided by a
pure function of the config, the machine and the data (no TensorFlow).

Batch: `--batch-size N` is images per step on one machine (split over its GPUs); with
several workers the global batch is that times the workers. `auto` is measured per
machine (batch_search.py) and multiplied the same way. The learning rate scales linearly
with the global batch from a base rate per 64 images, with linear warmup and cosine decay.

Example:
    >>> plan = plan_training(TrainConfig("data", "out", epochs=2, batch_size=8),
    ...                      MachineFacts(workers=2, strategy="MultiWorkerMirroredStrategy, 2 workers"),
    ...                      num_train=100)
    >>> plan.batch_size, plan.steps_per_epoch, plan.decisions["devices"]
    (16, 6, 'MultiWorkerMirroredStrategy, 2 workers, global batch 16')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from components.detector.box_losses import BOX_LOSSES
from components.detector.precision import choose_precision, choose_xla
from components.train.augment_settings import run_strength
from components.train.config import TrainConfig
from components.train.time_budget import RunLength


@dataclass(frozen=True)
class MachineFacts:
    """Where the training runs, as the trainer found it."""

    local_replicas: int = 1  # devices of this machine in the strategy
    workers: int = 1  # machines in the cluster (TF_CONFIG)
    gpu_majors: tuple[int, ...] = ()  # CUDA compute capability majors of this machine's GPUs
    strategy: str = "one device"  # how the strategy describes itself (distribution.py)
    auto_batch: tuple[int, str] | None = None  # `--batch-size auto` measured on this machine, and why

    @property
    def replicas(self) -> int:
        return self.local_replicas * self.workers


@dataclass(frozen=True)
class TrainPlan:
    batch_size: int  # global: images per optimizer step across every replica
    machine_batch: int  # images per step on one machine
    replicas: int
    workers: int
    precision: str
    xla: bool  # the train step compiled with XLA
    steps_per_epoch: int
    total_steps: int  # a whole number of chunks
    chunk: int  # steps between checkpoints
    peak_lr: float
    warmup_steps: int
    augment_strength: float  # the run's, from --augment-strength and its epochs (augment_settings.run_strength)
    ema_momentum: float = 0.99  # of the weights' moving average (used when config.ema)
    decisions: dict[str, str] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return self.total_steps // self.chunk


def choose_batch_size(requested: str | int, num_train: int, safe_batch: int | None = None,
                      auto: tuple[int, str] | None = None) -> tuple[int, str]:
    """Images per step on one machine and why: as given (capped at the data size), or the
    measured `auto` choice (batch_search.py; the probe's estimate, or 16, without one),
    capped at the data size."""
    if requested != "auto":
        size = requested
        return min(size, num_train), "given on the command line" + (" (capped at the dataset size)" if size > num_train else "")
    size, reason = auto or (min(safe_batch or 16, 64), "auto: the probe's estimate, or 16")
    if size > num_train:
        return num_train, f"{reason}; capped at the dataset size {num_train}"
    return size, reason


# A from-scratch run with fewer optimizer steps than this learns less from the same images:
# on raccoon (157 train images, 30 epochs) batch 16 gives 270 steps and AP50 0.71-0.75, batch
# 4 gives 1,170 and 0.79-0.85 in 1.2x the CPU time; batch 2 (2,340) 0.75 (docs/training.md, issue 24).
# The demo's 8 epochs at 16 are 1,040 steps. So `--batch-size auto` takes at most the
# largest power of two that keeps this many steps, and never fewer than MIN_AUTO_BATCH images
# (batch norm's statistics get noisy below that).
MIN_TOTAL_STEPS = 1000
MIN_AUTO_BATCH = 4


def steps_bound(batch: int, num_train: int, epochs: int) -> tuple[int, str]:
    """`batch` (the auto batch) lowered, if needed, so that `epochs` over `num_train` images
    make at least MIN_TOTAL_STEPS steps; the reason is empty when nothing changed.

    >>> steps_bound(16, 2080, 8)
    (16, '')
    >>> steps_bound(16, 157, 30)[0], steps_bound(512, 20000, 10)[0], steps_bound(16, 157, 2)[0]
    (4, 128, 4)
    """
    images = num_train * epochs
    bound = max(MIN_AUTO_BATCH, 2 ** int(math.log2(max(1, images // MIN_TOTAL_STEPS))))
    if batch <= bound:
        return batch, ""
    return bound, (f"; lowered to {bound} so that {epochs} epochs of {num_train} images make "
                   f"{num_train // bound * epochs} steps (a run of fewer than {MIN_TOTAL_STEPS} steps learns less from "
                   f"the same images; at least {MIN_AUTO_BATCH} images a step)")


EMA_WINDOW_SHARE = 0.1  # the share of a from-scratch run the weight average spans (below)


def ema_momentum(total_steps: int, share: float = EMA_WINDOW_SHARE) -> tuple[float, str]:
    """The moving average's momentum for a run of `total_steps`, and why: it averages over
    about `share` of the run (a tenth: at least 10 steps, at most 2,000), so a short run's
    average is not dominated by its untrained start and a long run's follows its end.

    >>> ema_momentum(1040)[0], ema_momentum(156, 0.5)[0]
    (0.9904, 0.9872)
    """
    window = min(2000, max(10, round(total_steps * share)))
    momentum = round(1.0 - 1.0 / window, 4)
    return momentum, (f"momentum {momentum:g}: the weights evaluated and exported are an exponential moving "
                      f"average over about the last {window} of {total_steps} steps")


# A warm start (warm_start.py) continues a trained model: fewer passes, a lower peak and a
# short warmup. Chosen on real photos (benchmarks/warm_start.py on raccoon, 10 epochs from
# scratch, seeds 0-4; docs/promotion.md, "Warm starts"); each number with what it beat:
# - Epochs, 40% of --epochs: at 15% (2 of 10) a retrain on unchanged data lost AP75 on average
#   (-0.021, seeds 0-2) and one with 20% new images fell below a retrain from scratch in 2
#   seeds of 3; at 40% both gained, for about half the from-scratch CPU time (0.44-0.48 mean).
#   How much of the data is new decides whether to warm-start at all (warm_start.MAX_NEW_SHARE),
#   not the length: with a third of the images new, 40% fell short of a retrain from scratch
#   at either peak measured (0.25x, 0.1x).
# - Peak learning rate, 0.15x the from-scratch peak (the champion's schedule ended at 0):
#   mean mAP on unchanged data / with 20% new images 0.247 / 0.236 against 0.243 / 0.228 at
#   0.25x and 0.232 / 0.246 at 0.1x (0.1x lost AP75 on unchanged data, -0.007); 0.5x (seeds
#   0-2) scored 0.226 / 0.224. A retrain from scratch scored 0.232 / 0.218.
# - The weight average starts from the champion's weights (the optimizer is built on them)
#   and spans a tenth of the run, as from scratch: spanning half (the champion's weights then
#   still ~14% of it at the end) scored the same (0.243 / 0.226 against 0.241 / 0.226, seeds 0-2).
FINE_TUNE_EPOCH_SHARE = 0.4
FINE_TUNE_LR_SHARE = 0.15
FINE_TUNE_WARMUP_FRACTION = 0.02
FINE_TUNE_EMA_SHARE = EMA_WINDOW_SHARE


def fine_tune_share(warm_start: bool) -> float:
    """The share of a from-scratch run's epochs a run takes at most: FINE_TUNE_EPOCH_SHARE for a
    warm start (it continues a trained model), all of them from scratch."""
    return FINE_TUNE_EPOCH_SHARE if warm_start else 1.0


def fine_tune_epochs(config: TrainConfig) -> tuple[int, str]:
    """Epochs of a warm-started run, and why.

    >>> [fine_tune_epochs(TrainConfig("data", "out", epochs=n))[0] for n in (1, 8, 10, 30)]
    [1, 3, 4, 12]
    """
    if config.fine_tune_epochs:
        return config.fine_tune_epochs, "given with --fine-tune-epochs"
    epochs = max(1, math.floor(config.epochs * FINE_TUNE_EPOCH_SHARE + 0.5))
    return epochs, (f"{FINE_TUNE_EPOCH_SHARE:.0%} of --epochs {config.epochs}, rounded (at least 1): a warm start "
                    "continues a trained model, which needs fewer passes than training from scratch")


def auto_batch_ceiling(limit: int, num_train: int, epochs: int, devices: int, fine_tune: bool = False) -> int:
    """The most images per device (GPU) a `--batch-size auto` run can keep after
    `steps_bound` (a from-scratch run; `fine_tune`, a warm start, has no floor), at most
    `limit`: the GPU batch search need not try more (each trial step is start-up time, and a
    trial at 512 for a run that will take 4 is wasted).

    >>> auto_batch_ceiling(512, 157, 30, 1), auto_batch_ceiling(512, 20000, 10, 1), auto_batch_ceiling(512, 20000, 10, 8)
    (4, 128, 16)
    >>> auto_batch_ceiling(512, 10**6, 100, 1), auto_batch_ceiling(512, 157, 30, 8), auto_batch_ceiling(512, 157, 30, 1, True)
    (512, 1, 512)
    """
    if fine_tune:
        return limit
    return max(1, steps_bound(limit * devices, num_train, epochs)[0] // devices)


def _epochs(config: TrainConfig, fine_tune: bool, length: RunLength | None) -> tuple[int, str]:
    """The epochs to train and why: what a time budget bought, or those given (fewer for a
    warm start)."""
    if length is not None:
        return length.epochs, length.reason
    if config.budgeted and not (fine_tune and config.fine_tune_epochs):
        raise ValueError("epochs 0 (a time budget) needs the run length the budget bought (trainer.gather_facts)")
    return fine_tune_epochs(config) if fine_tune else (config.epochs, "given")


def plan_training(config: TrainConfig, machine: MachineFacts, num_train: int, fine_tune: bool = False,
                  length: RunLength | None = None) -> TrainPlan:
    """Every number of the run and its reason; `fine_tune` (a warm start) trains fewer
    epochs with a lower peak learning rate and a shorter warmup; `length`: the epochs a time
    budget bought (time_budget.py), instead of `config.epochs`."""
    if num_train < 1:
        raise ValueError("the train split has no records")
    precision, precision_reason = choose_precision(config.precision, config.probe.precision, machine.gpu_majors)
    xla, xla_reason = choose_xla(config.xla, machine.gpu_majors, machine.replicas, config.deterministic)
    per_machine_data = max(1, num_train // machine.workers)
    machine_batch, batch_reason = choose_batch_size(config.batch_size, per_machine_data, config.probe.safe_batch,
                                                    machine.auto_batch)
    epochs, epochs_reason = _epochs(config, fine_tune, length)
    if config.batch_size == "auto" and not fine_tune:  # a warm start continues a trained model: no need
        bounded, bound_reason = steps_bound(machine_batch * machine.workers, num_train, epochs)
        machine_batch = max(machine.local_replicas, bounded // machine.workers)
        batch_reason += bound_reason
    local = machine.local_replicas
    if machine_batch % local:  # every device takes the same share
        machine_batch = max(local, machine_batch - machine_batch % local)
        batch_reason += f"; rounded to {machine_batch}, a multiple of the {local} GPUs"
    batch = machine_batch * machine.workers
    if machine.workers > 1:
        batch_reason += f"; {machine_batch} per machine x {machine.workers} workers"

    steps_per_epoch = max(1, num_train // batch)
    total = steps_per_epoch * epochs
    if config.max_steps:
        total = min(total, config.max_steps)
    # Training runs in chunks of `chunk` steps with a checkpoint after each (checkpoints.py);
    # the total is rounded up to whole chunks so the schedule and the checkpoints agree.
    chunk = max(1, min(config.checkpoint_every or steps_per_epoch, total))
    total = math.ceil(total / chunk) * chunk
    lr_share = (config.fine_tune_lr_share or FINE_TUNE_LR_SHARE) if fine_tune else 1.0
    given = " given with --fine-tune-lr-share" if config.fine_tune_lr_share else ""
    peak_lr = config.base_lr_per_64 * batch / 64 * lr_share
    warmup = max(1, int(total * (FINE_TUNE_WARMUP_FRACTION if fine_tune else config.warmup_fraction)))
    momentum, ema_reason = ema_momentum(total, FINE_TUNE_EMA_SHARE if fine_tune else EMA_WINDOW_SHARE)
    strength, strength_reason = run_strength(config.augment_strength, epochs)
    decisions = {
        "batch_size": f"{batch}: {batch_reason}",
        "epochs": f"{epochs}: {epochs_reason}; {steps_per_epoch} steps each",
        "learning_rate": f"peak {peak_lr:.2e} = {config.base_lr_per_64:g} per 64 images x {batch}/64"
                         + (f" x {lr_share:g} (fine-tuning{given}: a trained model needs smaller steps)"
                            if fine_tune else "")
                         + f"; linear warmup {warmup} steps"
                         + (" (short: the weights are trained already)" if fine_tune else "")
                         + f", cosine decay to 0 at step {total}",
        "precision": f"{precision}: {precision_reason}",
        "xla": xla_reason,
        "weight_average": ema_reason if config.ema else "off: the last step's weights are evaluated and exported",
        "box_loss": f"{config.box_loss}: {BOX_LOSSES[config.box_loss]}",
        "augmentation": f"strength {strength:g}: {strength_reason}",
        "devices": machine.strategy + (f", global batch {batch}" if machine.replicas > 1 else ""),
    }
    return TrainPlan(batch_size=batch, machine_batch=machine_batch, replicas=machine.replicas,
                     workers=machine.workers, precision=precision, xla=xla, steps_per_epoch=steps_per_epoch,
                     total_steps=total, chunk=chunk, peak_lr=peak_lr, warmup_steps=warmup, ema_momentum=momentum,
                     augment_strength=strength, decisions=decisions)
