"""validate-and-convert: the Beam job from source annotations to checked, sharded TFRecords.

Every input record ends up either in a shard or in `rejects.jsonl` with a reason;
`manifest.json` reconciles the counts. Runs on the DirectRunner locally and takes
DataflowRunner options through `beam_args`.

Example (the CLI does the same)::

    build_dataset(ConvertOptions(images="imgs", annotations="xml", output="out"))
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

import apache_beam as beam
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam import record_checks as rc
from beam.coco_reader import read_coco
from beam.csv_reader import read_csv
from beam.dataset_gates import GateOptions, dataset_problems
from beam.example_codec import encode_example
from beam.label_map import derive_label_map, extend_label_map
from beam.manifest import (LABEL_MAP_FILE, MANIFEST_FILE, REJECTS_FILE, BoxCounts, Manifest, earlier_build_problem,
                           near_duplicate_line, written_by_build)
from beam.output_files import pop_json, read_rejects, write_json, write_rejects
from beam.shard_writer import (
    DEFAULT_MIN_SHARDS,
    DEFAULT_TARGET_SHARD_BYTES,
    ShardWriter,
    shard_count,
    shard_index,
    shard_name,
    write_shard,
)
from beam.source_records import AnnotationError, CheckedRecord, Reject, SourceRecord, image_id_from_filename
from beam.split import TRAIN, VAL, assign_split, read_split_file
from beam.tfdv_checks import stats_transform
from beam.voc_reader import list_voc_files, read_voc_file

logger = logging.getLogger(__name__)

FORMATS = ("voc", "coco", "csv")


@dataclass(frozen=True)
class ConvertOptions:
    images: str
    annotations: str
    output: str
    format: str = "voc"
    val_fraction: float = 0.2
    seed: int = 0
    label_map: dict[str, int] | None = None
    # Ids to keep (the champion's): its classes keep their ids, new ones get the next ids.
    base_label_map: dict[str, int] | None = None
    keep_empty: bool = True
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
    min_shards: int = DEFAULT_MIN_SHARDS
    max_pixels: int = rc.CheckOptions.max_pixels
    split_file: str | None = None  # JSON {"train": [ids], "val": [ids]} instead of the hash split
    gzip: bool = False
    overwrite: bool = False  # remove what an earlier build wrote in the output folder (else refuse a non-empty one)
    overwrite_unrecognised: bool = False  # with overwrite: also build into a folder that is not an earlier build
    exif: str = "auto"  # auto | apply | ignore: the frame of the annotations (beam/exif.py)
    bad_box: str = rc.DROP_BOX  # drop | reject-image: what a box that cannot be trusted costs
    gates: GateOptions = field(default_factory=GateOptions)
    allow_anomalies: bool = False
    runner: str = "DirectRunner"
    beam_args: tuple[str, ...] = field(default=())


@dataclass
class ConvertResult:
    output: str
    manifest: Manifest
    anomalies: list[str]
    allowed: bool = False  # anomalies were found but --allow-anomalies lets the step pass

    @property
    def ok(self) -> bool:
        return not self.anomalies or self.allowed


# What the Beam job hands back to `build_dataset` (label map, shard list and counts, record
# facts, split-file ids that match no record): small files in OUTPUT/_job/, read once and
# removed, also when the build fails.
JOB_DIR = "_job"
# Split-file ids that match no record: how many the manifest and the error line name.
UNKNOWN_EXAMPLES = 5
# Near-duplicate box pairs: how many the manifest and the warning show.
NEAR_DUPLICATE_EXAMPLES = 5


def _job_file(output: str, name: str) -> str:
    return FileSystems.join(output, JOB_DIR, name)


def _remove_job_files(output: str) -> None:
    job = FileSystems.join(output, JOB_DIR)
    if tf.io.gfile.isdir(job):
        tf.io.gfile.rmtree(job)


class OutputNotEmpty(ValueError):
    """`--output` holds files (an earlier build): readers would mix them in."""


def prepare_output(output: str, overwrite: bool, unrecognised_ok: bool = False) -> list[str]:
    """An output folder to build into. A non-empty one is refused unless `overwrite`, which
    removes what a build writes there (the shards, manifest, stats, ...: BUILD_FILES) and
    keeps every other file; a folder that is not an earlier build is refused even then,
    unless `unrecognised_ok`. Returns the names kept."""
    if not (tf.io.gfile.isdir(output) and tf.io.gfile.listdir(output)):
        tf.io.gfile.makedirs(output)
        return []
    names = [n.rstrip("/") for n in tf.io.gfile.listdir(output)]
    if not overwrite:
        raise OutputNotEmpty(f"--output {output} is not empty (an earlier build?): choose an empty folder, "
                             "or pass --overwrite to replace what a build wrote there")
    problem = earlier_build_problem(names)
    if problem and not unrecognised_ok:
        raise OutputNotEmpty(f"--output {output}: {problem}; choose another folder, or pass "
                             "--overwrite-unrecognised to build there anyway (other files are kept)")
    for name in names:
        if written_by_build(name):
            path = FileSystems.join(output, name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
    kept = sorted(n for n in names if not written_by_build(n))
    if kept:
        logger.info("--output %s: kept %d file(s) a build does not write: %s", output, len(kept), ", ".join(kept[:5]))
    return kept


class DataBuildError(RuntimeError):
    """The input cannot be converted at all (no annotations, bad options)."""


def _read_source(path: str) -> SourceRecord | Reject:
    try:
        return read_voc_file(path)
    except AnnotationError as err:
        return Reject(image_id_from_filename(path), rc.BAD_ANNOTATION, f"annotation cannot be read: {err}", path)


def _dedupe(item: tuple[str, list[SourceRecord]]):
    """Keep the first record of an image id (by source), reject the others."""
    _, records = item
    records = sorted(records, key=lambda r: r.source_ref)
    yield records[0]
    for dup in records[1:]:
        yield Reject(dup.image_id, rc.DUPLICATE_IMAGE_ID,
                     f"image id also annotated in {records[0].source_ref}", dup.source_ref)


class _CheckRecord(beam.DoFn):
    """Check one record against its image. Logs "checked N/TOTAL records" every
    PROGRESS_EVERY records (per worker), which `detpipe run --local` shows on its live line."""

    PROGRESS_EVERY = 250

    def __init__(self, images_dir: str, options: rc.CheckOptions, total: int = 0):
        self._images_dir = images_dir.rstrip("/")
        self._options = options
        self._total = total
        self._seen = 0

    def process(self, record):
        self._seen += 1
        if self._seen % self.PROGRESS_EVERY == 0 or self._seen == self._total:
            logger.info("checked %d/%d records", self._seen, self._total)
        if isinstance(record, Reject):
            yield record
            return
        path = FileSystems.join(self._images_dir, record.filename)
        try:
            data = _read_bytes(path)
        except (OSError, IOError, FileNotFoundError):
            data = None
        yield rc.check_record(record, data, self._options, image_path=path)


def _read_bytes(path: str) -> bytes:
    with FileSystems.open(path) as handle:
        return handle.read()


EXAMPLES = "examples"


class _WriteShard(beam.DoFn):
    """Write one shard: its records sorted by image id, each image read again here and
    encoded, so that no shuffle holds image bytes. Also emits (split, example) under
    the `examples` tag for the statistics."""

    def __init__(self, output: str, gzip: bool):
        self._output = output
        self._gzip = gzip

    def process(self, item, counts, label_map):
        (split, index), records = item
        path = FileSystems.join(self._output, shard_name(split, index, counts[split], self._gzip))
        with ShardWriter(path, split) as writer:
            for record in sorted(records, key=lambda r: r.image_id):
                serialized = encode_example(record, _read_bytes(record.image_path), label_map).SerializeToString()
                writer.write(serialized)
                yield beam.pvalue.TaggedOutput(EXAMPLES, (split, serialized))
        yield writer.info


def _shard_counts(totals: dict, options: ConvertOptions) -> dict[str, int]:
    return {
        split: shard_count(totals.get(split, (0, 0))[0], totals.get(split, (0, 0))[1],
                           options.target_shard_bytes, options.min_shards)
        for split in (TRAIN, VAL)
    }


def _runner(name: str):
    """Beam's DirectRunner first tries the Prism runner, which downloads a binary from
    the internet; locally we go straight to the in-process FnApiRunner it would fall
    back to. Any other runner name is passed to Beam as given."""
    if name == "DirectRunner":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return name


def _assign_split(record: CheckedRecord, options: ConvertOptions,
                  split_of: dict[str, str] | None) -> tuple[str, CheckedRecord] | Reject:
    if split_of is None:
        return assign_split(record.image_id, options.val_fraction, options.seed), record
    if record.image_id not in split_of:
        return Reject(record.image_id, rc.NOT_IN_SPLIT_FILE, f"image id not listed in {options.split_file}",
                      record.source_ref)
    return split_of[record.image_id], record


def _label_map_of(class_names: list[str], given: dict[str, int] | None,
                  base: dict[str, int] | None = None) -> dict[str, int]:
    if given is not None:
        return given
    return extend_label_map(base, class_names) if base else derive_label_map(class_names)


def _list_sources(options: ConvertOptions) -> list:
    """What the job starts from: VOC file paths (parsed in parallel by the job), or the
    records of a COCO/CSV file (one file, parsed here)."""
    if options.format == "voc":
        files = list_voc_files(options.annotations)
        if not files:
            raise DataBuildError(f"no *.xml annotation files under {options.annotations}")
        return files
    if not FileSystems.exists(options.annotations):
        raise DataBuildError(f"annotation file {options.annotations} not found")
    try:
        records = read_coco(options.annotations) if options.format == "coco" else read_csv(options.annotations)
    except AnnotationError as err:
        raise DataBuildError(str(err)) from err
    if not records:
        raise DataBuildError(f"no records in {options.annotations}")
    return records


def _run_beam(options: ConvertOptions, sources: list, split_of: dict[str, str] | None) -> None:
    output = options.output
    check_options = rc.CheckOptions(keep_empty=options.keep_empty, label_map=options.label_map,
                                    max_pixels=options.max_pixels, exif=options.exif, bad_box=options.bad_box)
    pipeline_options = PipelineOptions(list(options.beam_args), runner=options.runner)
    with beam.Pipeline(runner=_runner(options.runner), options=pipeline_options) as p:
        by_id = (
            p
            | "Sources" >> beam.Create(sources, reshuffle=False)
            | "Read" >> beam.Map(lambda src: _read_source(src) if isinstance(src, str) else src)
            | "KeyById" >> beam.Map(lambda r: (r.image_id, r))
            | "GroupById" >> beam.GroupByKey()
        )
        checked = (
            by_id
            | "Dedupe" >> beam.FlatMap(lambda kv: _dedupe((kv[0], list(kv[1]))))
            | "Check" >> beam.ParDo(_CheckRecord(options.images, check_options, len(sources)))
        )
        if split_of is not None:
            # Ids of the split file that no annotation record has (typos, images left out of the copy).
            _ = (
                {"listed": (p | "SplitIds" >> beam.Create(sorted(split_of))
                            | "KeySplitIds" >> beam.Map(lambda i: (i, 1))),
                 "records": by_id | "RecordIds" >> beam.Map(lambda kv: (kv[0], 1))}
                | "MatchSplitIds" >> beam.CoGroupByKey()
                | "Unknown" >> beam.FlatMap(lambda kv: [kv[0]] if not kv[1]["records"] else [])
                | "UnknownToList" >> beam.combiners.ToList()
                | "WriteUnknown" >> beam.Map(lambda ids: write_json(_job_file(output, "split_unknown.json"),
                                                                    sorted(ids)))
            )
        rejects = checked | "Rejects" >> beam.Filter(lambda r: isinstance(r, Reject))
        good = checked | "Good" >> beam.Filter(lambda r: isinstance(r, CheckedRecord))
        # Derived from the records that passed the checks (a given map is used as is).
        label_map = (
            good
            | "ClassNames" >> beam.FlatMap(lambda r: set(r.class_texts))
            | "UniqueNames" >> beam.Distinct()
            | "NamesToList" >> beam.combiners.ToList()
            | "LabelMap" >> beam.Map(_label_map_of, options.label_map, options.base_label_map)
        )
        _ = label_map | "WriteLabelMap" >> beam.Map(
            lambda m: write_json(_job_file(output, "label_map.json"), m))
        assigned = good | "AssignSplit" >> beam.Map(_assign_split, options, split_of)
        placed = assigned | "Placed" >> beam.Filter(lambda r: not isinstance(r, Reject))
        rejects = (
            (rejects, assigned | "NotInSplit" >> beam.Filter(lambda r: isinstance(r, Reject)),
             placed | "DroppedBoxes" >> beam.FlatMap(_dropped_boxes))
            | "AllRejects" >> beam.Flatten()
        )
        totals = (
            placed
            | "SizeBySplit" >> beam.Map(lambda sr: (sr[0], (1, sr[1].image_size)))
            | "SumBySplit" >> beam.CombinePerKey(lambda vs: tuple(map(sum, zip(*vs))) if vs else (0, 0))
        )
        counts = (
            p
            | "One" >> beam.Create([None])
            | "ShardCounts" >> beam.Map(lambda _, t: _shard_counts(t, options), beam.pvalue.AsDict(totals))
        )
        _ = counts | "WriteCounts" >> beam.Map(lambda c: write_json(_job_file(output, "shard_counts.json"), c))
        counts_view = beam.pvalue.AsSingleton(counts)
        written = (
            placed
            | "KeyByShard" >> beam.Map(lambda sr, c: ((sr[0], shard_index(sr[1].image_id, c[sr[0]])), sr[1]),
                                       counts_view)
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(output, options.gzip), counts_view,
                                          beam.pvalue.AsSingleton(label_map)).with_outputs(EXAMPLES, main="shards")
        )
        shard_infos = written.shards
        _ = (
            shard_infos
            | "ShardsToList" >> beam.combiners.ToList()
            | "WriteShardList" >> beam.Map(
                lambda infos: write_json(_job_file(output, "shards.json"),
                                          sorted((i.to_dict() for i in infos), key=lambda d: d["name"])))
        )
        _ = (
            rejects
            | "RejectsToList" >> beam.combiners.ToList()
            | "WriteRejects" >> beam.Map(lambda rs: write_rejects(FileSystems.join(output, REJECTS_FILE), rs))
        )
        _ = (
            placed
            | "RecordFacts" >> beam.FlatMap(lambda sr: _record_facts(*sr))
            | "CountFacts" >> beam.CombinePerKey(sum)
            | "FactsToList" >> beam.combiners.ToList()
            | "WriteFacts" >> beam.Map(lambda m: write_json(_job_file(output, "record_facts.json"),
                                                            dict(sorted(m))))
        )
        # Each near-duplicate pair once, as a line; counted, and the first few kept as examples.
        near_duplicates = placed | "NearDuplicates" >> beam.FlatMap(_near_duplicate_examples)
        pairs = near_duplicates | "CountNearDuplicates" >> beam.combiners.Count.Globally()
        _ = (
            near_duplicates
            | "FirstNearDuplicates" >> beam.combiners.Top.Smallest(NEAR_DUPLICATE_EXAMPLES)
            | "WriteNearDuplicates" >> beam.Map(
                lambda rows, n: write_json(_job_file(output, "near_duplicates.json"), {"pairs": n, "examples": rows}),
                beam.pvalue.AsSingleton(pairs))
        )
        for split in (TRAIN, VAL):
            examples = (
                written[EXAMPLES]
                | f"Only{split}" >> beam.Filter(lambda e, s=split: e[0] == s)
                | f"Serialized{split}" >> beam.Map(lambda e: e[1])
            )
            stats_transform(examples, split, FileSystems.join(output, f"stats-{split}.pb"))


def _dropped_boxes(placed: tuple[str, CheckedRecord]) -> list[Reject]:
    """The box-level rejects of a written record, with the split its image went to."""
    split, record = placed
    return [replace(r, split=split) for r in record.dropped_boxes]


def _near_duplicate_examples(placed: tuple[str, CheckedRecord]) -> list[str]:
    """One line per near-duplicate pair of a written record (sorted by image id in the manifest)."""
    _, record = placed
    return [f"{record.image_id}: boxes {i} and {j} ({record.class_texts[i]!r}, IoU {iou:.2f})"
            for i, j, iou in rc.near_duplicates(record)]


def _record_facts(split: str, record: CheckedRecord) -> list[tuple[str, int]]:
    """What the manifest counts of each written record: its colour mode, for an image with
    an EXIF orientation whether it was applied, and its boxes in and written per split."""
    facts = [(f"color_modes/{record.color_mode}", 1),
             (f"boxes_in/{split}", len(record.boxes) + len(record.dropped_boxes)),
             (f"boxes_written/{split}", len(record.boxes))]
    facts += [(f"class_boxes/{split}/{name}", count) for name, count in sorted(Counter(record.class_texts).items())]
    if record.exif_orientation != 1:
        facts.append((f"exif_orientation/{'applied' if record.orientation_applied else 'ignored'}", 1))
    return facts


def _facts_by_kind(counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """{"color_modes/L": 3, ...} → {"color_modes": {"L": 3}, ...}"""
    out: dict[str, dict[str, int]] = {"color_modes": {}, "exif_orientation": {"applied": 0, "ignored": 0},
                                      "boxes_in": {}, "boxes_written": {}}
    for key, count in counts.items():
        kind, value = key.split("/", 1)
        out.setdefault(kind, {})[value] = count
    return out


def _class_counts(facts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Boxes written per split and class name: {"train": {"cat": 12}, "val": {...}}."""
    out: dict[str, dict[str, int]] = {TRAIN: {}, VAL: {}}
    for key, count in sorted(facts.get("class_boxes", {}).items()):
        split, name = key.split("/", 1)
        out[split][name] = count
    return out


