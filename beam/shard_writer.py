"""Deterministic TFRecord shards: records go to a shard by a hash of their key and
are sorted by key inside it, so the same input always gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import tensorflow as tf

from beam.split import stable_fraction

DEFAULT_TARGET_SHARD_BYTES = 128 * 1024 * 1024
DEFAULT_MIN_SHARDS = 4


@dataclass(frozen=True)
class ShardInfo:
    name: str
    split: str
    records: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def shard_name(split: str, index: int, count: int) -> str:
    """>>> shard_name("train", 0, 8)
    'train-00000-of-00008.tfrecord'
    """
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


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


def write_shard(path: str, split: str, keyed_records: Iterable[tuple[str, bytes]]) -> ShardInfo:
    """Write records sorted by key (no compression) and return the shard's facts."""
    ordered = sorted(keyed_records, key=lambda kv: kv[0])
    with tf.io.TFRecordWriter(path) as writer:
        for _, record in ordered:
            writer.write(record)
    digest, size = hashlib.sha256(), 0
    with tf.io.gfile.GFile(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return ShardInfo(path.rsplit("/", 1)[-1], split, len(ordered), size, digest.hexdigest())
