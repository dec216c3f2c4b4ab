"""tf.train.Example ⇄ features with the TF OD API keys (beam/contract/feature_keys.py), through
beam/contract/example_proto.py's classes: TensorFlow is not imported (the data job's workers do
without it). The data job encodes with it (beam/example_codec.py); tests and checks decode.

>>> example = example_bytes({K.HEIGHT: [2], K.CLASS_TEXT: [b"cat"]}, b"jpeg bytes")
>>> decoded = decode_example(example)
>>> decoded[K.HEIGHT], decoded[K.CLASS_TEXT], decoded[K.ENCODED]
([2], [b'cat'], [b'jpeg bytes'])

Not tfx_bsl's Example coder (`RecordBatchToExamplesEncoder`, installed with TFDV): it encodes
an Arrow batch, and the job's workers hold one record at a time; with the batch built from
the records it took 3.4x the time a record (80 against 24 us, 20 KiB images:
benchmarks/example_coding.py), the same values in another feature order.
"""

from __future__ import annotations

from beam.contract import example_proto as pb
from beam.contract import feature_keys as K

# The kind of each feature but `image/encoded` (bytes): the Example and the statistics'
# Arrow columns are both built from `record_features` with these.
BYTES, FLOATS, INTS = "bytes", "floats", "ints"
FEATURE_KINDS = {
    K.FORMAT: BYTES, K.HEIGHT: INTS, K.WIDTH: INTS, K.FILENAME: BYTES, K.SOURCE_ID: BYTES, K.KEY_SHA256: BYTES,
    K.XMIN: FLOATS, K.YMIN: FLOATS, K.XMAX: FLOATS, K.YMAX: FLOATS,
    K.CLASS_TEXT: BYTES, K.CLASS_LABEL: INTS, K.DIFFICULT: INTS,
}
_LIST_FIELD = {BYTES: "bytes_list", FLOATS: "float_list", INTS: "int64_list"}


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


def decode_example(serialized: bytes) -> dict:
    """A plain dict of one serialized Example (for checks and tests, not training)."""
    example = pb.Example.FromString(serialized)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out
