"""The written records' features as Arrow batches, what the statistics read (TFDV takes
Arrow). The job's workers, which do without TensorFlow, build one per shard and write it
to OUTPUT/_job/ (`write_batch`); the driver runs TFDV over them (beam/tfdv_checks.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam import feature_keys as K
from beam.example_codec import BYTES, FEATURE_KINDS, FLOATS, INTS

# Derived for statistics only (not written to the shards): box sizes, so that TFDV can
# show their distribution and catch their drift between dataset versions.
BOX_WIDTH = "detpipe/box_width"
BOX_HEIGHT = "detpipe/box_height"


def with_box_sizes(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Add box width and height (normalised) list columns computed from the corners."""
    names = batch.schema.names
    columns, fields = list(batch.columns), list(batch.schema)
    for name, lo, hi in ((BOX_WIDTH, K.XMIN, K.XMAX), (BOX_HEIGHT, K.YMIN, K.YMAX)):
        if lo not in names or hi not in names:
            continue
        lo_arr, hi_arr = batch.column(names.index(lo)), batch.column(names.index(hi))
        sizes = pc.subtract(hi_arr.flatten(), lo_arr.flatten())
        column = type(hi_arr).from_arrays(hi_arr.offsets, sizes)
        columns.append(column)
        fields.append(pa.field(name, column.type))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


_ARROW_TYPES = {BYTES: pa.binary(), FLOATS: pa.float32(), INTS: pa.int64()}


def features_batch(rows: list[dict[str, list]]) -> pa.RecordBatch:
    """The records' features (example_codec.record_features: everything but the image
    bytes) as one Arrow batch with box widths and heights, what TFDV reads. Statistics over
    the image bytes would copy every image once more and tell nothing the checks do not."""
    keys = list(FEATURE_KINDS)
    columns = [pa.array([row[key] for row in rows], pa.list_(_ARROW_TYPES[FEATURE_KINDS[key]])) for key in keys]
    return with_box_sizes(pa.RecordBatch.from_arrays(columns, keys))


def write_batch(path: str, batch: pa.RecordBatch) -> None:
    """One batch as an Arrow IPC stream file (local or gs://)."""
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        with pa.ipc.new_stream(handle, batch.schema) as writer:
            writer.write_batch(batch)


def read_batches(path: str) -> list[pa.RecordBatch]:
    """The batches of a file `write_batch` wrote."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return list(pa.ipc.open_stream(handle.read()))
