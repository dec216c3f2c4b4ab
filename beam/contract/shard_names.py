"""The names of the shard files: what the data job (and every other writer of shards: the tuning
split, the label review's folds) names them, and the patterns every reader finds them by,
detpipe's and the TF OD API's. No imports: the trainer, the probe and the CLI's checks read it.
"""

from __future__ import annotations

SHARD_SUFFIX = ".tfrecord"
GZIP_SUFFIX = ".gz"
# A detpipe shard's file name ends in one of these.
SHARD_SUFFIXES = (SHARD_SUFFIX, SHARD_SUFFIX + GZIP_SUFFIX)
# What readers look for, by split: detpipe's `train-00000-of-00004.tfrecord[.gz]`, and the TF OD
# API's `train.record`, `train.record-00000-of-00010` and `train.tfrecord`.
SHARD_PATTERNS = ("{split}-*" + SHARD_SUFFIX + "*", "{split}" + SHARD_SUFFIX + "*", "{split}.record*")
# Any split's shards (the probe's read-speed test).
ANY_SHARD = "*" + SHARD_SUFFIX + "*"


def shard_name(split: str, index: int, count: int, gzip: bool = False) -> str:
    """The file name of shard `index` of `count` of a split.

    >>> shard_name("train", 0, 8), shard_name("val", 1, 2, gzip=True)
    ('train-00000-of-00008.tfrecord', 'val-00001-of-00002.tfrecord.gz')
    """
    return f"{split}-{index:05d}-of-{count:05d}{SHARD_SUFFIX}" + (GZIP_SUFFIX if gzip else "")


def split_patterns(split: str) -> list[str]:
    """The file patterns of one split's shards (SHARD_PATTERNS).

    >>> split_patterns("val")[0]
    'val-*.tfrecord*'
    """
    return [pattern.format(split=split) for pattern in SHARD_PATTERNS]
