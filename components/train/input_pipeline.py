"""tf.data readers of the shards (TF OD API keys, from beam/feature_keys.py).

Parallel interleaved reads, optional cache, parallel parse and decode (JPEG/PNG,
greyscale/CMYK/alpha → RGB), box-aware scale jitter (crop or pad) fused with the
resize to the model size, flip, photometric jitter (augment.py), padded boxes per batch, prefetch.

Boxes leave this module as pixel `yxyx` at the model's image size with 0-based
labels, padded with label -1: what `RetinaNetObjectDetector.fit` expects.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import tensorflow as tf

from beam import feature_keys as K
from beam.manifest import MANIFEST_FILE, Manifest
from components.train import augment

logger = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
MAX_BOXES = 100

_FEATURES = {
    K.ENCODED: tf.io.FixedLenFeature([], tf.string),
    K.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
    K.WIDTH: tf.io.FixedLenFeature([], tf.int64),
    K.SOURCE_ID: tf.io.FixedLenFeature([], tf.string, default_value=""),
    K.XMIN: tf.io.VarLenFeature(tf.float32),
    K.YMIN: tf.io.VarLenFeature(tf.float32),
    K.XMAX: tf.io.VarLenFeature(tf.float32),
    K.YMAX: tf.io.VarLenFeature(tf.float32),
    K.CLASS_LABEL: tf.io.VarLenFeature(tf.int64),
    K.DIFFICULT: tf.io.VarLenFeature(tf.int64),
}


@dataclass(frozen=True)
class InputConfig:
    image_size: int = 128
    batch_size: int = 16
    augment: bool = True
    augment_strength: float = 0.25  # 0: flips only; 1: strongest scale jitter and photometric jitter (augment.py)
    flip: bool = True  # horizontal flips when augmenting
    cache: str | None = None  # "memory", or a file path prefix for a disk cache of the encoded records
    shuffle_buffer: int = 1024
    seed: int = 0
    deterministic: bool = False
    parallelism: int | None = None  # parallel calls per map; None lets tf.data tune it
    skip_steps: int = 0  # resume: steps a previous run already trained
    workers: int = 1  # machines reading this dataset in one synchronous job (distribution.py)
    worker_index: int = 0  # this machine's place among them


def _calls(config: InputConfig) -> int:
    return config.parallelism or AUTOTUNE


# Shard names: detpipe's `train-00000-of-00004.tfrecord[.gz]`, and the TF OD API's
# `train.record`, `train.record-00000-of-00010` and `train.tfrecord`.
SHARD_PATTERNS = ("{split}-*.tfrecord*", "{split}.tfrecord*", "{split}.record*")


class ShardsChanged(FileNotFoundError):
    """A shard the manifest lists is missing or not the size it was written with."""


def _manifest_shards(root: str) -> list[dict] | None:
    """The shard list of `manifest.json` (through its one definition), None without one."""
    path = f"{root}/{MANIFEST_FILE}"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return Manifest.from_dict(json.load(handle)).shards


def shard_files(data_dir: str, split: str) -> list[str]:
    """The split's shard files, sorted; raises if there are none.

    With a `manifest.json` (`detpipe data build`) the manifest's list is the truth: a listed
    shard that is missing or has another size fails here, in one line, and files it does not
    list (an earlier build in the same folder) are never read. Without one (shards from
    other converters), the files matching the usual shard names."""
    root = data_dir.rstrip("/")
    listed = _manifest_shards(root)
    if listed is not None:
        files = []
        for shard in sorted((s for s in listed if s["split"] == split), key=lambda s: s["name"]):
            path = f"{root}/{shard['name']}"
            if not tf.io.gfile.exists(path):
                raise ShardsChanged(f"{path} is listed in {root}/manifest.json but missing: rebuild the dataset")
            size = tf.io.gfile.stat(path).length
            if "bytes" in shard and size != shard["bytes"]:
                raise ShardsChanged(f"{path} has {size} bytes, manifest.json says {shard['bytes']}: the shards "
                                    "changed after the build; rebuild the dataset")
            files.append(path)
        if files:
            return files
        raise FileNotFoundError(f"{root}/manifest.json lists no {split} shards")
    files = sorted({f for pattern in SHARD_PATTERNS for f in tf.io.gfile.glob(f"{root}/{pattern.format(split=split)}")})
    if not files:
        names = ", ".join(p.format(split=split) for p in SHARD_PATTERNS)
        raise FileNotFoundError(f"no {split} shards in {data_dir} (looked for {names})")
    return files


def decode_rgb(encoded: tf.Tensor) -> tf.Tensor:
    """JPEG/PNG bytes → uint8 RGB (greyscale, CMYK, palette and alpha become 3 channels).
    TensorFlow ignores EXIF: the data step wrote photos in their annotation's frame."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


_BOX_FEATURES = {key: _FEATURES[key] for key in (*K.BOX_KEYS, K.CLASS_LABEL, K.HEIGHT, K.WIDTH)}


def _yxyx(dense: dict[str, tf.Tensor]) -> tf.Tensor:
    return tf.reshape(tf.stack([dense[K.YMIN], dense[K.XMIN], dense[K.YMAX], dense[K.XMAX]], axis=-1), [-1, 4])


