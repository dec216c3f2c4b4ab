"""The named stages of the validate-and-convert job, each a composite transform (one box
in the Dataflow UI) over plain functions: read, check, split, write, statistics, rejects,
summary. Everything a stage needs travels in its arguments or as a side input: nothing
is shared with the driver, so the stages run the same in separate worker processes (the
local multi-process runner, Dataflow) as in one.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import replace

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam import record_checks as rc
from beam.job_outputs import (EXAMPLES_KEPT, LABEL_MAP_OUTPUT, SHARD_LIST_OUTPUT, SUMMARY_OUTPUT, CombineSummaries,
                              JobSummary, job_path, write_one)
from beam.manifest import rejects_file_name, stats_file_name
from beam.label_map import derive_label_map, extend_label_map
from beam.shard_writer import ShardWriter, shard_count, shard_index, shard_name
from beam.source_records import AnnotationError, CheckedRecord, Reject, SourceRecord, image_id_from_filename
from beam.split import TRAIN, VAL, assign_split
from beam.voc_reader import read_voc_file

logger = logging.getLogger(__name__)


def read_bytes(path: str) -> bytes:
    """The file's bytes as stored (an image named .gz is not decompressed), local or gs://."""
    with FileSystems.get_filesystem(path).open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def _parse(source) -> SourceRecord | Reject:
    """A VOC file path is parsed here (on a worker); COCO/CSV records arrive parsed."""
    if not isinstance(source, str):
        return source
    try:
        return read_voc_file(source)
    except AnnotationError as err:
        return Reject(image_id_from_filename(source), rc.BAD_ANNOTATION, f"annotation cannot be read: {err}", source)


class ReadRecords(beam.PTransform):
    """Sources → (image id, [records of that id])."""

    def expand(self, sources):
        return (sources
                | "Parse" >> beam.Map(_parse)
                | "KeyById" >> beam.Map(lambda r: (r.image_id, r))
                | "GroupById" >> beam.GroupByKey())


def _dedupe(item: tuple[str, list]):
    """Keep the first record of an image id (by source), reject the others."""
    records = sorted(item[1], key=lambda r: r.source_ref)
    yield records[0]
    for dup in records[1:]:
        yield Reject(dup.image_id, rc.DUPLICATE_IMAGE_ID, f"image id also annotated in {records[0].source_ref}",
                     dup.source_ref)


class _CheckRecord(beam.DoFn):
    """Check one record against its image (read once, decoded once). Logs its progress
    every PROGRESS_EVERY records, which `detpipe run --local` shows on its live line."""

    PROGRESS_EVERY = 250

    def __init__(self, images_dir: str, options: rc.CheckOptions, total: int):
        self._images_dir = images_dir.rstrip("/")
        self._options = options
        self._total = total

    def setup(self):
        self._seen = self._logged = 0

    def _log(self):
        logger.info("checked %d records on worker %d (%d in the job)", self._seen, os.getpid(), self._total)
        self._logged = self._seen

    def process(self, record):
        self._seen += 1
        if self._seen % self.PROGRESS_EVERY == 0:
            self._log()
        if isinstance(record, Reject):
            yield record
            return
        path = FileSystems.join(self._images_dir, record.filename)
        try:
            data = read_bytes(path)
        except (OSError, IOError, FileNotFoundError):
            data = None
        yield rc.check_record(record, data, self._options, image_path=path)

    def finish_bundle(self):
        if self._seen != self._logged:
            self._log()


REJECTS, RECORDS = "rejects", "records"


def _tagged(item):
    """A Reject under `rejects`, anything else under `records`."""
    return beam.pvalue.TaggedOutput(REJECTS if isinstance(item, Reject) else RECORDS, item)


class CheckRecords(beam.PTransform):
    """(id, records) → tagged `records` (CheckedRecord) and `rejects` (Reject)."""

    def __init__(self, images_dir: str, options: rc.CheckOptions, total: int):
        super().__init__()
        self._check = _CheckRecord(images_dir, options, total)

    def expand(self, by_id):
        return (by_id
                | "Dedupe" >> beam.FlatMap(_dedupe)
                | "Check" >> beam.ParDo(self._check)
                | "Sort" >> beam.Map(_tagged).with_outputs(REJECTS, RECORDS))


def _place(record: CheckedRecord, val_fraction: float, seed: int, split_of: dict[str, str] | None,
           split_file: str | None):
    if split_of is None:
        return assign_split(record.image_id, val_fraction, seed), record
    if record.image_id not in split_of:
        return Reject(record.image_id, rc.NOT_IN_SPLIT_FILE, f"image id not listed in {split_file}",
                      record.source_ref)
    return split_of[record.image_id], record


def _shard_counts(totals: dict, target_bytes: int, min_shards: int) -> dict[str, int]:
    return {split: shard_count(*totals.get(split, (0, 0)), target_bytes, min_shards) for split in (TRAIN, VAL)}


