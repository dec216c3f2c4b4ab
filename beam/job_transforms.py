"""The named stages of the validate-and-convert job, each a composite transform (one box
in the Dataflow UI) over plain functions: read, check, split, write, statistics, rejects,
summary. Everything a stage needs travels in its arguments or as a side input: nothing
is shared with the driver, so the stages run the same in separate worker processes (the
local multi-process runner, Dataflow) as in one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam import record_checks as rc
from beam.contract import rejects as rj
from beam.contract.images import IMAGE_SUFFIXES, FileTooLarge
from beam.contract.label_map import derive_label_map, extend_label_map
from beam.contract.manifest import rejects_file_name
from beam.contract.rejects import Reject
from beam.file_bytes import FileSystemOf, read_bytes
from beam.job_outputs import (EXAMPLES_KEPT, LABEL_MAP_OUTPUT, SHARD_COUNTS_OUTPUT, SHARD_LIST_OUTPUT, SUMMARY_OUTPUT,
                              CombineSummaries, JobSummary, features_file_name, job_path, write_parts)
from beam.contract.shard_names import shard_name
from beam.contract.shards import ShardWriter, shard_count, shard_index
from beam.source_records import (AnnotationError, CheckedRecord, Records, SourceRecord, base_name, has_image_suffix,
                                 image_id_from_filename, inside_folder)
from beam.contract.stable_hash import stable_fraction
from beam.split import TRAIN, VAL, GivenSplit, assign_split
from beam.voc_reader import read_voc_file

logger = logging.getLogger(__name__)


def _parse(source, filesystem_of=FileSystems.get_filesystem) -> SourceRecord | Reject:
    """A VOC file path is parsed here (on a worker); COCO/CSV records arrive parsed."""
    if not isinstance(source, str):
        return source
    try:
        return read_voc_file(source, filesystem_of)
    except AnnotationError as err:
        return Reject(image_id_from_filename(source), rj.BAD_ANNOTATION, f"annotation cannot be read: {err}", source)


# Records travel between the job's stages in lists of this many, not one element each:
# Beam's cost per element (a call per stage, an encode and a decode at each stage
# boundary) was more than the checks of a record themselves (benchmarks/convert.py).
# Every output is sorted by its own key, so the lists change no byte of it.
RECORDS_PER_ELEMENT = 256


def chunked(sources: list, size: int | None = None) -> list[tuple[int, list]]:
    """(index, up to `size` (RECORDS_PER_ELEMENT) sources): what the job starts from.

    >>> chunked(["a", "b", "c"], 2)
    [(0, ['a', 'b']), (1, ['c'])]
    """
    size = size or RECORDS_PER_ELEMENT
    return [(index, Records(sources[start:start + size])) for index, start in enumerate(range(0, len(sources), size))]


def _parse_chunk(chunk: tuple[int, list]) -> tuple[int, list]:
    index, sources = chunk
    filesystem_of = FileSystemOf()
    return index, Records(_parse(source, filesystem_of) for source in sources)


# Image ids meet in this many groups (by a hash of the id) to find ids annotated twice: one
# element per group and chunk, not one per record (20,000 records through a GroupByKey cost
# ~1 s of encoding and decoding, ~10% of the job).
ID_GROUPS = 64


def id_group(image_id: str) -> int:
    return int(stable_fraction(image_id, seed=-3) * ID_GROUPS)


def _ids(chunk: tuple[int, list]):
    """(id group, [(image id, source, where)]) for each group of the chunk's parsed records
    and rejects; `where` = (chunk, position)."""
    index, records = chunk
    return _grouped((id_group(r.image_id), (r.image_id, r.source_ref, (index, position)))
                    for position, r in enumerate(records))


def _by_id(lists: list[list]) -> dict[str, list]:
    """{image id: [(source, where)]} of one id group's lists."""
    by_id: dict[str, list] = {}
    for image_id, source, where in (entry for entries in lists for entry in entries):
        by_id.setdefault(image_id, []).append((source, where))
    return by_id


