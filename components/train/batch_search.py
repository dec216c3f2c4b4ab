"""`--batch-size auto`: the largest batch that fits, found with real trial steps.

On a GPU: train steps on synthetic batches of the real model, size and precision,
doubling from the probe's estimate, then bisection, then one verifying step; a batch
"fits" when the step runs without ResourceExhaustedError and its peak memory stays under
`TARGET_FRACTION` of the GPU's memory. The trial model is thrown away afterwards.
On a CPU: a RAM-based bound from the model's layer-output estimate (components/probe),
capped at `CPU_BATCH_CAP`; no trial steps, which would cost more time than they save.
Always capped at the dataset size.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

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


def synthetic_batch(batch: int, image_size: int):
    """Images and one centred box per image: what a trial step needs, no data read."""
    import tensorflow as tf

    quarter, three = image_size / 4, 3 * image_size / 4
    images = tf.random.stateless_uniform([batch, image_size, image_size, 3], [0, 1])
    boxes = tf.tile(tf.constant([[[quarter, quarter, three, three]]], tf.float32), [batch, 1, 1])
    return images, {"boxes": boxes, "labels": tf.zeros([batch, 1], tf.float32)}


def gpu_memory_peak() -> int:
    import tensorflow as tf

    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def trial_step_fits(model, image_size: int, budget_bytes: int,
                    memory_peak: Callable[[], int] = gpu_memory_peak,
                    reset: Callable[[], None] | None = None) -> Callable[[int], bool]:
    """A `fits(batch)` that runs two real train steps of `model` (the first also traces)."""
    import tensorflow as tf

    def reset_gpu_stats() -> None:
        tf.config.experimental.reset_memory_stats("GPU:0")

    reset = reset or reset_gpu_stats

    def fits(batch: int) -> bool:
        data = tf.data.Dataset.from_tensors(synthetic_batch(batch, image_size)).repeat()
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


def cpu_ram_bound(model_size: str, image_size: int, num_classes: int, available_bytes: int) -> int:
    """The largest batch whose estimated training memory fits `TARGET_FRACTION` of RAM."""
    from components.probe.memory_estimate import largest_safe_batch

    return largest_safe_batch(int(available_bytes * TARGET_FRACTION), model_size, image_size, num_classes,
                              mixed_precision=False)