def _sum_pairs(pairs) -> tuple[int, int]:
    return tuple(map(sum, zip(*pairs))) if pairs else (0, 0)


class SplitRecords(beam.PTransform):
    """Checked records → tagged `records` ((split, record)) and `rejects` (ids the split
    file leaves out), and `shard_counts`: {split: number of shards}, by the bytes each
    split will hold."""

    def __init__(self, val_fraction: float, seed: int, split_of: dict[str, str] | None, split_file: str | None,
                 target_bytes: int, min_shards: int):
        super().__init__()
        self._place_args = (val_fraction, seed, split_of, split_file)
        self._shards = (target_bytes, min_shards)

    def expand(self, records):
        placed = (records
                  | "Assign" >> beam.Map(_place, *self._place_args)
                  | "Sort" >> beam.Map(_tagged).with_outputs(REJECTS, RECORDS))
        totals = (placed[RECORDS]
                  | "SizeBySplit" >> beam.Map(lambda sr: (sr[0], (1, sr[1].image_size)))
                  | "SumBySplit" >> beam.CombinePerKey(_sum_pairs))
        counts = (records.pipeline
                  | "One" >> beam.Create([None])
                  | "ShardCounts" >> beam.Map(lambda _, t, shards: _shard_counts(t, *shards),
                                              beam.pvalue.AsDict(totals), self._shards))
        return {RECORDS: placed[RECORDS], REJECTS: placed[REJECTS], "shard_counts": counts}


def _label_map_of(class_names: list[str], given: dict[str, int] | None,
                  base: dict[str, int] | None = None) -> dict[str, int]:
    if given is not None:
        return given
    return extend_label_map(base, class_names) if base else derive_label_map(class_names)


class LabelMap(beam.PTransform):
    """Checked records → one label map (the given one, or derived from the classes of the
    records that passed the checks, keeping a base map's ids), also written as a job output."""

    def __init__(self, output: str, given: dict[str, int] | None, base: dict[str, int] | None):
        super().__init__()
        self._output, self._given, self._base = output, given, base

    def expand(self, records):
        import json

        label_map = (records
                     | "ClassNames" >> beam.FlatMap(lambda r: set(r.class_texts))
                     | "UniqueNames" >> beam.Distinct()
                     | "NamesToList" >> beam.combiners.ToList()
                     | "Derive" >> beam.Map(_label_map_of, self._given, self._base))
        write_one(label_map | "ToJson" >> beam.Map(lambda m: json.dumps(m, sort_keys=True)),
                  self._output, LABEL_MAP_OUTPUT, "Write")
        return label_map


STATS = "stats"


class _WriteShard(beam.DoFn):
    """Write one shard into OUTPUT/_job/: its records sorted by image id, each image read
    (the checks kept no pixels: no shuffle holds image bytes) and encoded. An empty group
    is an empty shard, so every name `-of-N` exists. Emits the shard's facts, and under
    `stats` the (split, Arrow batch) of its features for the statistics."""

    def __init__(self, output: str, gzip: bool):
        self._output = output
        self._gzip = gzip

    def process(self, item, counts, label_map):
        from beam.example_codec import record_features, to_example, written_image
        from beam.tfdv_checks import features_batch

        (split, index), records = item
        records = sorted((r for r in records if r is not None), key=lambda r: r.image_id)
        path = job_path(self._output, shard_name(split, index, counts[split], self._gzip))
        rows = []
        with ShardWriter(path, split) as writer:
            for record in records:
                image_bytes, digest = written_image(record, read_bytes(record.image_path))
                rows.append(record_features(record, digest, label_map))
                writer.write(to_example(rows[-1], image_bytes).SerializeToString())
        yield writer.info.to_dict()
        if rows:
            yield beam.pvalue.TaggedOutput(STATS, (split, features_batch(rows)))


class WriteShards(beam.PTransform):
    """(split, record) → deterministic shards in OUTPUT/_job/ (by a hash of the image id),
    the shard list written as a job output; returns the tagged `stats` batches."""

    def __init__(self, output: str, gzip: bool, shard_counts, label_map):
        super().__init__()
        self._output, self._gzip, self._counts, self._label_map = output, gzip, shard_counts, label_map

    def expand(self, placed):
        import json

        counts = beam.pvalue.AsSingleton(self._counts)
        keyed = placed | "KeyByShard" >> beam.Map(
            lambda sr, c: ((sr[0], shard_index(sr[1].image_id, c[sr[0]])), sr[1]), counts)
        every_shard = self._counts | "EveryShard" >> beam.FlatMap(
            lambda c: [((split, i), None) for split in sorted(c) for i in range(c[split])])
        written = ((keyed, every_shard)
                   | "WithEmpty" >> beam.Flatten()
                   | "GroupByShard" >> beam.GroupByKey()
                   | "Write" >> beam.ParDo(_WriteShard(self._output, self._gzip), counts,
                                           beam.pvalue.AsSingleton(self._label_map)).with_outputs(STATS, main="shards"))
        write_one(written.shards | "ToJson" >> beam.Map(lambda d: json.dumps(d, sort_keys=True)),
                  self._output, SHARD_LIST_OUTPUT, "WriteList")
        return written[STATS]


