"""`CheckedRecord` ⇄ tf.train.Example with the TF OD API keys (beam/feature_keys.py)."""

from __future__ import annotations

import hashlib

import tensorflow as tf

from beam import feature_keys as K
from beam.exif import upright_image_bytes
from beam.source_records import CheckedRecord


def _bytes(values: list[bytes]) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def _floats(values: list[float]) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _ints(values: list[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


class ImageChanged(RuntimeError):
    """The image file differs from the one the checks read."""


def encode_example(record: CheckedRecord, image_bytes: bytes, label_map: dict[str, int]) -> tf.train.Example:
    """The tf.Example of one record from its source image bytes; labels are 1-based ids
    from `label_map`. When the checks applied the EXIF orientation, the image is written
    upright (beam/exif.py) and `image/key/sha256` is the hash of the bytes written.

    Raises `ImageChanged` when `image_bytes` is not the image the record was checked on.
    """
    digest = hashlib.sha256(image_bytes).hexdigest()
    if digest != record.image_sha256:
        raise ImageChanged(f"{record.image_path} changed while the dataset was being converted; run again")
    if record.orientation_applied:
        image_bytes = upright_image_bytes(image_bytes)
        digest = hashlib.sha256(image_bytes).hexdigest()
    xmin, ymin, xmax, ymax = (list(c) for c in zip(*record.boxes)) if record.boxes else ([], [], [], [])
    feature = {
        K.ENCODED: _bytes([image_bytes]),
        K.FORMAT: _bytes([record.image_format.encode()]),
        K.HEIGHT: _ints([record.height]),
        K.WIDTH: _ints([record.width]),
        K.FILENAME: _bytes([record.filename.encode()]),
        K.SOURCE_ID: _bytes([record.image_id.encode()]),
        K.KEY_SHA256: _bytes([digest.encode()]),
        K.XMIN: _floats(xmin), K.YMIN: _floats(ymin),
        K.XMAX: _floats(xmax), K.YMAX: _floats(ymax),
        K.CLASS_TEXT: _bytes([t.encode() for t in record.class_texts]),
        K.CLASS_LABEL: _ints([label_map[t] for t in record.class_texts]),
        K.DIFFICULT: _ints([int(d) for d in record.difficult]),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


def decode_example(serialized: bytes) -> dict:
    """A plain dict of one serialized Example (for checks and tests, not training)."""
    example = tf.train.Example.FromString(serialized)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out
