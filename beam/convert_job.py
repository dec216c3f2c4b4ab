"""validate-and-convert: the Beam job from source annotations to checked, sharded TFRecords.

Every input record ends up either in a shard or in a rejects file (`rejects-*.jsonl`) with a reason;
`manifest.json` reconciles the counts. Runs on the DirectRunner locally and takes
DataflowRunner options through `beam_args`.

Example (the CLI does the same; the options are declared in beam/options.py)::

    build_dataset(ConvertOptions(images="imgs", annotations="xml", output="out"))
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import ContextManager
from dataclasses import asdict, dataclass

import apache_beam as beam
import pyarrow as pa
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam import job_transforms as jt
from beam import record_checks as rc
from beam.coco_reader import read_coco
from beam.contract import feature_keys as K
from beam.contract.files import read_rejects, write_json
from beam.contract.manifest import (LABEL_MAP_FILE, MANIFEST_FILE, REJECTS_GLOB, BoxCounts, Manifest, is_rejects_file,
                                    near_duplicate_line, output_folder_problem, rejects_file_count, stats_file_name,
                                    written_by_build)
from beam.contract.rejects import Reject
from beam.contract.train_keys import TRAIN_KEYS_FILE, write_train_keys
from beam.csv_reader import read_csv
from beam.data_workers import WORKER_MALLOC_ENV, default_workers, usable_cpu_count, worker_skips
from beam.dataset_gates import dataset_problems, normalised_coordinates_problems
from beam.feature_batches import read_batches
from beam.job_outputs import EXAMPLES_KEPT, JOB_DIR, JobSummary, features_files, job_path, publish, read_job_outputs
from beam.local_worker import failing_when_a_worker_dies
from beam.options import FORMATS, ConvertOptions
from beam.runner import runner_and_options
from beam.source_records import AnnotationError
from beam.split import TRAIN, VAL, given_split_conflict, read_split_file
from beam.tfdv_checks import feature_statistics
from beam.voc_reader import list_voc_files

logger = logging.getLogger(__name__)

@dataclass
class ConvertResult:
    output: str
    manifest: Manifest
    anomalies: list[str]
    allowed: bool = False  # anomalies were found but --allow-anomalies lets the step pass

    @property
    def ok(self) -> bool:
        return not self.anomalies or self.allowed


class OutputNotEmpty(ValueError):
    """`--output` holds files (an earlier build): readers would mix them in."""


def prepare_output(output: str, overwrite: bool, unrecognised_ok: bool = False) -> list[str]:
    """An output folder to build into. A non-empty one is refused unless `overwrite`, which
    removes what a build writes there (the shards, manifest, stats, ...: BUILD_FILES) and
    keeps every other file; a folder that is not an earlier build is refused even then,
    unless `unrecognised_ok`. Returns the names kept."""
    if not (tf.io.gfile.isdir(output) and tf.io.gfile.listdir(output)):
        try:
            tf.io.gfile.makedirs(output)
        except tf.errors.OpError as err:
            raise DataBuildError(f"--output {output} cannot be created ({err.message})") from None
        return []
    names = [n.rstrip("/") for n in tf.io.gfile.listdir(output)]
    problem = output_folder_problem(output, names, overwrite, unrecognised_ok)
    if problem:
        raise OutputNotEmpty(f"--output {problem}")
    if names == [JOB_DIR]:  # only a build that did not finish (killed, out of memory): nothing any reader takes
        logger.warning("--output %s: removing %s/, left by a build that did not finish", output, JOB_DIR)
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


def job_options(options: ConvertOptions, records: int) -> tuple[object, PipelineOptions]:
    """The runner and its options (`runner_and_options`), with `num_workers` worker
    processes locally (default: `default_workers` for `records`), which start without
    WORKER_SKIPPED_IMPORTS, and without GCS's client too when no path of the job is on gs://."""
    return runner_and_options(options.runner, options.beam_args,
                              options.num_workers or default_workers(records, usable_cpu_count()), WORKER_MALLOC_ENV,
                              worker_skips((options.images, options.annotations, options.output,
                                            options.val_annotations, options.val_images)))


def _list_sources(options: ConvertOptions) -> list:
    """What the job starts from: VOC file paths (parsed in parallel by the job), or the
    records of a COCO/CSV file (one file, parsed here); with `val_annotations`, those of
    both."""
    sources = _sources_of(options.annotations, options.data_format)
    if options.val_annotations:
        sources += _sources_of(options.val_annotations, options.data_format)
    return sources