class Statistics(beam.PTransform):
    """(split, Arrow batch) → TFDV statistics per split, OUTPUT/_job/stats-SPLIT.pb."""

    def __init__(self, output: str):
        super().__init__()
        self._output = output

    def expand(self, batches):
        from beam.tfdv_checks import stats_transform

        return {split: stats_transform(batches | f"Only{split}" >> beam.FlatMap(
                    lambda e, s=split: [e[1]] if e[0] == s else []), split, job_path(self._output, stats_file_name(split)))
                for split in (TRAIN, VAL)}


def _write_rejects(item, output: str, count: int) -> str:
    import json

    from beam.output_files import write_text

    index, rejects = item
    rows = sorted((r.to_dict() for r in rejects if r is not None),
                  key=lambda d: (d["source"], d["image_id"], d.get("box", -1)))
    name = rejects_file_name(index, count)
    write_text(job_path(output, name), "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return name


class WriteRejects(beam.PTransform):
    """Every reject → `count` files OUTPUT/_job/rejects-I-of-N.jsonl (by a hash of the
    source), each sorted by source, so reruns match; every file exists, empty or not."""

    def __init__(self, output: str, count: int):
        super().__init__()
        self._output, self._count = output, count

    def expand(self, rejects):
        from beam.split import stable_fraction

        count = self._count
        keyed = rejects | "KeyByFile" >> beam.Map(
            lambda r: (min(count - 1, int(stable_fraction(r.source_ref, seed=-2) * count)), r))
        every_file = rejects.pipeline | "EveryFile" >> beam.Create([(i, None) for i in range(count)])
        return ((keyed, every_file)
                | "WithEmpty" >> beam.Flatten()
                | "GroupByFile" >> beam.GroupByKey()
                | "Write" >> beam.Map(_write_rejects, self._output, count))


def dropped_boxes(placed: tuple[str, CheckedRecord]) -> list[Reject]:
    """The box-level rejects of a written record, with the split its image went to."""
    split, record = placed
    return [replace(r, split=split) for r in record.dropped_boxes]


def record_summary(placed: tuple[str, CheckedRecord]) -> JobSummary:
    """What the manifest counts of one written record: its colour mode, for an image with
    an EXIF orientation whether it was applied, its boxes in and written and per class, and
    its near-duplicate box pairs (as lines)."""
    split, record = placed
    counts = Counter({f"color_modes/{record.color_mode}": 1,
                      f"boxes_in/{split}": len(record.boxes) + len(record.dropped_boxes),
                      f"boxes_written/{split}": len(record.boxes)})
    counts.update(f"class_boxes/{split}/{name}" for name in record.class_texts)
    if record.exif_orientation != 1:
        counts[f"exif_orientation/{'applied' if record.orientation_applied else 'ignored'}"] += 1
    pairs = [f"{record.image_id}: boxes {i} and {j} ({record.class_texts[i]!r}, IoU {iou:.2f})"
             for i, j, iou in rc.near_duplicates(record)]
    return JobSummary(counts=dict(counts), near_duplicates=len(pairs),
                      near_duplicate_examples=sorted(pairs)[:EXAMPLES_KEPT])


class Summarise(beam.PTransform):
    """Summary parts → one combined `JobSummary`, written as a job output."""

    def __init__(self, output: str):
        super().__init__()
        self._output = output

    def expand(self, parts):
        summary = parts | "Combine" >> beam.CombineGlobally(CombineSummaries())
        return write_one(summary | "ToJson" >> beam.Map(lambda s: s.to_json()), self._output, SUMMARY_OUTPUT, "Write")


def unknown_split_ids(by_id, split_of: dict[str, str]):
    """Summary parts for the split file's ids that no annotation record has (typos, images
    left out of the copy)."""
    listed = by_id.pipeline | "SplitIds" >> beam.Create(sorted(split_of)) | "KeySplitIds" >> beam.Map(lambda i: (i, 1))
    return ({"listed": listed, "records": by_id | "RecordIds" >> beam.Map(lambda kv: (kv[0], 1))}
            | "MatchSplitIds" >> beam.CoGroupByKey()
            | "Unknown" >> beam.FlatMap(lambda kv: [] if kv[1]["records"] else
                                        [JobSummary(unknown_ids=1, unknown_id_examples=[kv[0]])]))
