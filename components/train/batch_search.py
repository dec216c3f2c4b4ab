"""`--batch-size auto`: the largest batch that fits, found with real trial steps.

On a GPU: train steps on synthetic batches of the real model, size and precision,
doubling from the probe's estimate, then bisection, then one verifying step; a batch
"fits" when the step runs without ResourceExhaustedError and its peak memory stays under
`TARGET_FRACTION` of the GPU's memory. The trial model is thrown away afterwards.
On a CPU: a RAM-based bound from the memory estimate (the model's layer outputs and the
anchor matching of the densest image's boxes: components/detector/memory_estimate.py),
capped at `CPU_BATCH_CAP`; no trial steps, which would cost more time than they save.
Always capped at the dataset size.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from components.train.config import TrainConfig

logger = logging.getLogger(__name__)

TARGET_FRACTION = 0.85  # of accelerator memory (or available RAM) a batch may use at its peak
GPU_BATCH_LIMIT = 512  # no search above this: larger batches need other learning-rate rules
CPU_BATCH_CAP = 16  # on a CPU a larger batch adds step time, not throughput


@dataclass
class BatchSearch:
    """The outcome of a search: the largest batch that fitted and every trial, in order."""

    batch: int
    trials: list[tuple[int, bool]] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{b} {'fits' if ok else 'too big'}" for b, ok in self.trials)


def search_largest_batch(fits: Callable[[int], bool], start: int, limit: int, multiple: int = 8) -> BatchSearch:
    """The largest batch in [1, limit] for which `fits` is true, assuming that a batch that
    fits means every smaller one fits. Doubles from `start`, bisects to within ~6%
    (preferring multiples of `multiple`), then verifies the answer with one more trial and
    halves while that fails. Returns batch 0 when not even 1 fits."""
    result = BatchSearch(0)

    def trial(batch: int) -> bool:
        ok = bool(fits(batch))
        result.trials.append((batch, ok))
        logger.info("batch search: %d %s", batch, "fits" if ok else "is too big")
        return ok

    low, high = 0, limit + 1  # largest known to fit, smallest known not to
    batch = max(1, min(start, limit))
    while True:
        if trial(batch):
            low = batch
        else:
            high = batch
        if high == limit + 1 and low < limit:
            batch = min(2 * low, limit)  # still growing
            continue
        if high - low <= max(1, high // 16):
            break
        batch = (low + high) // 2
        rounded = batch // multiple * multiple
        if rounded > low and batch >= 2 * multiple:
            batch = rounded
    while low > 0 and not trial(low):  # the verifying step
        low //= 2
    result.batch = low
    return result


def gpu_memory_peak() -> int:
    import tensorflow as tf

    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def trial_step_fits(model, image_size: int, budget_bytes: int,
                    memory_peak: Callable[[], int] = gpu_memory_peak,
                    reset: Callable[[], None] | None = None, boxes_per_image: int = 1) -> Callable[[int], bool]:
    """A `fits(batch)` that runs two real train steps of `model` (the first also traces) on
    images with `boxes_per_image` boxes each (the densest training image's count)."""
    import tensorflow as tf

    from components.detector.losses import build_for_fit
    from components.detector.model import synthetic_batch

    def reset_gpu_stats() -> None:
        tf.config.experimental.reset_memory_stats("GPU:0")

    reset = reset or reset_gpu_stats

    def fits(batch: int) -> bool:
        data = tf.data.Dataset.from_tensors(synthetic_batch(batch, image_size, boxes_per_image)).repeat()
        build_for_fit(model, data.element_spec)  # once: the later trials find it built
        reset()
        try:
            # train_on_batch cannot take the detector's dict of boxes and labels; fit can.
            model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
        except tf.errors.ResourceExhaustedError:
            return False
        finally:
            del data
            gc.collect()
        return memory_peak() <= budget_bytes

    return fits


def cpu_ram_bound(model_config, available_bytes: int, boxes_per_image: int = 1) -> int:
    """The largest batch whose estimated training memory, with `boxes_per_image` boxes in
    every image, fits `TARGET_FRACTION` of RAM."""
    from components.detector.memory_estimate import largest_safe_batch

    return largest_safe_batch(int(available_bytes * TARGET_FRACTION), model_config, mixed_precision=False,
                              boxes_per_image=boxes_per_image)


def trial_model(model_config, config: TrainConfig, xla: bool = False):
    """The model the trial steps train: the fitted shape, compiled as training compiles it,
    under the current precision policy (training_state sets it), its step XLA-compiled when
    training's is."""
    import keras

    from components.detector.losses import compile_detector
    from components.detector.model import build_detector
    from components.train.accumulation import use_micro_batches
    from components.train.xla import xla_step

    model = build_detector(model_config)
    compile_detector(model, keras.optimizers.AdamW(1e-4, global_clipnorm=config.clipnorm), config.box_loss)
    use_micro_batches(model, 1, wrap=lambda step: xla_step(step, xla))
    return model


def measure_auto_batch(config: TrainConfig, model_config, local_replicas: int = 1,
                       boxes_per_image: int = 1, limit: int = GPU_BATCH_LIMIT, xla: bool = False) -> tuple[int, str]:
    """`--batch-size auto` for this machine and model (`model_config`: the fitted shape):
    trial steps on a GPU (the batch of one GPU, up to `limit`, times the machine's GPUs) with
    as many boxes per image as the densest training image has, under the run's precision
    policy and XLA choice; a RAM bound on a CPU."""
    import psutil
    import tensorflow as tf

    from components.detector.gpu_facts import nvml_facts

    if not tf.config.list_physical_devices("GPU"):
        available = psutil.virtual_memory().available
        bound = cpu_ram_bound(model_config, available, boxes_per_image)
        return max(1, min(CPU_BATCH_CAP, bound)), (
            f"auto on a CPU: RAM allows about {bound} images ({TARGET_FRACTION:.0%} of {available / 2**30:.1f} GiB "
            f"available, estimated from the model's layer outputs and the anchor matching of {boxes_per_image} "
            f"box(es) an image, the densest training image's); capped at {CPU_BATCH_CAP}, since on a CPU "
            "a larger batch adds step time, not throughput")
    start = config.probe.safe_batch or 32
    gpus = nvml_facts().get("gpus") or []
    if not gpus:
        return start, f"auto: {start} from the probe's estimate (NVML did not report the GPU's memory)"
    total = gpus[0]["memory_total"]
    model = trial_model(model_config, config, xla)
    try:
        fits = trial_step_fits(model, model_config.image_size, int(total * TARGET_FRACTION),
                               boxes_per_image=boxes_per_image)
        search = search_largest_batch(fits, start=start, limit=limit)
    except Exception as err:  # the search itself failed: fall back to the probe's estimate
        logger.warning("train: batch search failed (%s); using the probe's estimate %d", err, start)
        return start, f"auto: {start} from the probe's estimate (the trial-step search failed: {err})"
    finally:
        del model
        gc.collect()
    if search.batch == 0:
        return local_replicas, f"auto: not even 1 image fitted in trial steps ({search.describe()}); trying 1 per GPU"
    return search.batch * local_replicas, (
        f"auto: the largest batch whose trial steps peaked under {TARGET_FRACTION:.0%} of "
        f"{total / 2**30:.1f} GiB GPU memory with {boxes_per_image} box(es) an image (the densest training "
        f"image's), starting from the probe's {start} (trials: {search.describe()}"
        + (f"; none above {limit}, the most a run of this many steps keeps" if limit < GPU_BATCH_LIMIT else "") + ")"
        + (f", times {local_replicas} GPUs" if local_replicas > 1 else ""))