def _sources_of(annotations: str, fmt: str) -> list:
    if fmt == "voc":
        files = list_voc_files(annotations)
        if not files:
            raise DataBuildError(f"no *.xml annotation files under {annotations}")
        return files
    if not FileSystems.exists(annotations):
        raise DataBuildError(f"annotation file {annotations} not found")
    try:
        records = read_coco(annotations) if fmt == "coco" else read_csv(annotations)
    except AnnotationError as err:
        raise DataBuildError(str(err)) from err
    if not records:
        raise DataBuildError(f"no records in {annotations}")
    return records


def _run_beam(options: ConvertOptions, sources: list, split_of: dict[str, str] | None,
              hold_job: Callable[[object], ContextManager] | None = None) -> None:
    """Run the job and wait for it. `hold_job(result)`: the context the wait runs in (the
    pipeline step's: a Dataflow job recorded as the step's and cancelled when the step is
    stopped); None: Beam's own `with Pipeline()`."""
    runner, pipeline_options = job_options(options, len(sources))
    with failing_when_a_worker_dies():
        if hold_job is None:
            with beam.Pipeline(runner=runner, options=pipeline_options) as p:
                _job_graph(p, options, sources, split_of)
            return
        p = beam.Pipeline(runner=runner, options=pipeline_options)
        _job_graph(p, options, sources, split_of)
        result = p.run()
        with hold_job(result):
            result.wait_until_finish()  # raises when the job failed (Dataflow's too)


def _job_graph(p, options: ConvertOptions, sources: list, split_of: dict[str, str] | None) -> None:
    """The job: every output through its own sinks into OUTPUT/_job/ (beam/job_outputs.py)."""
    out = options.output
    check_options = rc.CheckOptions(keep_empty=options.keep_empty, label_map=options.label_map,
                                    max_pixels=options.max_pixels, exif=options.exif, bad_box=options.bad_box)
    # Create reshuffles its elements (lists of sources), so with several workers the
    # parsing is shared too.
    read = p | "Sources" >> beam.Create(jt.chunked(sources)) | "Read" >> jt.ReadRecords()
    checked = read | "Check" >> jt.CheckRecords(options.images, check_options, len(sources), options.given_split)
    label_map = checked[jt.RECORDS] | "LabelMap" >> jt.LabelMap(out, options.label_map, options.base_label_map)
    split = checked[jt.RECORDS] | "Split" >> jt.SplitRecords(
        options.val_fraction, options.seed, split_of, options.split_file, options.target_shard_bytes,
        options.min_shards, options.given_split)
    placed = split[jt.RECORDS]
    _ = placed | "Write" >> jt.WriteShards(out, options.gzip, split["shard_counts"], label_map)
    _ = ((checked[jt.REJECTS], split[jt.REJECTS], placed | "DroppedBoxes" >> beam.FlatMap(jt.dropped_boxes))
         | "AllRejects" >> beam.Flatten()
         | "Rejects" >> jt.WriteRejects(out, rejects_file_count(len(sources))))
    parts = [placed | "RecordSummary" >> beam.Map(jt.chunk_summary)]
    if split_of is not None:
        parts.append(jt.unknown_split_ids(read["ids"], split_of))
    _ = parts | "AllSummaryParts" >> beam.Flatten() | "Summary" >> jt.Summarise(out)


def _write_statistics(out: str) -> None:
    """TFDV statistics per split of the features files the job wrote, into
    OUTPUT/_job/stats-SPLIT.pb, and from the same train batches (the files read once)
    OUTPUT/_job/train_keys.txt: the train images' keys a warm start compares with its
    champion's (beam/contract/train_keys.py). They run here, in the driver's own process, on
    features only (no image bytes): TFDV's own import (beyond TensorFlow's, which the workers'
    image checks pay) would cost each of the job's workers more before its first record."""
    keys: list[str] = []
    for split in (TRAIN, VAL):
        batches = (batch for path in features_files(out, split) for batch in read_batches(path))
        stats = feature_statistics(_noting_keys(batches, keys) if split == TRAIN else batches)
        with FileSystems.create(job_path(out, stats_file_name(split))) as handle:
            handle.write(stats.SerializeToString())
    write_train_keys(FileSystems.join(out, JOB_DIR), keys)


