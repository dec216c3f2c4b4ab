"""The tuning split: the train split's records divided, by the stable hash rule of the data
split (beam/split.py), into the part trials train on and the part they are scored on.

Written as a shard folder of its own (`train-*` the fit part, `val-*` the held-out part,
the dataset's label map), so a trial is the real trainer and evaluator on a dataset that
holds no val record: the val split cannot reach the search. Records are keyed by the
sha256 of the image bytes (`image/key/sha256`), so byte-identical photos stay on one side.

The share is capped at HOLDOUT_MAX_IMAGES images (`held_out_share`): a larger train split
trains on what the curve does not need.

>>> [held_out(k, 0.2, seed=0) for k in ("a", "b", "c", "d", "e")]
[True, True, False, False, False]
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial

from beam.contract import feature_keys as K
from beam.contract.manifest import LABEL_MAP_FILES
from beam.contract.shard_names import shard_name
from beam.contract.shards import ShardWriter, shard_index
from beam.contract.stable_hash import stable_fraction
from components.detector.holdout_size import held_out_share

logger = logging.getLogger(__name__)

SPLIT_FILE = "tuning_split.json"  # written last: a folder without it is an unfinished carve
FIT, HELD_OUT = "train", "val"  # the shard splits trials train on and are scored on


def held_out(key: str, fraction: float, seed: int) -> bool:
    """Whether the train record with this key is held out to score trials: the data split's
    rule (`stable_fraction`) on a key of its own, so the share is `fraction` of train
    whatever share val took."""
    return stable_fraction(f"tune/{key}", seed) < fraction


class TooFewToHoldOut(ValueError):
    """The train split is too small to hold out images for scoring trials."""


@dataclass(frozen=True)
class TuningSplit:
    folder: str
    fraction: float
    seed: int
    fit: int  # train records trials train on
    held_out: int  # train records trials are scored on

    def to_dict(self) -> dict:
        return asdict(self)


def _record_key(serialized: bytes) -> str:
    import tensorflow as tf

    feature = tf.train.Example.FromString(serialized).features.feature
    for name in (K.KEY_SHA256, K.SOURCE_ID):
        if name in feature and feature[name].bytes_list.value:
            return feature[name].bytes_list.value[0].decode()
    import hashlib

    return hashlib.sha256(serialized).hexdigest()  # shards of other converters: the record's own bytes


def carve_tuning_split(data_dir: str, folder: str, fraction: float, seed: int) -> TuningSplit:
    """Write the tuning split of `data_dir`'s train split into `folder` (or take the one there,
    carved with the same fraction and seed): `fraction` of it, at most HOLDOUT_MAX_IMAGES
    images (`held_out_share`). Raises when either part would be empty."""
    import tensorflow as tf

    from components.detector.records import compression_type, count_records, shard_files

    folder = folder.rstrip("/")
    marker = f"{folder}/{SPLIT_FILE}"
    if 0 < fraction < 1:
        fraction = held_out_share(fraction, count_records(data_dir, "train"))
    if tf.io.gfile.exists(marker):
        with tf.io.gfile.GFile(marker) as handle:
            done = TuningSplit(**json.load(handle))
        if (done.fraction, done.seed) == (fraction, seed):
            logger.info("tune: the tuning split in %s (%d fit, %d held out)", folder, done.fit, done.held_out)
            return done
    if not 0 < fraction < 1:
        raise ValueError(f"the tuning holdout must be between 0 and 1, got {fraction}")
    files = shard_files(data_dir, "train")
    tf.io.gfile.makedirs(folder)
    count = len(files)  # as many shards as the train split: as many parallel readers
    counts = {FIT: 0, HELD_OUT: 0}
    create = partial(tf.io.gfile.GFile, mode="wb")  # TensorFlow's file systems: this step does without Beam
    with ExitStack() as stack:
        writers = {split: [stack.enter_context(ShardWriter(f"{folder}/{shard_name(split, i, count)}", split, create))
                           for i in range(count)] for split in (FIT, HELD_OUT)}
        for serialized in tf.data.TFRecordDataset(files, compression_type=compression_type(files)).as_numpy_iterator():
            key = _record_key(serialized)
            split = HELD_OUT if held_out(key, fraction, seed) else FIT
            writers[split][shard_index(key, count)].write(serialized)
            counts[split] += 1
    if not counts[FIT] or not counts[HELD_OUT]:
        raise TooFewToHoldOut(f"the train split of {data_dir} has {sum(counts.values())} images: holding out "
                         f"{fraction:.0%} leaves {counts[FIT]} to train trials on and {counts[HELD_OUT]} to score "
                         "them; add images or give tune_trials 0")
    for name in LABEL_MAP_FILES:
        if tf.io.gfile.exists(f"{data_dir.rstrip('/')}/{name}"):
            tf.io.gfile.copy(f"{data_dir.rstrip('/')}/{name}", f"{folder}/{name}", overwrite=True)
    split = TuningSplit(folder, fraction, seed, counts[FIT], counts[HELD_OUT])
    with tf.io.gfile.GFile(marker, "w") as handle:
        handle.write(json.dumps(split.to_dict(), indent=2) + "\n")
    logger.info("tune: held out %d of %d train images (%.0f%%) to score trials, in %s", counts[HELD_OUT],
                sum(counts.values()), 100 * fraction, folder)
    return split
