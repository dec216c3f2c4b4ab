"""Finding the shard and the record behind a read error, so that a step stops with one line
that names the image, the shard and the fix instead of TensorFlow's graph error.

- `changed_shards`: each shard's sha256 against `manifest.json` (`train --verify-shards`, the
  probe's data check): a shard whose bytes changed at the same size.
- `unreadable_records`: every record of the shards read and its image decoded with the readers'
  own decoder (beam/contract/decoding.py). The trainer runs it before its first step on shards
  whose manifest does not say the build decoded them (builds before that check, other
  converters' shards); every step runs it after a read error, to name what failed.
- `naming_bad_records`: a context that turns a decode or checksum error of the input pipeline
  into `UnreadableShards` naming the record and the shard.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.decoding import decode_check, decode_problem, op_error_line
from beam.contract.manifest import MANIFEST_FILE
from components.detector.records import AUTOTUNE, compression_type, read_folder_manifest

logger = logging.getLogger(__name__)

# How to get readable shards again, said after every problem found.
REBUILD = "rebuild the dataset with `detpipe data build` (it rejects such images with their reason)"


class UnreadableShards(ValueError):
    """A record or a shard that cannot be read; the message is one line naming it and the fix."""


@dataclass(frozen=True)
class BadRecord:
    """A record of a shard that cannot be read: its position in the shard and, when its Example
    parses, its image id and file name."""

    shard: str
    index: int
    image_id: str
    filename: str
    problem: str

    def line(self) -> str:
        where = f"record {self.index} of {self.shard}"
        image = f"image {self.image_id!r} ({self.filename}), {where}" if self.image_id else where.capitalize()
        return f"{image}: {self.problem}"


def has_manifest(data_dir: str) -> bool:
    """Whether `data_dir` is a `detpipe data build` output (its shards have a sha256 to check)."""
    return tf.io.gfile.exists(f"{data_dir.rstrip('/')}/{MANIFEST_FILE}")


def decoded_at_build(data_dir: str) -> bool:
    """Whether the build that wrote these shards decoded every image with TensorFlow's decoders."""
    manifest = read_folder_manifest(data_dir)
    return manifest is not None and manifest.decoded_with_tensorflow


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def changed_shards(data_dir: str) -> list[str]:
    """A line for each shard `manifest.json` lists whose sha256 is not the one written (or that
    is missing); [] when all match. Raises `UnreadableShards` without a manifest."""
    manifest = read_folder_manifest(data_dir)
    if manifest is None:
        raise UnreadableShards(f"{data_dir} has no {MANIFEST_FILE}: shards from another converter carry no sha256 "
                               "to verify them against")
    root, problems = data_dir.rstrip("/"), []
    for shard in manifest.shards:
        path = f"{root}/{shard['name']}"
        if not tf.io.gfile.exists(path):
            problems.append(f"{path} is missing ({MANIFEST_FILE} lists it): {REBUILD}")
            continue
        found = _sha256(path)
        if found != shard["sha256"]:
            problems.append(f"{path} changed after it was written (sha256 {found[:12]}..., {MANIFEST_FILE} says "
                            f"{shard['sha256'][:12]}...): copy it again from the build, or {REBUILD}")
    logger.info("verified the sha256 of %d shard(s) in %s: %d changed", len(manifest.shards), root, len(problems))
    return problems


_ENCODED = {K.ENCODED: tf.io.FixedLenFeature([], tf.string)}
_NAMED = {K.SOURCE_ID: tf.io.FixedLenFeature([], tf.string, default_value=""),
          K.FILENAME: tf.io.FixedLenFeature([], tf.string, default_value=""), **_ENCODED}


def _failed_records(path: str, indices: set[int]) -> dict[int, tuple[str, str, bytes | None]]:
    """(image id, file name, image bytes) of the records at `indices` of one shard, in one read
    of it; ("", "", None) for a record whose Example does not parse."""
    found = {}
    records = tf.data.TFRecordDataset(path, compression_type=compression_type([path]))
    for index, serialized in enumerate(records.take(max(indices) + 1)):
        if index in indices:
            try:
                parsed = tf.io.parse_single_example(serialized, _NAMED)
                found[index] = (parsed[K.SOURCE_ID].numpy().decode(errors="replace"),
                                parsed[K.FILENAME].numpy().decode(errors="replace"), parsed[K.ENCODED].numpy())
            except tf.errors.InvalidArgumentError:
                found[index] = ("", "", None)
    return found


def _decoded(serialized: tf.Tensor) -> tf.Tensor:
    return decode_check(tf.io.parse_single_example(serialized, _ENCODED)[K.ENCODED])