def _noting_keys(batches: Iterable[pa.RecordBatch], keys: list[str]) -> Iterator[pa.RecordBatch]:
    """The batches unchanged, each one's image keys added to `keys` as it passes."""
    for batch in batches:
        keys += (key.decode() for key in batch.column(batch.schema.names.index(K.KEY_SHA256)).flatten().to_pylist())
        yield batch


def _facts_by_kind(counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """{"color_modes/L": 3, ...} → {"color_modes": {"L": 3}, ...}"""
    out: dict[str, dict[str, int]] = {"color_modes": {}, "exif_orientation": {"applied": 0, "ignored": 0},
                                      "converted_formats": {}, "boxes_in": {}, "boxes_written": {}}
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
                       summary: JobSummary) -> tuple[dict | None, list[str]]:
    """The manifest's `split_file` entry, and the anomaly line when listed ids match no record."""
    if split_of is None:
        return None, []
    unknown, examples = summary.unknown_ids, summary.unknown_id_examples
    counts = {"listed": len(split_of), "matched": len(split_of) - unknown, "unknown": unknown,
              "unknown_examples": examples[:EXAMPLES_KEPT]}
    if not unknown:
        return counts, []
    shown = ", ".join(examples[:EXAMPLES_KEPT]) + (f", ... ({unknown - EXAMPLES_KEPT} more)"
                                                      if unknown > EXAMPLES_KEPT else "")
    return counts, [f"(split file) | ids that match no image | {unknown} of the {len(split_of)} ids in "
                    f"{options.split_file} match no annotation record: {shown} (a typo, or images missing from "
                    "--images/--annotations?)"]


def _box_counts(facts: dict[str, dict[str, int]], rejects: list[Reject]) -> dict[str, BoxCounts]:
    """Per split: the boxes of the written images, those written and those dropped by reason
    (counted from the rejects file itself, so the manifest reconciles with it)."""
    dropped = {split: Counter(r.reason for r in rejects if r.is_box and r.split == split) for split in (TRAIN, VAL)}
    return {split: BoxCounts(boxes_in=facts["boxes_in"].get(split, 0), written=facts["boxes_written"].get(split, 0),
                             rejected_by_reason=dict(dropped[split])) for split in (TRAIN, VAL)}


def build_dataset(options: ConvertOptions,
                  count_tiles: Callable[[str, dict[str, int]], dict] | None = None,
                  hold_job: Callable[[object], ContextManager] | None = None) -> ConvertResult:
    """Run the whole step and write manifest, label map, schema, anomalies and stats HTML.
    `count_tiles(output, label_map)`: the manifest's `tiles` from the written shards (the caller's
    components.detector.tile_counts: beam/ imports nothing of the steps above it); `hold_job`:
    the context the job's wait runs in (`_run_beam`; the pipeline step's, from components.cloud)."""
    if options.data_format not in FORMATS:
        raise NotImplementedError(f"format {options.data_format!r} is not built yet; available: {', '.join(FORMATS)}")
    if not 0.0 <= options.val_fraction < 1.0:
        raise DataBuildError(f"--val-fraction must be in [0, 1), got {options.val_fraction}")
    conflict = given_split_conflict(options.split_file, options.val_annotations, options.val_images)
    if conflict:
        raise DataBuildError(conflict)
    started = time.monotonic()
    sources = _list_sources(options)
    prepare_output(options.output, options.overwrite, options.overwrite_unrecognised)
    logger.info("validate-and-convert: %d %s sources, runner %s", len(sources), options.data_format, options.runner)
    try:
        split_of = read_split_file(options.split_file) if options.split_file else None
    except (ValueError, OSError) as err:
        raise DataBuildError(f"--split-file: {err}") from err
    try:
        _run_beam(options, sources, split_of, hold_job)
        _write_statistics(options.output)
        return _finish(options, sources, started, split_of, count_tiles)
    finally:
        job = FileSystems.join(options.output, JOB_DIR)
        if tf.io.gfile.isdir(job):
            tf.io.gfile.rmtree(job)