def _duplicates(item: tuple[int, list]):
    """((chunk, position), first source) of every record but the first (by source) of an
    image id annotated more than once, in one id group's lists (from chunks 0 and 3 here).

    >>> list(_duplicates((7, [[("a", "b.xml", (0, 1)), ("c", "c.xml", (0, 2))], [("a", "a.xml", (3, 0))]])))
    [((0, 1), 'a.xml')]
    """
    for refs in _by_id(item[1]).values():
        refs.sort()
        yield from ((where, refs[0][0]) for _, where in refs[1:])


class ReadRecords(beam.PTransform):
    """Chunks of sources → `chunks`: (index, [SourceRecord | Reject]), `ids`: (id group,
    [[(image id, source, where)]]), and `duplicates`: (where, first source) of the records
    to reject as duplicates of an image id."""

    def expand(self, sources):
        chunks = sources | "Parse" >> beam.Map(_parse_chunk)
        ids = chunks | "Ids" >> beam.FlatMap(_ids) | "GroupById" >> beam.GroupByKey()
        return {"chunks": chunks, "ids": ids, "duplicates": ids | "Duplicates" >> beam.FlatMap(_duplicates)}


REJECTS, RECORDS = "rejects", "records"


def image_file_names(filename: str) -> list[str]:
    r"""Where under --images an annotation's file name is looked for: as it is, then (when it
    has folders) by its base name, then each with its extension in the other case. Exporters
    write the folder of the labelling machine or of the export (`images/a.jpg`,
    `C:\data\a.jpg`, LabelImg's absolute path) where the images now sit in --images itself,
    and a file `a.JPG` labelled on a case-blind disk (Windows, macOS) is `a.jpg` in its XML.
    Only a name that is not found costs the next look.

    >>> image_file_names("a.jpg"), image_file_names("C:\\data\\a.PNG")
    (['a.jpg', 'a.JPG'], ['C:\\data\\a.PNG', 'a.PNG', 'C:\\data\\a.png', 'a.png'])

    A name with no image suffix (VOC `<filename>000005</filename>`) is also looked for with
    each suffix of the formats taken:

    >>> image_file_names("000005")[:4], len(image_file_names("000005"))
    (['000005', '000005.jpg', '000005.jpeg', '000005.png'], 23)
    """
    base = base_name(filename)
    given = [filename, base] if inside_folder(filename) else [base]  # never a file outside the folder
    names = list(given)
    for name in given:
        stem, dot, ext = name.rpartition(".")
        if dot and "/" not in ext and "\\" not in ext:
            names.append(f"{stem}.{ext.upper() if ext.islower() else ext.lower()}")
    if not has_image_suffix(filename):  # `000005`, or a VOC file with no <filename>: its own name
        names += [name + suffix for name in given for case in (str.lower, str.upper)
                  for suffix in map(case, IMAGE_SUFFIXES)]
    return [name for name in dict.fromkeys(names) if inside_folder(name)]  # a base name of ".." is not


