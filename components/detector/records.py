"""The shards as every step reads them (TF OD API keys, from beam/contract/feature_keys.py): which
files make a split (the manifest's list, checked), parsing, decoding to RGB, the model's
resize, and the evaluation order. Training's augmented stream is built on these in
components/train/input_pipeline.py.
"""

from __future__ import annotations

import json
import numpy as np
import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.decoding import decode_at_least, decode_rgb
from beam.contract.manifest import MANIFEST_FILE, Manifest
from beam.contract.shard_names import split_patterns
from components.detector.geometry import BoxSample

AUTOTUNE = tf.data.AUTOTUNE
# The functions the input pipelines map are TensorFlow ops as written (tf.cond where a choice
# depends on a tensor), so tf.data traces them as they are, without autograph's conversion
# first: converting the training pipeline's functions cost ~1.5 s of every process that builds
# it (the probe twice, train, evaluate), and leaves no generated files behind.
as_graph = tf.autograph.experimental.do_not_convert

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



class ShardsChanged(FileNotFoundError):
    """A shard the manifest lists is missing or not the size it was written with."""


def read_folder_manifest(data_dir: str) -> Manifest | None:
    """A shard folder's `manifest.json` (through its one definition), local or gs://; None
    without one (shards from other converters)."""
    path = f"{data_dir.rstrip('/')}/{MANIFEST_FILE}"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return Manifest.from_dict(json.load(handle))


def _manifest_shards(root: str) -> list[dict] | None:
    """The shard list of `manifest.json`, None without one."""
    manifest = read_folder_manifest(root)
    return None if manifest is None else manifest.shards


def mean_record_bytes(data_dir: str, split: str) -> float | None:
    """The mean size of a split's records as written (the manifest's shard list); None without
    a manifest or records."""
    shards = [s for s in _manifest_shards(data_dir.rstrip("/")) or [] if s["split"] == split]
    records = sum(s["records"] for s in shards)
    return sum(s["bytes"] for s in shards) / records if records else None


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
    files = sorted({f for pattern in split_patterns(split) for f in tf.io.gfile.glob(f"{root}/{pattern}")})
    if not files:
        names = ", ".join(split_patterns(split))
        raise FileNotFoundError(f"no {split} shards in {data_dir} (looked for {names})")
    return files


_BOX_FEATURES = {key: _FEATURES[key] for key in (*K.BOX_KEYS, K.CLASS_LABEL, K.HEIGHT, K.WIDTH)}


def _yxyx(dense: dict[str, tf.Tensor]) -> tf.Tensor:
    return tf.reshape(tf.stack([dense[K.YMIN], dense[K.XMIN], dense[K.YMAX], dense[K.XMAX]], axis=-1), [-1, 4])


def parse_example(serialized: tf.Tensor, shorter_side: tf.Tensor | float | None = None) -> dict[str, tf.Tensor]:
    """One Example → decoded RGB uint8 image, normalised yxyx boxes, 1-based labels; with
    `shorter_side`, a large JPEG decoded at a smaller scale that keeps it (`decode_at_least`)."""
    parsed = tf.io.parse_single_example(serialized, _FEATURES)
    dense = {k: tf.sparse.to_dense(v) for k, v in parsed.items() if isinstance(v, tf.SparseTensor)}
    encoded = parsed[K.ENCODED]
    image = decode_rgb(encoded) if shorter_side is None else decode_at_least(encoded, shorter_side)
    return {
        "image": image,
        "boxes": _yxyx(dense),
        "labels": dense[K.CLASS_LABEL],
        "difficult": dense[K.DIFFICULT],
        "height": parsed[K.HEIGHT],
        "width": parsed[K.WIDTH],
        "source_id": parsed[K.SOURCE_ID],
    }


def parse_boxes(serialized: tf.Tensor, encoded: bool = False) -> dict[str, tf.Tensor]:
    """One Example → its normalised yxyx boxes, 1-based labels and image size, without decoding
    the image; with `encoded`, also its encoded bytes (to decode a part: `decode_crop`)."""
    features = {**_BOX_FEATURES, K.ENCODED: _FEATURES[K.ENCODED]} if encoded else _BOX_FEATURES
    parsed = tf.io.parse_single_example(serialized, features)
    dense = {k: tf.sparse.to_dense(v) for k, v in parsed.items() if isinstance(v, tf.SparseTensor)}
    out = {"boxes": _yxyx(dense), "labels": dense[K.CLASS_LABEL], "height": parsed[K.HEIGHT], "width": parsed[K.WIDTH]}
    if encoded:
        out["encoded"] = parsed[K.ENCODED]
    return out


def to_model_image(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """A decoded RGB uint8 image of any size (`decode_at_least(encoded, image_size)`) → float32
    in [0, 1] at the model size: the preprocessing of evaluation and of serving."""
    # Resizing the uint8 image first and scaling after is one pass less over the full-size image.
    return tf.image.resize(image, [image_size, image_size]) / 255.0


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


def eval_examples(data_dir: str, split: str = "val", shorter_side: int | None = None) -> tf.data.Dataset:
    """Parsed examples in shard order (no augmentation), for evaluation; with `shorter_side`
    (the model's size), large JPEGs decoded at the scale the model's resize needs."""
    return read_records(shard_files(data_dir, split), deterministic=True).map(
        as_graph(lambda serialized: parse_example(serialized, shorter_side)), num_parallel_calls=AUTOTUNE)


def count_records(data_dir: str, split: str) -> int:
    """Records in a split: from `manifest.json` when `detpipe data build` wrote the shards
    (no pass over the data), else by reading them (shards from other converters)."""
    files = shard_files(data_dir, split)  # with a manifest: exactly its shards, checked
    listed = _manifest_shards(data_dir.rstrip("/"))
    if listed is not None:
        return sum(shard["records"] for shard in listed if shard["split"] == split)
    compression = compression_type(files)
    return sum(1 for f in files for _ in tf.data.TFRecordDataset(f, compression_type=compression))


# The train records the fitted shape, the tiling and the box-prior baseline read their boxes from.
SAMPLE_RECORDS = 2000


def box_records(data_dir: str, split: str) -> tf.data.Dataset:
    """The split's records as `parse_boxes` gives them (boxes, labels, size; nothing decoded), in
    shard order."""
    files = shard_files(data_dir, split)
    return tf.data.TFRecordDataset(files, compression_type=compression_type(files)).map(
        as_graph(parse_boxes))


def read_box_sample(data_dir: str, records: int = SAMPLE_RECORDS, label_map: dict[str, int] | None = None) -> BoxSample:
    """The boxes, classes and image sizes of the first `records` train records (in shard order)."""
    boxes, labels, shapes = [], [], []
    for example in box_records(data_dir, "train").take(records):
        boxes.append(example["boxes"].numpy())
        labels.append(example["labels"].numpy())
        shapes.append((int(example["height"]), int(example["width"])))
    names = {index: name for name, index in (label_map or {}).items()}
    shapes = np.asarray(shapes, np.float64).reshape(-1, 2)
    return BoxSample(np.concatenate(boxes) if boxes else np.zeros((0, 4)), shapes.max(axis=1, initial=0.0),
                     labels=np.concatenate(labels).astype(np.int64) if labels else np.zeros(0, np.int64),
                     class_names=names, boxes_per_image=np.asarray([len(b) for b in boxes], np.int64),
                     image_shapes=shapes)