def _publish_job_files(out: str, shards: list[dict]) -> None:
    """Move the job's shards, rejects files and statistics into OUTPUT."""
    job = FileSystems.join(out, JOB_DIR)
    present = {n.rstrip("/") for n in tf.io.gfile.listdir(job)} if tf.io.gfile.isdir(job) else set()
    names = [s["name"] for s in shards] + sorted(n for n in present if is_rejects_file(n))
    publish(out, names + sorted(n for n in present if n in (stats_file_name(TRAIN), stats_file_name(VAL),
                                                            TRAIN_KEYS_FILE)))


def _finish(options: ConvertOptions, sources: list, started: float, split_of: dict[str, str] | None = None,
            count_tiles: Callable[[str, dict[str, int]], dict] | None = None) -> ConvertResult:
    """Read the job's outputs, move its files into place, run the dataset gates, write the
    label map and, last, the manifest."""
    out = options.output
    job = read_job_outputs(out)
    shards = sorted(job.shards + jt.write_empty_shards(out, job.shard_counts, job.shards, options.gzip),
                    key=lambda s: s["name"])
    jt.write_empty_rejects(out, rejects_file_count(len(sources)))
    _publish_job_files(out, shards)
    split_file, split_problems = _split_file_counts(options, split_of, job.summary)
    label_map = job.label_map
    if not label_map:
        raise DataBuildError("no record with a box passed the checks: no classes to train on "
                             f"(see {FileSystems.join(out, REJECTS_GLOB)})")
    facts = _facts_by_kind(job.summary.counts)
    written = Counter()
    for shard in shards:
        written[shard["split"]] += shard["records"]
    rejects = read_rejects(out)
    images_rejected = Counter(r.reason for r in rejects if not r.is_box)

    found = split_problems + normalised_coordinates_problems(facts.get("first_pixel_boxes", {}).get("all", 0),
                                                             sum(facts["boxes_written"].values()))
    anomalies = dataset_problems(out, label_map, written, sum(images_rejected.values()), len(sources), options.gates,
                                 found, boxes=facts["boxes_written"])
    tiles = count_tiles(out, label_map) if count_tiles else {}  # the photos in tiles as training would cut them
    manifest = Manifest(
        format=options.data_format, decoded_with_tensorflow=True,  # decoding.pixels_problem, in the checks
        records_in=len(sources),
        written={TRAIN: written[TRAIN], VAL: written[VAL]},
        rejected_by_reason=dict(images_rejected),
        boxes=_box_counts(facts, rejects),
        class_boxes=_class_counts(facts),
        split_file=split_file,
        near_duplicates={"iou_above": rc.NEAR_DUPLICATE_IOU, "pairs": job.summary.near_duplicates,
                         "examples": job.summary.near_duplicate_examples},
        color_modes=facts["color_modes"],
        # Images with an EXIF orientation: written upright (applied) or as stored (ignored).
        exif_orientation={"mode": options.exif, **facts["exif_orientation"]},
        converted_formats=dict(sorted(facts["converted_formats"].items())),
        tiles=tiles,
        num_classes=len(label_map),
        shards=shards,
        anomalies=anomalies,
        anomalies_allowed=bool(anomalies) and options.allow_anomalies,
        # How many workers ran the job is not what it wrote: left out, so the manifest of
        # one worker and of several match.
        options={k: v for k, v in asdict(options).items()
                 if k not in ("beam_args", "label_map", "base_label_map", "overwrite", "overwrite_unrecognised",
                              "num_workers")},
        seconds=round(time.monotonic() - started, 1),
    )
    _write_manifest(out, manifest, label_map, options.allow_anomalies)
    return ConvertResult(out, manifest, anomalies, allowed=options.allow_anomalies)


def _write_manifest(out: str, manifest: Manifest, label_map: dict[str, int], allow_anomalies: bool) -> None:
    """Check that the counts reconcile, then write the label map and, last, the manifest; say
    the near duplicates and the anomalies."""
    if manifest.near_duplicates["pairs"]:
        logger.warning("%s", near_duplicate_line(manifest))
    problems = manifest.reconcile_problems()
    if problems:
        raise DataBuildError("counts do not reconcile: " + "; ".join(problems))
    write_json(FileSystems.join(out, LABEL_MAP_FILE), label_map)
    write_json(FileSystems.join(out, MANIFEST_FILE), manifest.to_dict())
    log = logger.warning if allow_anomalies else logger.error
    for line in manifest.anomalies:
        log("dataset anomaly: %s", line)