class _CheckChunk(beam.DoFn):
    """Check each record of a chunk against its image (read once, decoded once); emits the
    chunk's CheckedRecords under `records` and its Rejects under `rejects`, as lists. Logs
    its progress every PROGRESS_EVERY records, which `detpipe run --local` shows on its
    live line."""

    PROGRESS_EVERY = 250

    def __init__(self, images_dir: str, options: rc.CheckOptions, total: int, given: GivenSplit | None = None):
        self._images_dir = images_dir.rstrip("/")
        self._options = options
        self._total = total
        self._given = given

    def setup(self):
        self._seen = self._logged = 0
        self._filesystem_of = FileSystemOf()

    def _log(self):
        logger.info("checked %d records on worker %d (%d in the job)", self._seen, os.getpid(), self._total)
        self._logged = self._seen

    def _check(self, record: SourceRecord) -> CheckedRecord | Reject:
        folder = self._images_dir
        if self._given is not None and self._given.split_of(record.source_ref) == VAL:
            folder = self._given.val_images.rstrip("/")
        join = self._filesystem_of(folder).join
        paths = [join(folder, name) for name in image_file_names(record.filename)]
        data = None
        for path in paths:
            try:
                data = read_bytes(path, self._filesystem_of)
                break
            except FileTooLarge as err:
                return Reject(record.image_id, rj.IMAGE_TOO_LARGE, f"image {record.filename!r}: {err}",
                              record.source_ref)
            except (OSError, IOError, FileNotFoundError):
                continue  # not there under this name: the next
        if data is None and not inside_folder(record.filename):
            return Reject(record.image_id, rj.IMAGE_OUTSIDE_FOLDER,
                          f"image file {record.filename!r} is outside the images folder (absolute, a URL or with "
                          f"..): it is not read; its name {base_name(record.filename)!r} is not in {folder}",
                          record.source_ref)
        return rc.check_record(record, data, self._options, image_path=path if data is not None else
                               (paths[0] if paths else ""))

    def process(self, chunk, duplicates):
        index, records = chunk
        out = {RECORDS: Records(), REJECTS: Records()}
        for position, record in enumerate(records):
            first = duplicates.get((index, position))
            if first is not None:
                record = Reject(record.image_id, rj.DUPLICATE_IMAGE_ID, f"image id also annotated in {first}",
                                record.source_ref)
            elif not isinstance(record, Reject):
                record = self._check(record)
            out[REJECTS if isinstance(record, Reject) else RECORDS].append(record)
        self._seen += len(records)
        if self._seen - self._logged >= self.PROGRESS_EVERY:
            self._log()
        for tag, items in out.items():
            if items:
                yield beam.pvalue.TaggedOutput(tag, items)

    def finish_bundle(self):
        if self._seen != self._logged:
            self._log()


class CheckRecords(beam.PTransform):
    """`ReadRecords`' outputs → tagged `records` ([CheckedRecord]) and `rejects` ([Reject])."""

    def __init__(self, images_dir: str, options: rc.CheckOptions, total: int, given: GivenSplit | None = None):
        super().__init__()
        self._check = _CheckChunk(images_dir, options, total, given)

    def expand(self, read):
        return read["chunks"] | "Check" >> beam.ParDo(self._check, beam.pvalue.AsDict(read["duplicates"])).with_outputs(
            REJECTS, RECORDS)


def _place(records: list[CheckedRecord], val_fraction: float, seed: int, split_of: dict[str, str] | None,
           split_file: str | None, given: GivenSplit | None = None):
    """A list of (split, record) under `records`, and the records the split file leaves
    out under `rejects`. The split: the one the dataset comes with (`given`), the split
    file's (`split_of`), or the hash of the image id."""
    placed, rejects = Records(), Records()
    for record in records:
        if given is not None:
            placed.append((given.split_of(record.source_ref), record))
        elif split_of is None:
            placed.append((assign_split(record.image_id, val_fraction, seed), record))
        elif record.image_id in split_of:
            placed.append((split_of[record.image_id], record))
        else:
            rejects.append(Reject(record.image_id, rj.NOT_IN_SPLIT_FILE, f"image id not listed in {split_file}",
                                  record.source_ref))
    if placed:
        yield beam.pvalue.TaggedOutput(RECORDS, placed)
    if rejects:
        yield beam.pvalue.TaggedOutput(REJECTS, rejects)


def _sizes_by_split(placed: list[tuple[str, CheckedRecord]]) -> list[tuple[str, tuple[int, int]]]:
    totals: dict[str, list[int]] = {}
    for split, record in placed:
        total = totals.setdefault(split, [0, 0])
        total[0] += 1
        total[1] += record.image_size
    return [(split, (count, size)) for split, (count, size) in totals.items()]


def _shard_counts(totals: dict, target_bytes: int, min_shards: int) -> dict[str, int]:
    return {split: shard_count(*totals.get(split, (0, 0)), target_bytes, min_shards) for split in (TRAIN, VAL)}


def _sum_pairs(pairs) -> tuple[int, int]:
    return tuple(map(sum, zip(*pairs))) if pairs else (0, 0)