def _shard_problems(path: str) -> list[BadRecord]:
    """The unreadable records of one shard: a checksum or framing error ends the shard's reading
    there (one BadRecord for it); records that do not parse or decode, each."""
    records = tf.data.TFRecordDataset(path, compression_type=compression_type([path]))
    count = 0
    try:
        for _ in records.map(lambda s: tf.constant(0), num_parallel_calls=AUTOTUNE):  # framing and CRC only
            count += 1
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
        return [BadRecord(path, count, "", "", f"the file is damaged there ({type(err).__name__}: "
                                               f"{op_error_line(err)}); copy it again from the build, or {REBUILD}")]
    # Each record parsed and decoded in parallel; the indices that fail are those missing.
    fine = records.enumerate().map(lambda i, s: (i, _decoded(s)), num_parallel_calls=AUTOTUNE,
                                   deterministic=False).ignore_errors()
    failed = set(range(count)) - {int(i) for i, _ in fine.as_numpy_iterator()}
    if not failed:
        return []
    bad = []
    for index, (image_id, filename, data) in sorted(_failed_records(path, failed).items()):
        why = "its Example does not parse" if data is None else (decode_problem(data) or "it cannot be decoded")
        bad.append(BadRecord(path, index, image_id, filename,
                             f"TensorFlow cannot decode it ({why}): {REBUILD}, or replace the image"))
    return bad


def _all_read(files: list[str]) -> bool:
    """Whether every record of `files` reads and decodes: one parallel pass over all of them, the
    common case; which record failed is found shard by shard only when one did."""
    if not files:
        return True
    try:
        records = tf.data.TFRecordDataset(files, compression_type=compression_type(files),
                                          num_parallel_reads=min(len(files), 8))
        for _ in records.map(_decoded, num_parallel_calls=AUTOTUNE, deterministic=False).batch(256):
            pass
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
        return False
    return True


def unreadable_records(files: list[str]) -> list[BadRecord]:
    """Every record of `files` that cannot be read or decoded as the steps read it, in shard order."""
    if _all_read(files):
        logger.info("checked every record of %d shard(s) reads and decodes: all do", len(files))
        return []
    bad = []
    for path in files:
        bad += _shard_problems(path)
    logger.info("checked every record of %d shard(s) reads and decodes: %d unreadable", len(files), len(bad))
    return bad


def problem_line(bad: list[BadRecord]) -> str:
    """One line for the records found: the first in full, the others by image id."""
    more = bad[1:]
    others = ", ".join(repr(b.image_id) if b.image_id else f"record {b.index} of {b.shard}" for b in more[:5])
    return bad[0].line() + (f" ({len(more)} more: {others}{', ...' if len(more) > 5 else ''})" if more else "")


def check_readable(files: list[str]) -> None:
    """Raise `UnreadableShards` (one line) when any record of `files` cannot be read or decoded."""
    bad = unreadable_records(files)
    if bad:
        raise UnreadableShards(problem_line(bad))


def split_files(data_dir: str, splits: tuple[str, ...] = ("train", "val")) -> list[str]:
    """The shard files of each of `splits` that has shards (`records.shard_files`)."""
    from components.detector.records import ShardsChanged, shard_files

    files = []
    for split in splits:
        try:
            files += shard_files(data_dir, split)
        except ShardsChanged:
            raise
        except FileNotFoundError:  # a split with no shards: the steps that need it say so
            continue
    return files


def check_shards(data_dir: str, verify_sha256: bool) -> None:
    """Before a step reads `data_dir`: with `verify_sha256`, every shard against the manifest's
    sha256 (`changed_shards`); and every record decoded (`check_readable`) when the manifest does
    not say the build did it. Raises `UnreadableShards` naming the first problem."""
    if verify_sha256:
        problems = changed_shards(data_dir)
        if problems:
            raise UnreadableShards(problems[0] + (f" ({len(problems) - 1} more shard(s) changed)"
                                                  if len(problems) > 1 else ""))
    if not decoded_at_build(data_dir):
        files = split_files(data_dir)
        stats = [(path, tf.io.gfile.stat(path)) for path in files]
        key = tuple((path, stat.length, stat.mtime_nsec) for path, stat in stats)
        if key in _READABLE:  # this process checked these very files (a search's trials train on one folder)
            return
        logger.info("%s: its manifest does not say the build decoded every image with TensorFlow (an earlier "
                    "build, another converter's shards, a tuning split): checking each record decodes", data_dir)
        check_readable(files)
        _READABLE.add(key)


_READABLE: set[tuple] = set()  # the shard files (path, size, mtime) check_shards found readable in this process


@contextmanager
def naming_bad_records(data_dir: str, splits: tuple[str, ...] = ("train", "val")) -> Iterator[None]:
    """Turn a decode or checksum error raised in the block (by a reader of `data_dir`'s shards)
    into `UnreadableShards` naming the record and its shard, found by `unreadable_records` over
    the `splits`' shards, only after an error; any other error, or one no record explains,
    passes as it is."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
        logger.warning("a read error (%s); looking for the record behind it in %s", type(err).__name__, data_dir)
        bad = unreadable_records(split_files(data_dir, splits))
        if bad:
            raise UnreadableShards(problem_line(bad)) from err
        raise