def _split_file_counts(options: ConvertOptions, split_of: dict[str, str] | None,
                       unknown: list[str]) -> tuple[dict | None, list[str]]:
    """The manifest's `split_file` entry, and the anomaly line when listed ids match no record."""
    if split_of is None:
        return None, []
    counts = {"listed": len(split_of), "matched": len(split_of) - len(unknown), "unknown": len(unknown),
              "unknown_examples": unknown[:UNKNOWN_EXAMPLES]}
    if not unknown:
        return counts, []
    shown = ", ".join(unknown[:UNKNOWN_EXAMPLES]) + (f", ... ({len(unknown) - UNKNOWN_EXAMPLES} more)"
                                                     if len(unknown) > UNKNOWN_EXAMPLES else "")
    return counts, [f"(split file) | ids that match no image | {len(unknown)} of the {len(split_of)} ids in "
                    f"{options.split_file} match no annotation record: {shown} (a typo, or images missing from "
                    "--images/--annotations?)"]


def _box_counts(facts: dict[str, dict[str, int]], rejects: list[Reject]) -> dict[str, BoxCounts]:
    """Per split: the boxes of the written images, those written and those dropped by reason
    (counted from the rejects file itself, so the manifest reconciles with it)."""
    dropped = {split: Counter(r.reason for r in rejects if r.is_box and r.split == split) for split in (TRAIN, VAL)}
    return {split: BoxCounts(boxes_in=facts["boxes_in"].get(split, 0), written=facts["boxes_written"].get(split, 0),
                             rejected_by_reason=dict(dropped[split])) for split in (TRAIN, VAL)}


