"""The written records' features as Arrow batches, what the statistics read (TFDV takes
Arrow). The job's workers, which do without TensorFlow, write a file of them per shard to
OUTPUT/_job/ (`FeaturesWriter`); the driver runs TFDV over them (beam/tfdv_checks.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam.contract import feature_keys as K
from beam.contract.codec import BYTES, FEATURE_KINDS, FLOATS, INTS

def with_box_sizes(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Add box width and height (normalised) list columns computed from the corners: for the
    statistics only (not written to the shards), so that TFDV shows their distribution and
    catches their drift between dataset versions."""
    names = batch.schema.names
    columns, fields = list(batch.columns), list(batch.schema)
    for name, lo, hi in ((K.BOX_WIDTH, K.XMIN, K.XMAX), (K.BOX_HEIGHT, K.YMIN, K.YMAX)):
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


# Rows per Arrow batch of a features file: a shard's writer holds no more than these as
# Python rows (a 4,000-record shard's rows were ~7 MiB of a worker's memory at once).
ROWS_PER_BATCH = 1024


class FeaturesWriter:
    """Streams rows (`example_codec.record_features`) into an Arrow IPC stream file (local
    or gs://), a batch every ROWS_PER_BATCH rows; a file with no rows holds the schema only."""

    def __init__(self, path: str):
        self._rows: list[dict[str, list]] = []
        self._file = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
        self._writer = pa.ipc.new_stream(self._file, features_batch([]).schema)

    def add(self, row: dict[str, list]) -> None:
        self._rows.append(row)
        if len(self._rows) >= ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_batch(features_batch(self._rows))
            self._rows = []

    def __enter__(self) -> "FeaturesWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._flush()
        self._writer.close()
        self._file.close()


def read_batches(path: str) -> list[pa.RecordBatch]:
    """The batches of a file `FeaturesWriter` wrote."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return list(pa.ipc.open_stream(handle.read()))