class SplitRecords(beam.PTransform):
    """Lists of checked records → tagged `records` ([(split, record)]) and `rejects` (ids
    the split file leaves out), and `shard_counts`: {split: number of shards}, by the
    bytes each split will hold."""

    def __init__(self, val_fraction: float, seed: int, split_of: dict[str, str] | None, split_file: str | None,
                 target_bytes: int, min_shards: int, given: GivenSplit | None = None):
        super().__init__()
        self._place_args = (val_fraction, seed, split_of, split_file, given)
        self._shards = (target_bytes, min_shards)

    def expand(self, records):
        placed = records | "Assign" >> beam.FlatMap(_place, *self._place_args).with_outputs(REJECTS, RECORDS)
        totals = (placed[RECORDS]
                  | "SizeBySplit" >> beam.FlatMap(_sizes_by_split)
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


class _NameUnion(beam.CombineFn):
    """Sets of class names → their union, sorted."""

    def create_accumulator(self) -> set:
        return set()

    def add_input(self, names: set, more: set) -> set:
        names |= more
        return names

    def merge_accumulators(self, accumulators) -> set:
        return set().union(*accumulators)

    def extract_output(self, names: set) -> list[str]:
        return sorted(names)


class LabelMap(beam.PTransform):
    """Lists of checked records → one label map (the given one, or derived from the classes
    of the records that passed the checks, keeping a base map's ids), also written as a job
    output."""

    def __init__(self, output: str, given: dict[str, int] | None, base: dict[str, int] | None):
        super().__init__()
        self._output, self._given, self._base = output, given, base

    def expand(self, records):
        label_map = (records
                     | "ClassNames" >> beam.Map(lambda rs: {t for r in rs for t in r.class_texts})
                     | "AllNames" >> beam.CombineGlobally(_NameUnion())
                     | "Derive" >> beam.Map(_label_map_of, self._given, self._base))
        write_parts(label_map, self._output, LABEL_MAP_OUTPUT, "Write")
        return label_map


class _WriteShard(beam.DoFn):
    """Write one shard into OUTPUT/_job/ from its lists of records: sorted by image id, each
    image read (the checks kept no pixels: no shuffle holds image bytes) and encoded. Beside
    it, the shard's features as an Arrow batch, which the driver's statistics read. Emits
    the shard's facts. Shards no record went to are written by the driver afterwards
    (`write_empty_shards`): here, only shards with records arrive."""

    def __init__(self, output: str, gzip: bool):
        self._output = output
        self._gzip = gzip

    def process(self, item, counts, label_map):
        from beam.contract.codec import example_bytes
        from beam.example_codec import record_features, written_image
        from beam.feature_batches import FeaturesWriter

        (split, index), lists = item
        records = sorted((r for records in lists for r in records), key=lambda r: r.image_id)
        name = shard_name(split, index, counts[split], self._gzip)
        filesystem_of = FileSystemOf()
        with (ShardWriter(job_path(self._output, name), split) as writer,
              FeaturesWriter(job_path(self._output, features_file_name(name))) as features):
            for record in records:
                image_bytes, digest = written_image(record, read_bytes(record.image_path, filesystem_of))
                row = record_features(record, digest, label_map)
                features.add(row)
                writer.write(example_bytes(row, image_bytes))
        yield writer.info.to_dict()


def _grouped(pairs) -> list[tuple[object, list]]:
    """(key, [values]) of (key, value) pairs: a list's share of each group, one element each.

    >>> _grouped([("a", 1), ("b", 2), ("a", 3)])
    [('a', [1, 3]), ('b', [2])]
    """
    groups: dict[object, list] = {}
    for key, value in pairs:
        groups.setdefault(key, Records()).append(value)
    return list(groups.items())


def _by_shard(placed: list[tuple[str, CheckedRecord]], counts: dict[str, int]):
    """((split, shard index), [records]) for each shard the list's records go to, in key
    order. Beam's local runner deals a GroupByKey's keys to its workers in turn in the order
    it first met them: so the first list's order (train 0, 1, 2, 3, val 0, ...) gives each
    worker every other shard of each split, not, by chance, three of the four large ones."""
    return sorted(_grouped(((split, shard_index(record.image_id, counts[split])), record) for split, record in placed),
                  key=lambda group: group[0])


class WriteShards(beam.PTransform):
    """Lists of (split, record) → deterministic shards in OUTPUT/_job/ (by a hash of the image id)
    and their features files, the shard list and the shard counts written as job outputs."""

    def __init__(self, output: str, gzip: bool, shard_counts, label_map):
        super().__init__()
        self._output, self._gzip, self._counts, self._label_map = output, gzip, shard_counts, label_map

    def expand(self, placed):
        counts = beam.pvalue.AsSingleton(self._counts)
        written = (placed
                   | "KeyByShard" >> beam.FlatMap(_by_shard, counts)
                   | "GroupByShard" >> beam.GroupByKey()
                   | "Write" >> beam.ParDo(_WriteShard(self._output, self._gzip), counts,
                                           beam.pvalue.AsSingleton(self._label_map)))
        write_parts(self._counts, self._output, SHARD_COUNTS_OUTPUT, "WriteCounts")
        return write_parts(written, self._output, SHARD_LIST_OUTPUT, "WriteList")


def write_empty_shards(output: str, counts: dict[str, int], listed: list[dict], gzip: bool) -> list[dict]:
    """Write into OUTPUT/_job/ each shard of `counts` that the job's list does not name (a
    split or a hash bucket no record went to): an empty file, so every name `-of-N` exists.
    Returns their facts. Done by the driver once the job has finished: in the job, every
    record would pass once more through a stage of its own to meet the shards' names there
    (a Flatten before the GroupByKey), ~0.2 s and ~15 MiB a worker at 20,000 records."""
    names = {shard["name"] for shard in listed}
    empty = []
    for split in sorted(counts):
        for index in range(counts[split]):
            name = shard_name(split, index, counts[split], gzip)
            if name not in names:
                with ShardWriter(job_path(output, name), split) as writer:
                    pass
                empty.append(writer.info.to_dict())
    return empty


def _write_rejects(item, output: str, count: int) -> str:
    import json

    from beam.contract.files import write_text

    index, lists = item
    rows = sorted((r.to_dict() for rejects in lists for r in rejects),
                  key=lambda d: (d["source"], d["image_id"], d.get("box", -1)))
    name = rejects_file_name(index, count)
    write_text(job_path(output, name), "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return name


def _by_rejects_file(rejects: list[Reject], count: int):
    """(file index, [rejects]) for each rejects file the list's rejects go to (by source)."""
    return _grouped((min(count - 1, int(stable_fraction(r.source_ref, seed=-2) * count)), r) for r in rejects)


class WriteRejects(beam.PTransform):
    """Lists of rejects → up to `count` files OUTPUT/_job/rejects-I-of-N.jsonl (by a hash of
    the source), each sorted by source, so reruns match. Files no reject went to are written
    (empty) by the driver afterwards (`write_empty_rejects`), as for the shards."""

    def __init__(self, output: str, count: int):
        super().__init__()
        self._output, self._count = output, count

    def expand(self, rejects):
        count = self._count
        return (rejects
                | "KeyByFile" >> beam.FlatMap(_by_rejects_file, count)
                | "GroupByFile" >> beam.GroupByKey()
                | "Write" >> beam.Map(_write_rejects, self._output, count))


def write_empty_rejects(output: str, count: int) -> None:
    """Write into OUTPUT/_job/ each of the `count` rejects files the job did not (empty), so
    every name `-of-N` exists."""
    from beam.contract.files import write_text

    for index in range(count):
        path = job_path(output, rejects_file_name(index, count))
        if not FileSystems.exists(path):
            write_text(path, "")


def dropped_boxes(placed: list[tuple[str, CheckedRecord]]) -> list[list[Reject]]:
    """The box-level rejects of the written records, with the split each image went to
    (one list, or none)."""
    rejects = [replace(r, split=split) for split, record in placed for r in record.dropped_boxes]
    return [Records(rejects)] if rejects else []


def _count_record(counts: dict[str, int], pairs: list[str], split: str, record: CheckedRecord) -> None:
    """Add what the manifest counts of one written record into `counts` and `pairs`: its
    colour mode, for an image with an EXIF orientation whether it was applied, the source
    format of an image written as PNG, its boxes within the image's first pixel, its boxes in
    and written and per class, and its near-duplicate box pairs (as lines)."""
    for key, value in ((f"color_modes/{record.color_mode}", 1),
                       (f"boxes_in/{split}", len(record.boxes) + len(record.dropped_boxes)),
                       (f"boxes_written/{split}", len(record.boxes)),
                       *((f"class_boxes/{split}/{name}", 1) for name in record.class_texts)):
        counts[key] = counts.get(key, 0) + value
    if record.exif_orientation != 1:
        key = f"exif_orientation/{'applied' if record.orientation_applied else 'ignored'}"
        counts[key] = counts.get(key, 0) + 1
    if record.converted_from:
        key = f"converted_formats/{record.converted_from}"
        counts[key] = counts.get(key, 0) + 1
    if record.width > 2 and record.height > 2:  # dataset_gates.normalised_coordinates_problems
        first_pixel = sum(1 for _, _, xmax, ymax in record.boxes
                          if xmax * record.width <= 1 and ymax * record.height <= 1)
        counts["first_pixel_boxes/all"] = counts.get("first_pixel_boxes/all", 0) + first_pixel
    pairs += [f"{record.image_id}: boxes {i} and {j} ({record.class_texts[i]!r}, IoU {iou:.2f})"
              for i, j, iou in rc.near_duplicates(record)]


def chunk_summary(placed: list[tuple[str, CheckedRecord]]) -> JobSummary:
    """What the manifest counts of the written records of a list (`_count_record`), as one
    summary part: counted into one dict, not a summary per record added up (19 -> 15 us a
    record; most of the rest is `near_duplicates`' numpy work on the ~1/3 of the demo's
    records that have a class twice)."""
    counts: dict[str, int] = {}
    pairs: list[str] = []
    for split, record in placed:
        _count_record(counts, pairs, split, record)
    return JobSummary(counts=counts, near_duplicates=len(pairs), near_duplicate_examples=sorted(pairs)[:EXAMPLES_KEPT])


class Summarise(beam.PTransform):
    """Summary parts → one combined `JobSummary`, written as a job output."""

    def __init__(self, output: str):
        super().__init__()
        self._output = output

    def expand(self, parts):
        # Without a default: a job with no part writes no summary, which reads as an empty one
        # (`read_job_outputs`); the default would cost a stage of its own.
        summary = parts | "Combine" >> beam.CombineGlobally(CombineSummaries()).without_defaults()
        return write_parts(summary, self._output, SUMMARY_OUTPUT, "Write", encode=JobSummary.to_json)


def _unknown_ids(item: tuple[int, dict]) -> list[JobSummary]:
    """A summary part naming the split file's ids of one id group that no record has."""
    _, joined = item
    known = {image_id for lists in joined["records"] for image_id in _by_id(lists)}
    unknown = sorted(set(joined["listed"]) - known)
    return [JobSummary(unknown_ids=len(unknown), unknown_id_examples=unknown[:EXAMPLES_KEPT])] if unknown else []


def unknown_split_ids(ids, split_of: dict[str, str]):
    """Summary parts for the split file's ids that no annotation record has (typos, images
    left out of the copy); `ids` is `ReadRecords`' output of that name."""
    listed = ids.pipeline | "SplitIds" >> beam.Create(sorted(split_of)) | "KeySplitIds" >> beam.Map(
        lambda i: (id_group(i), i))
    return ({"listed": listed, "records": ids}
            | "MatchSplitIds" >> beam.CoGroupByKey()
            | "Unknown" >> beam.FlatMap(_unknown_ids))
