"""`CheckedRecord` → tf.train.Example: the image bytes a shard holds and the record's features,
encoded by the contract's codec (beam/contract/codec.py)."""

from __future__ import annotations

import hashlib

from beam.contract import example_proto as pb
from beam.contract import feature_keys as K
from beam.contract.codec import to_example
from beam.contract.images import model_image
from beam.source_records import CheckedRecord


class ImageChanged(RuntimeError):
    """The image file differs from the one the checks read."""


def written_image(record: CheckedRecord, image_bytes: bytes) -> tuple[bytes, str]:
    """(the bytes the shard holds, their sha256): the source bytes, or the image turned
    upright when the checks applied its EXIF orientation (beam/contract/exif.py) and as PNG when its
    format is one the shards do not hold (beam/contract/images.py).

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


def encode_example(record: CheckedRecord, image_bytes: bytes, label_map: dict[str, int]) -> pb.Example:
    """The tf.Example of one record from its source image bytes (`written_image`,
    `record_features`)."""
    image_bytes, digest = written_image(record, image_bytes)
    return to_example(record_features(record, digest, label_map), image_bytes)