def parse_example(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """One Example → decoded RGB uint8 image, normalised yxyx boxes, 1-based labels."""
    parsed = tf.io.parse_single_example(serialized, _FEATURES)
    dense = {k: tf.sparse.to_dense(v) for k, v in parsed.items() if isinstance(v, tf.SparseTensor)}
    image = decode_rgb(parsed[K.ENCODED])
    return {
        "image": image,
        "boxes": _yxyx(dense),
        "labels": dense[K.CLASS_LABEL],
        "difficult": dense[K.DIFFICULT],
        "height": parsed[K.HEIGHT],
        "width": parsed[K.WIDTH],
        "source_id": parsed[K.SOURCE_ID],
    }


def parse_boxes(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """One Example → its normalised yxyx boxes, 1-based labels and image size, without decoding the image."""
    parsed = tf.io.parse_single_example(serialized, _BOX_FEATURES)
    dense = {k: tf.sparse.to_dense(v) for k, v in parsed.items() if isinstance(v, tf.SparseTensor)}
    return {"boxes": _yxyx(dense), "labels": dense[K.CLASS_LABEL], "height": parsed[K.HEIGHT],
            "width": parsed[K.WIDTH]}


def to_model_image(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """A decoded RGB uint8 image of any size → float32 in [0, 1] at the model size: the
    preprocessing of training without augmentation, of evaluation and of serving."""
    # Resizing the uint8 image first and scaling after is one pass less over the full-size image.
    return tf.image.resize(image, [image_size, image_size]) / 255.0


def _resized(image, boxes, labels, image_size: int) -> tuple[tf.Tensor, dict]:
    return to_model_image(image, image_size), _targets(boxes, labels, image_size)


def _targets(boxes, labels, image_size: int) -> dict:
    """Normalised boxes to pixels at the model size; 1-based labels to 0-based (0 becomes -1, padding)."""
    return {"boxes": boxes * float(image_size), "labels": tf.cast(labels, tf.float32) - 1.0}


def _train_element(serialized: tf.Tensor, index: tf.Tensor, config: InputConfig) -> tuple[tf.Tensor, dict]:
    """Parse, decode, scale-jitter and resize, flip, photometric jitter: one training example."""
    example = parse_example(serialized)
    image, boxes, labels = example["image"], example["boxes"], example["labels"]
    if not config.augment:
        return _resized(image, boxes, labels, config.image_size)
    seeds = tf.random.experimental.stateless_split(tf.stack([tf.cast(config.seed, tf.int64), index]), 3)
    if config.augment_strength > 0:
        image, boxes, labels = augment.scale_jitter(image, boxes, labels, config.augment_strength, seeds[0],
                                                    config.image_size)
    else:
        image = tf.image.resize(image, [config.image_size, config.image_size])
    image = image / 255.0
    if config.flip:  # after resizing: fewer pixels to move
        image, boxes = augment.random_flip(image, boxes, seeds[1])
    return augment.photometric(image, config.augment_strength, seeds[2]), _targets(boxes, labels, config.image_size)


def _padded_batch(ds: tf.data.Dataset, batch_size: int, image_size: int, drop_remainder: bool) -> tf.data.Dataset:
    # A static image shape: KerasHub's anchor generator sizes its grid from it.
    return ds.padded_batch(
        batch_size,
        padded_shapes=([image_size, image_size, 3], {"boxes": [None, 4], "labels": [None]}),
        padding_values=(0.0, {"boxes": 0.0, "labels": -1.0}),
        drop_remainder=drop_remainder,
    )


def compression_type(files: list[str]) -> str:
    """The TFRecord compression of a split's shards: "GZIP" when they end in `.gz`, else ""."""
    kinds = {f.endswith(".gz") for f in files}
    if len(kinds) > 1:
        raise ValueError("a split mixes GZIP (.gz) and plain shards")
    return "GZIP" if kinds.pop() else ""


def read_records(files: list[str], deterministic: bool, shuffle_seed: int | None = None) -> tf.data.Dataset:
    """Interleaved parallel reads of shard files, in a seeded random file order if asked."""
    compression = compression_type(files)
    names = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_seed is not None:
        names = names.shuffle(len(files), seed=shuffle_seed)
    return names.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=min(len(files), 8), num_parallel_calls=AUTOTUNE, deterministic=deterministic)


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
    """Endless shuffled, augmented, batched training data; `config.batch_size` is the global
    batch (tf.distribute splits it across devices and workers)."""
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
    ds = ds.shuffle(config.shuffle_buffer, seed=config.seed).repeat().skip(skip)
    # One fused map per image: on few cores, every extra dataset stage costs more in
    # per-element overhead than the work it holds (benchmarks/input_pipeline.py).
    # Per-element stateless seeds from the example's position keep augmentation reproducible.
    ds = ds.enumerate(start=skip).map(
        lambda index, serialized: _train_element(serialized, index, config),
        num_parallel_calls=_calls(config), deterministic=config.deterministic)
    ds = _padded_batch(ds, config.batch_size, config.image_size, drop_remainder=True).prefetch(AUTOTUNE)
    if config.workers > 1:  # tf.distribute splits each global batch; by file, this worker's files are its part
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF if policy == tf.data.experimental.AutoShardPolicy.FILE
            else policy)
        ds = ds.with_options(options)
    return ds


def eval_examples(data_dir: str, split: str = "val") -> tf.data.Dataset:
    """Parsed examples in shard order (no augmentation), for evaluation."""
    return read_records(shard_files(data_dir, split), deterministic=True).map(parse_example, num_parallel_calls=AUTOTUNE)


def count_records(data_dir: str, split: str) -> int:
    """Records in a split: from `manifest.json` when `detpipe data build` wrote the shards
    (no pass over the data), else by reading them (shards from other converters)."""
    files = shard_files(data_dir, split)  # with a manifest: exactly its shards, checked
    listed = _manifest_shards(data_dir.rstrip("/"))
    if listed is not None:
        return sum(shard["records"] for shard in listed if shard["split"] == split)
    compression = compression_type(files)
    return sum(1 for f in files for _ in tf.data.TFRecordDataset(f, compression_type=compression))
