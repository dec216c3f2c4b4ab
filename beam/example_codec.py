"""`CheckedRecord` ⇄ tf.train.Example with the TF OD API keys (beam/feature_keys.py), through
beam/example_proto.py's classes: TensorFlow is not imported (the job's workers do without it)."""

from __future__ import annotations

import hashlib

from beam import feature_keys as K
from beam import example_proto as pb
from beam.image_formats import model_image
from beam.source_records import CheckedRecord


class ImageChanged(RuntimeError):
    """The image file differs from the one the checks read."""


# The kind of each feature but `image/encoded` (bytes): the Example and the statistics'
# Arrow columns are both built from `record_features` with these.
BYTES, FLOATS, INTS = "bytes", "floats", "ints"
FEATURE_KINDS = {
    K.FORMAT: BYTES, K.HEIGHT: INTS, K.WIDTH: INTS, K.FILENAME: BYTES, K.SOURCE_ID: BYTES, K.KEY_SHA256: BYTES,
    K.XMIN: FLOATS, K.YMIN: FLOATS, K.XMAX: FLOATS, K.YMAX: FLOATS,
    K.CLASS_TEXT: BYTES, K.CLASS_LABEL: INTS, K.DIFFICULT: INTS,
}
_LIST_FIELD = {BYTES: "bytes_list", FLOATS: "float_list", INTS: "int64_list"}


def written_image(record: CheckedRecord, image_bytes: bytes) -> tuple[bytes, str]:
    """(the bytes the shard holds, their sha256): the source bytes, or the image turned
    upright when the checks applied its EXIF orientation (beam/exif.py) and as PNG when its
    format is one the shards do not hold (beam/image_formats.py).

    Raises `ImageChanged` when `image_bytes` is not the image the record was checked on.
    """
    digest = hashlib.sha256(image_bytes).hexdigest()
    if digest != record.image_sha256:
        raise ImageChanged(f"{record.image_path} changed while the dataset was being converted; run again")
    if record.orientation_applied or record.converted_from:
        image_bytes = model_image(image_bytes, turn=record.orientation_applied)
        digest = hashlib.sha256(image_bytes).hexdigest()
    return image_bytes, digest


def record_features(record: CheckedRecord, digest: str, label_map: dict[str, int]) -> dict[str, list]:
    """Every feature of the record's Example but the image bytes, as lists of values;
    labels are 1-based ids from `label_map`."""
    xmin, ymin, xmax, ymax = (list(c) for c in zip(*record.boxes)) if record.boxes else ([], [], [], [])
    return {
        K.FORMAT: [record.image_format.encode()], K.HEIGHT: [record.height], K.WIDTH: [record.width],
        K.FILENAME: [record.filename.encode()], K.SOURCE_ID: [record.image_id.encode()],
        K.KEY_SHA256: [digest.encode()],
        K.XMIN: xmin, K.YMIN: ymin, K.XMAX: xmax, K.YMAX: ymax,
        K.CLASS_TEXT: [t.encode() for t in record.class_texts],
        K.CLASS_LABEL: [label_map[t] for t in record.class_texts],
        K.DIFFICULT: [int(d) for d in record.difficult],
    }


def to_example(features: dict[str, list], image_bytes: bytes) -> pb.Example:
    """The Example of `record_features` and the image bytes. Filled in place, not built from
    one message object per feature: half the time, the same bytes."""
    example = pb.Example()
    feature = example.features.feature
    feature[K.ENCODED].bytes_list.value.append(image_bytes)
    for key, values in features.items():
        values_list = getattr(feature[key], _LIST_FIELD[FEATURE_KINDS[key]])
        values_list.SetInParent()  # an empty list is still a feature of its kind
        values_list.value.extend(values)
    return example


def example_bytes(features: dict[str, list], image_bytes: bytes) -> bytes:
    """`to_example` serialized with its features in key order: protobuf otherwise writes a
    map in the order of its hash table, which depends on how the map was filled, so the
    same record could be written as different bytes."""
    return to_example(features, image_bytes).SerializeToString(deterministic=True)


def encode_example(record: CheckedRecord, image_bytes: bytes, label_map: dict[str, int]) -> pb.Example:
    """The tf.Example of one record from its source image bytes (`written_image`,
    `record_features`)."""
    image_bytes, digest = written_image(record, image_bytes)
    return to_example(record_features(record, digest, label_map), image_bytes)


def decode_example(serialized: bytes) -> dict:
    """A plain dict of one serialized Example (for checks and tests, not training)."""
    example = pb.Example.FromString(serialized)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out
