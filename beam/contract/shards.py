"""Deterministic TFRecord shards: records go to a shard by a hash of their key and
are sorted by key inside it, so the same input always gives byte-identical files.

Written through Beam's file systems (local, gs://), not TensorFlow's writer: the job's
workers do without TensorFlow (beam/contract/example_proto.py says why). Not Beam's
`WriteToTFRecord`: it gives a record to a shard as its bundles fall and writes a shard in
arrival order, so two runs of the same input write different files, and it hands back
neither a shard's record count nor its sha256, which the manifest holds.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from dataclasses import asdict, dataclass
from typing import BinaryIO, Callable

from beam.contract.shard_names import GZIP_SUFFIX
from beam.contract.tfrecord_framing import tfrecord_frame
from beam.contract.stable_hash import stable_fraction


@dataclass(frozen=True)
class ShardInfo:
    name: str
    split: str
    records: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def shard_count(num_records: int, total_bytes: int, target_bytes: int, min_shards: int) -> int:
    """Enough shards to stay near `target_bytes` each, at least `min_shards` so several
    readers can share the work, and never more shards than records (at least 1).

    >>> shard_count(200, 10_000, 128 << 20, 4), shard_count(2, 10, 100, 4), shard_count(0, 0, 1, 4)
    (4, 2, 1)
    """
    by_size = math.ceil(total_bytes / target_bytes) if target_bytes > 0 else 1
    return max(1, min(max(by_size, min_shards), num_records))


def shard_index(key: str, count: int) -> int:
    return min(count - 1, int(stable_fraction(key, seed=-1) * count))


def _beam_create(path: str) -> BinaryIO:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


class ShardWriter:
    """Streams serialized records into one shard file (GZIP-compressed when its name ends
    in .gz: zlib's header carries no time, so those stay byte-identical too); `info` is
    ready after closing. The bytes are counted and hashed as they are written, as stored,
    so the shard is not read back (on gs:// a second transfer of every shard).

    Records are written in the order given: callers sort by key first. `open_file` opens the
    path for writing bytes: Beam's file systems by default (the job's workers have no
    TensorFlow); a step that has TensorFlow loaded passes `tf.io.gfile.GFile`'s, so it does
    not import Beam (about a second of each process start) for one carve.
    """

    def __init__(self, path: str, split: str, open_file: Callable[[str], BinaryIO] | None = None):
        self.path, self.split, self.records = path, split, 0
        self._file = (open_file or _beam_create)(path)
        # Beam's own GZIP files use these settings; compressed here, the stored bytes pass through.
        self._gzip = (zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, zlib.MAX_WBITS | 16)
                      if path.endswith(GZIP_SUFFIX) else None)
        self._digest, self._size = hashlib.sha256(), 0
        self.info: ShardInfo | None = None

    def _store(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self._size += len(data)

    def write(self, record: bytes) -> None:
        frame = tfrecord_frame(record)
        self._store(self._gzip.compress(frame) if self._gzip else frame)
        self.records += 1

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._gzip:
            self._store(self._gzip.flush())
        self._file.close()
        self.info = ShardInfo(self.path.rsplit("/", 1)[-1], self.split, self.records, self._size,
                              self._digest.hexdigest())