def _fill_empty_shards(output: str, shards: list[dict], counts: dict[str, int], gzip: bool) -> list[dict]:
    """Hash assignment can leave a shard empty: write it as an empty file so every
    name `-of-N` exists and readers see a complete set."""
    present = {s["name"] for s in shards}
    for split, count in counts.items():
        for index in range(count):
            name = shard_name(split, index, count, gzip)
            if name not in present:
                shards.append(write_shard(FileSystems.join(output, name), split, ()).to_dict())
    return sorted(shards, key=lambda s: s["name"])


def build_dataset(options: ConvertOptions) -> ConvertResult:
    """Run the whole step and write manifest, label map, schema, anomalies and stats HTML."""
    if options.format not in FORMATS:
        raise NotImplementedError(f"format {options.format!r} is not built yet; available: {', '.join(FORMATS)}")
    if not 0.0 <= options.val_fraction < 1.0:
        raise DataBuildError(f"--val-fraction must be in [0, 1), got {options.val_fraction}")
    started = time.monotonic()
    sources = _list_sources(options)
    prepare_output(options.output, options.overwrite, options.overwrite_unrecognised)
    logger.info("validate-and-convert: %d %s sources, runner %s", len(sources), options.format, options.runner)
    try:
        split_of = read_split_file(options.split_file) if options.split_file else None
    except (ValueError, OSError) as err:
        raise DataBuildError(f"--split-file: {err}") from err
    try:
        _run_beam(options, sources, split_of)
        return _finish(options, sources, started, split_of)
    finally:
        _remove_job_files(options.output)


