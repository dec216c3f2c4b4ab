"""Training's stream of the train shards (read and decoded by components/detector/records.py).

Parallel interleaved reads, optional cache, parallel parse and decode, box-aware scale
jitter (crop or pad) fused with the resize to the model size, the flip and photometric
jitter drawn per image (augment.py), padded boxes per batch, prefetch; sharded across workers.

Where the flip and photometric jitter's pixel work runs (`InputConfig.finish_in_step`):
on a GPU, or under XLA, in the train step on the whole batch (`finishing`), so the host's CPUs
do only what needs the decoded photo; a batch is then `((images, draws), targets)`: images
uint8 at the model size and each image's draws, and a model given such a batch
unfinished fails on its two inputs rather than training on wrong pixels. On a CPU without
XLA it runs on the host image by image (cheapest there, and the map overlaps the step) and a
batch is `(images, targets)`, images in [0, 1]. Boxes leave this module as pixel `yxyx` at the
model's image size (already flipped) with 0-based labels, padded with label -1: what
`RetinaNetObjectDetector.fit` expects.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import tensorflow as tf

from beam.contract.decoding import decode_crop
from components.detector.geometry import FIXED_SIZE
from components.detector.records import (AUTOTUNE, as_graph, mean_record_bytes, parse_boxes, parse_example,
                                        read_records, shard_files)
from components.detector.training_rate import TrainingRate
from components.train import augment, mosaic
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputConfig:
    image_size: int = FIXED_SIZE
    batch_size: int = 16
    augment: bool = True
    # The flip and photometric jitter's pixel work in the train step (`finishing`) rather than on the
    # host: the trainer's choice on a GPU or under XLA, where a whole batch costs next to nothing.
    finish_in_step: bool = True
    augment_strength: float = TrainConfig.augment_strength  # 0: flips only; 1: strongest scale jitter and photometric jitter (augment.py)
    flip: bool = TrainConfig.flip  # horizontal flips when augmenting
    cache: str = TrainConfig.cache  # "memory", or a file path prefix for a disk cache of the encoded records
    shuffle_buffer: int = 1024  # records; at most SHUFFLE_BUFFER_BYTES of them (shuffle_buffer_for)
    seed: int = TrainConfig.seed
    deterministic: bool = TrainConfig.deterministic
    parallelism: int | None = None  # parallel calls per map; None lets tf.data tune it
    skip_steps: int = 0  # resume: steps a previous run already trained
    workers: int = 1  # machines reading this dataset in one synchronous job (distribution.py)
    worker_index: int = 0  # this machine's place among them
    # Under XLA (--xla): every new shape of a batch is a new compilation (~20 s on a CPU), and
    # the box axis takes the batch's own largest count. Padded instead to the next power of
    # two, at least `box_floor` (the densest sampled image's count): one or a few shapes.
    # 0: boxes padded per batch only (without XLA a new count costs nothing).
    box_floor: int = 0
    # Large photos with small objects (components/detector/tile_choice.py): train on windows of
    # `image_size` pixels of the photo at full resolution (a tile, scale-jittered), decoding only
    # that window of a JPEG, rather than on the whole photo resized; `windows_per_photo` windows of
    # each photo per pass, from `batch_size` photos at a time (so one pass sees about the tiles
    # the photos hold, and a batch holds windows of different photos).
    tiled: bool = False
    windows_per_photo: int = 1
    orientations: str = TrainConfig.orientations  # augment_settings.ORIENTATIONS
    # The first step trained without mosaic (mosaic.clean_from: the clean end of a run with
    # --mosaic); 0: no mosaic. Tiled training takes none.
    mosaic_until_step: int = 0


# Host RAM the shuffle buffer may hold of encoded records: 1,024 photos of 10,000 px (~20 MB
# each as JPEG) would take 20 GB, an out-of-memory crash on most training VMs.
SHUFFLE_BUFFER_BYTES = 512 * 2**20


def shuffle_buffer_for(data_dir: str, limit: int = InputConfig.shuffle_buffer) -> int:
    """The shuffle buffer in records: `limit`, fewer when the train records are so large that
    `limit` of them would pass SHUFFLE_BUFFER_BYTES (at least 16; 25 records of 20 MB)."""
    size = mean_record_bytes(data_dir, "train")
    return limit if not size else max(16, min(limit, int(SHUFFLE_BUFFER_BYTES // size)))


def _calls(config: InputConfig) -> int:
    return config.parallelism or AUTOTUNE


def _targets(boxes, labels, image_size: int) -> dict:
    """Normalised boxes to pixels at the model size; 1-based labels to 0-based (0 becomes -1, padding;
    augment.IGNORED becomes -2, KerasHub's ignore class)."""
    return {"boxes": boxes * float(image_size), "labels": tf.cast(labels, tf.float32) - 1.0}


def _key(config: InputConfig, index: tf.Tensor) -> tf.Tensor:
    """The stateless key of the example (or group of examples) at `index`: every draw's root."""
    return tf.stack([tf.cast(config.seed, tf.int64), index])


def _seeds(config: InputConfig, index: tf.Tensor) -> tf.Tensor:
    """Scale jitter's, the flip's and the photometric jitter's seeds of the example at `index`."""
    return tf.random.experimental.stateless_split(_key(config, index), 3)


def _decoded_side(config: InputConfig) -> float:
    """The shorter side a training image needs decoded: the model's size, more when scale
    jitter may zoom into a part of it (records.decode_at_least)."""
    zoom = augment.smallest_window(config.augment_strength) if config.augment else 1.0
    return config.image_size / zoom


def _window(image, boxes, labels, config: InputConfig, seed: tf.Tensor):
    """The image at the model size (uint8): scale-jittered when augmenting, else resized."""
    if config.augment and config.augment_strength > 0:
        return augment.scale_jitter(image, boxes, labels, config.augment_strength, seed, config.image_size)
    return augment.resize_uint8(image, [config.image_size, config.image_size]), boxes, labels


def _tile_window(serialized: tf.Tensor, config: InputConfig, seed: tf.Tensor):
    """A random window of `image_size` pixels of the photo at full resolution (scale-jittered
    when augmenting), only that part of a JPEG decoded: (image uint8, boxes, labels)."""
    example = parse_boxes(serialized, encoded=True)
    strength = config.augment_strength if config.augment else 0.0
    size = config.image_size

    def crop_of(shape):
        window = augment.jitter_window(shape, strength, seed, size, base=size / shape)
        return window.corner, window.extent, window

    crop, window = decode_crop(example["encoded"], crop_of)
    # A box the window's border cuts to less than MIN_VISIBLE of its area is an ignored region:
    # the part of an object left in a tile is no background to learn.
    boxes, labels = augment.window_boxes(example["boxes"], example["labels"], window.origin, window.span,
                                         cut_label=augment.IGNORED)
    # A tile holds few of a large photo's boxes: the rest would only pad every batch. One padding
    # row stays (label 0), so a batch of tiles without objects still has a box axis.
    inside = labels != 0
    boxes = tf.concat([tf.boolean_mask(boxes, inside), tf.zeros([1, 4])], 0)
    labels = tf.concat([tf.boolean_mask(labels, inside), tf.zeros([1], labels.dtype)], 0)
    return augment.fill_window(crop, window, size), boxes, labels


# Salts of the draws made beyond `_seeds`' three (orientation, mosaic): folded into the same key.
ORIENT_SALT, MOSAIC_SALT = 1, 2


def _host_example(serialized: tf.Tensor, index: tf.Tensor, config: InputConfig):
    """One training example as the host makes it: parsed, decoded (a large JPEG at the scale
    the model needs: records.decode_at_least), scale-jittered (or resized) to the model size,
    turned as `orientations` allows, its flip and photometric jitter drawn and its boxes
    flipped: (image uint8, draws, normalised boxes, 1-based labels), the image's flip and
    photometric jitter left to `finish_batch` (or `finish_one`)."""
    seeds = _seeds(config, index)
    if config.tiled:
        image, boxes, labels = _tile_window(serialized, config, seeds[0])
    else:
        example = parse_example(serialized, _decoded_side(config))
        image, boxes, labels = _window(example["image"], example["boxes"], example["labels"], config, seeds[0])
    if config.augment:
        image, boxes = augment.orient(image, boxes, config.orientations,
                                      tf.random.experimental.stateless_fold_in(_key(config, index), ORIENT_SALT))
        draws = augment.draw(config.augment_strength, config.flip, seeds[1], seeds[2])
        boxes = augment.flip_boxes(boxes, draws)
    else:
        draws = tf.constant(augment.NO_DRAWS)
    return tf.ensure_shape(image, [config.image_size, config.image_size, 3]), draws, boxes, labels


def _train_element(serialized: tf.Tensor, index: tf.Tensor, config: InputConfig) -> tuple[tuple, dict]:
    """`_host_example` as the train step takes it: `((image, draws), targets)`."""
    image, draws, boxes, labels = _host_example(serialized, index, config)
    return (image, draws), _targets(boxes, labels, config.image_size)


def _finished(image, draws, boxes, labels, config: InputConfig):
    """An example of `_host_example`'s form → a training element: `((image, draws), targets)`
    with `finish_in_step`, else the image finished here (`augment.finish_one`) and its targets."""
    targets = _targets(boxes, labels, config.image_size)
    return ((image, draws), targets) if config.finish_in_step else (augment.finish_one(image, draws), targets)


def _mosaic_group(indices, images, draws, boxes, labels, config: InputConfig, until: int):
    """Four examples (`_host_example`'s, their flips already in the pixels) → four mosaics of
    them (mosaic.py), or the four as they are from example position `until` on (the clean end)."""
    def mosaics():
        seed = tf.random.experimental.stateless_fold_in(_key(config, indices[0]), MOSAIC_SALT)
        return mosaic.mosaic_four(images, boxes, labels, seed, config.image_size)

    def as_they_are():
        return images, boxes.to_tensor(), labels.to_tensor()

    out_images, out_boxes, out_labels = tf.cond(indices[0] < until, mosaics, as_they_are)
    # Static shapes, as the plain stream's: a batch of images of unknown channels would be ragged.
    size = config.image_size
    return (tf.ensure_shape(out_images, [mosaic.MOSAIC_IMAGES, size, size, 3]), draws,
            tf.ensure_shape(out_boxes, [mosaic.MOSAIC_IMAGES, None, 4]), out_labels)


def _mosaic_stream(ds: tf.data.Dataset, config: InputConfig, until: int) -> tf.data.Dataset:
    """`(index, serialized)` records → training elements made of mosaics until position `until`."""
    def host(index, serialized):
        image, draws, boxes, labels = _host_example(serialized, index, config)
        image, draws = augment.flip_pixels(image, draws)  # the mosaic lays out the flipped pixels
        return index, image, draws, boxes, labels

    ds = ds.map(as_graph(host), num_parallel_calls=_calls(config), deterministic=config.deterministic)
    ds = ds.ragged_batch(mosaic.MOSAIC_IMAGES, drop_remainder=True)
    ds = ds.map(as_graph(lambda *group: _mosaic_group(*group, config, until)), num_parallel_calls=_calls(config),
                deterministic=config.deterministic).unbatch()
    return ds.map(as_graph(lambda *example: _finished(*example, config)), num_parallel_calls=_calls(config),
                  deterministic=config.deterministic)


def per_image_element(serialized: tf.Tensor, index: tf.Tensor, config: InputConfig) -> tuple[tf.Tensor, dict]:
    """The same example finished on the host (`augment.finish_one`): what training takes on a
    CPU without XLA, the way a tutorial pipeline does all of its work, image by image (the
    benchmark's baseline), and the reference `finish_batch` is tested against."""
    (image, draws), targets = _train_element(serialized, index, config)
    return augment.finish_one(image, draws), targets


def finish_batch(batch: tuple, targets: dict) -> tuple[tf.Tensor, dict]:
    """A batch of `train_dataset` with `finish_in_step` → the model's (images in [0, 1],
    targets): the flips and photometric jitter drawn on the host applied to the whole batch."""
    images, draws = batch
    return augment.finish(images, draws), targets


def on_accelerator() -> bool:
    """Whether this process trains on GPUs."""
    return bool(tf.config.list_logical_devices("GPU"))


def finishing(train_step):
    """A train step that takes `train_dataset`'s batches made with `finish_in_step`: it
    finishes them (`finish_batch`) inside the step, on the accelerator (fused by XLA under
    --xla), then trains on them."""

    def step(data):
        return train_step(finish_batch(*data))

    return step


def model_element_spec(element_spec: tuple) -> tuple:
    """The element spec of `train_dataset`'s batches as the model takes them (finished: float32)."""
    x, targets = element_spec
    images = x[0] if isinstance(x, tuple) else x
    return tf.TensorSpec(images.shape, tf.float32), targets


def _padded_batch(ds: tf.data.Dataset, batch_size: int, image_size: int, drop_remainder: bool) -> tf.data.Dataset:
    # A static image shape: KerasHub's anchor generator sizes its grid from it.
    return ds.padded_batch(
        batch_size,
        padded_shapes=([image_size, image_size, 3], {"boxes": [None, 4], "labels": [None]}),
        padding_values=(0.0, {"boxes": 0.0, "labels": -1.0}),
        drop_remainder=drop_remainder,
    )


def _ragged_then_padded_batch(ds: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """The batches of `_padded_batch`, value for value, made faster: the images (static
    [size, size, 3]) and their draws are stacked as `batch` stacks them and only the few boxes and labels go
    through a ragged batch and are padded after, where `padded_batch` copies every image through
    its padding path (at 640 px ~20% of the input pipeline's time: benchmarks/input_pipeline.py)."""
    def padded(images, targets):
        return images, {"boxes": targets["boxes"].to_tensor(default_value=0.0),
                        "labels": targets["labels"].to_tensor(default_value=-1.0)}

    return ds.ragged_batch(batch_size, drop_remainder=True).map(as_graph(padded))


def pad_boxes_to_bucket(images: tf.Tensor, targets: dict, floor: int) -> tuple[tf.Tensor, dict]:
    """A batch's box axis padded to the next power of two at least `floor` (see InputConfig.box_floor).

    >>> _, t = pad_boxes_to_bucket(tf.zeros([2, 8, 8, 3]), {"boxes": tf.zeros([2, 5, 4]), "labels": tf.zeros([2, 5])}, 3)
    >>> t["boxes"].shape.as_list(), t["labels"].shape.as_list(), float(t["labels"][0, -1])
    ([2, 8, 4], [2, 8], -1.0)
    """
    count = tf.shape(targets["labels"])[1]
    wanted = tf.maximum(count, floor)
    bucket = tf.cast(2 ** tf.math.ceil(tf.math.log(tf.cast(wanted, tf.float32)) / tf.math.log(2.0)), tf.int32)
    bucket = tf.maximum(bucket, wanted)  # float rounding must never lose a box
    extra = bucket - count
    return images, {"boxes": tf.pad(targets["boxes"], [[0, 0], [0, extra], [0, 0]]),
                    "labels": tf.pad(targets["labels"], [[0, 0], [0, extra]], constant_values=-1.0)}


def shard_policy(num_files: int, workers: int) -> tf.data.experimental.AutoShardPolicy:
    """How several workers split the train split: by file when every worker gets at least
    one shard (each reads only its own files: `train_dataset` picks them, since tf.data's
    own file sharding refuses a pipeline with `enumerate`), else by data (tf.data: each
    reads everything and keeps its part of every global batch)."""
    policy = tf.data.experimental.AutoShardPolicy
    return policy.FILE if num_files >= workers else policy.DATA


def examples_per_step(batch_size: int, workers: int, policy: tf.data.experimental.AutoShardPolicy) -> int:
    """Records one worker's stream yields per global step: with file sharding each worker's
    own stream feeds its 1/workers of the global batch; with data sharding every worker
    walks the whole global stream."""
    return batch_size // workers if policy == tf.data.experimental.AutoShardPolicy.FILE else batch_size


def train_dataset(data_dir: str, config: InputConfig) -> tf.data.Dataset:
    """Endless shuffled, augmented, batched training data (`((images, draws), targets)` for a
    train step wrapped in `finishing` when `config.finish_in_step`, else `(images, targets)`);
    `config.batch_size` is the global batch (tf.distribute splits it across devices and workers)."""
    files = shard_files(data_dir, "train")
    policy = shard_policy(len(files), config.workers)
    skip = config.skip_steps * examples_per_step(config.batch_size, config.workers, policy)
    if config.workers > 1 and policy == tf.data.experimental.AutoShardPolicy.FILE:
        files = files[config.worker_index::config.workers]
    ds = read_records(files, config.deterministic, shuffle_seed=config.seed)
    if config.cache:
        # The encoded records, kept after the first pass: later epochs read no files.
        ds = ds.cache("" if config.cache == "memory" else config.cache)
    # Skipping raw records (before decoding) is cheap; with a seeded, deterministic
    # pipeline it puts a resumed run exactly where the killed one stopped.
    ds = ds.shuffle(config.shuffle_buffer, seed=config.seed).repeat()
    if config.tiled and config.windows_per_photo > 1:  # each photo k times, photos interleaved a batch at a time
        copies = config.windows_per_photo
        ds = ds.interleave(lambda record: tf.data.Dataset.from_tensors(record).repeat(copies),
                           cycle_length=config.batch_size, block_length=1, deterministic=True)
    ds = ds.skip(skip)
    # One fused map per image: on few cores, every extra dataset stage costs more in
    # per-element overhead than the work it holds (benchmarks/input_pipeline.py).
    # Per-element stateless seeds from the example's position keep augmentation reproducible.
    mosaic_until = config.mosaic_until_step * examples_per_step(config.batch_size, config.workers, policy)
    if mosaic_until > skip and not config.tiled:  # a tile takes no mosaic (mosaic.takes_mosaic)
        ds = _mosaic_stream(ds.enumerate(start=skip), config, mosaic_until)
    else:
        ds = ds.enumerate(start=skip).map(
            as_graph(lambda index, serialized: (_train_element if config.finish_in_step else per_image_element)(
                serialized, index, config)),
            num_parallel_calls=_calls(config), deterministic=config.deterministic)
    ds = _ragged_then_padded_batch(ds, config.batch_size)
    if config.box_floor:
        ds = ds.map(as_graph(lambda images, targets: pad_boxes_to_bucket(images, targets, config.box_floor)))
    ds = ds.prefetch(AUTOTUNE)
    options = tf.data.Options()
    # No autotuning thread: tf.data's (TF 2.16) sleeps between its rounds, the pause doubling to a
    # minute as training runs, and deleting the iterator waits for it to wake (gdb: RootDataset::
    # Iterator's destructor joining Model::OptimizeLoop), so `fit` returned 16-54 s late in a third
    # of the demo's trainings. Without it AUTOTUNE's parallelism is the machine's cores, and the
    # prefetch buffer still grows as needed (its own legacy tuner); the input stays far ahead of
    # a CPU's training (demo, 2 cores: 1,400-2,400 images/s against training's ~100).
    options.autotune.enabled = False
    if config.workers > 1:  # tf.distribute splits each global batch; by file, this worker's files are its part
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF if policy == tf.data.experimental.AutoShardPolicy.FILE
            else policy)
    return ds.with_options(options)


# `measure_input_rate`: batches to fill the pipeline's buffers first, then seconds timed. Timing ends
# after INPUT_SETTLED_SECONDS where the rate so far is INPUT_SETTLED_RATIO times the rate it is
# compared with (`settled_above`, training's): the answer (the input keeps up) is settled then, and
# a CPU's input runs far ahead of its training (demo, 2 cores: ~2,500 images/s against ~90), where
# the full INPUT_SECONDS cost 1.7 s of each probe.
INPUT_WARMUP_BATCHES = 3
INPUT_SECONDS = 2.0
INPUT_SETTLED_SECONDS = 0.3
INPUT_SETTLED_RATIO = 4.0


def measure_input_rate(data_dir: str, image_size: int, batch: int, seconds: float = INPUT_SECONDS,
                       tiled: bool = False, settled_above: float | None = None) -> TrainingRate:
    """Images/s of the training input pipeline (`train_dataset`, augmentation as training does
    it) on the train shards of `data_dir` at `image_size` (windows of the photos at full
    resolution when `tiled`), for about `seconds` after a warm-up; sooner where the rate is far
    above `settled_above` images/s (INPUT_SETTLED_RATIO)."""
    # Where training does the flip and photometric jitter: in the step on a GPU, on the host on a CPU.
    config = InputConfig(image_size=image_size, batch_size=batch, finish_in_step=on_accelerator(), tiled=tiled)
    batches = iter(train_dataset(data_dir, config))
    for _ in range(INPUT_WARMUP_BATCHES):
        next(batches)
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        if (settled_above and elapsed >= INPUT_SETTLED_SECONDS
                and count / elapsed >= INPUT_SETTLED_RATIO * settled_above):
            break
        next(batches)
        count += batch
    rate = count / (time.perf_counter() - started)
    what = "tiles of the train photos at full resolution" if tiled else "images of the train shards"
    return TrainingRate(rate, f"measured: {count} {what} in batches of {batch} at {image_size} px, decoded and "
                              f"augmented as training does on this machine")