def _finish(options: ConvertOptions, sources: list, started: float,
            split_of: dict[str, str] | None = None) -> ConvertResult:
    """Read back what the job handed over, run the dataset gates, write the manifest."""
    out = options.output
    split_file, split_problems = _split_file_counts(options, split_of,
                                                    pop_json(_job_file(out, "split_unknown.json"), []))
    label_map = pop_json(_job_file(out, "label_map.json"), {})
    if not label_map:
        raise DataBuildError("no record with a box passed the checks: no classes to train on "
                             f"(see {FileSystems.join(out, REJECTS_FILE)})")
    shards = pop_json(_job_file(out, "shards.json"), [])
    facts = _facts_by_kind(pop_json(_job_file(out, "record_facts.json"), {}))
    counts = pop_json(_job_file(out, "shard_counts.json"), {TRAIN: 1, VAL: 1})
    written = Counter()
    for shard in shards:
        written[shard["split"]] += shard["records"]
    shards = _fill_empty_shards(out, shards, counts, options.gzip)
    rejects = read_rejects(FileSystems.join(out, REJECTS_FILE))  # written by the job, empty if none
    images_rejected = Counter(r.reason for r in rejects if not r.is_box)

    anomalies = dataset_problems(out, label_map, written, sum(images_rejected.values()), len(sources), options.gates,
                                 split_problems)
    manifest = Manifest(
        format=options.format,
        records_in=len(sources),
        written={TRAIN: written[TRAIN], VAL: written[VAL]},
        rejected_by_reason=dict(images_rejected),
        boxes=_box_counts(facts, rejects),
        class_boxes=_class_counts(facts),
        split_file=split_file,
        near_duplicates={"iou_above": rc.NEAR_DUPLICATE_IOU,
                         **pop_json(_job_file(out, "near_duplicates.json"), {"pairs": 0, "examples": []})},
        color_modes=facts["color_modes"],
        # Images with an EXIF orientation: written upright (applied) or as stored (ignored).
        exif_orientation={"mode": options.exif, **facts["exif_orientation"]},
        num_classes=len(label_map),
        shards=shards,
        anomalies=anomalies,
        anomalies_allowed=bool(anomalies) and options.allow_anomalies,
        options={k: v for k, v in asdict(options).items()
                 if k not in ("beam_args", "label_map", "base_label_map", "overwrite", "overwrite_unrecognised")},
        seconds=round(time.monotonic() - started, 1),
    )
    if manifest.near_duplicates["pairs"]:
        logger.warning("%s", near_duplicate_line(manifest))
    problems = manifest.reconcile_problems()
    if problems:
        raise DataBuildError("counts do not reconcile: " + "; ".join(problems))
    write_json(FileSystems.join(out, LABEL_MAP_FILE), label_map)
    write_json(FileSystems.join(out, MANIFEST_FILE), manifest.to_dict())
    if anomalies:
        log = logger.warning if options.allow_anomalies else logger.error
        for line in anomalies:
            log("dataset anomaly: %s", line)
    return ConvertResult(out, manifest, anomalies, allowed=options.allow_anomalies)
