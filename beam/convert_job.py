"""validate-and-convert: the Beam job from source annotations to checked, sharded TFRecords.

Every input record ends up either in a shard or in `rejects.jsonl` with a reason;
`manifest.json` reconciles the counts. Runs on the DirectRunner locally and takes
DataflowRunner options through `beam_args`.

Example (the CLI does the same)::

    build_dataset(ConvertOptions(images="imgs", annotations="xml", output="out"))
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import apache_beam as beam
import tensorflow as tf
import tensorflow_data_validation as tfdv
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam import record_checks as rc
from beam.example_codec import encode_example
from beam.label_map import derive_label_map
from beam.shard_writer import (
    DEFAULT_MIN_SHARDS,
    DEFAULT_TARGET_SHARD_BYTES,
    shard_count,
    shard_index,
    shard_name,
    write_shard,
)
from beam.source_records import CheckedRecord, Reject, SourceRecord
from beam.split import TRAIN, VAL, assign_split
from beam.tfdv_checks import anomaly_lines, find_anomalies, infer_schema, stats_transform, statistics_html
from beam.voc_reader import AnnotationError, list_voc_files, read_voc_file

logger = logging.getLogger(__name__)

FORMATS = ("voc",)
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ConvertOptions:
    images: str
    annotations: str
    output: str
    format: str = "voc"
    val_fraction: float = 0.2
    seed: int = 0
    label_map: dict[str, int] | None = None
    keep_empty: bool = True
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
    min_shards: int = DEFAULT_MIN_SHARDS
    runner: str = "DirectRunner"
    beam_args: tuple[str, ...] = field(default=())


@dataclass
class ConvertResult:
    output: str
    manifest: dict
    anomalies: list[str]

    @property
    def ok(self) -> bool:
        return not self.anomalies


class DataBuildError(RuntimeError):
    """The input cannot be converted at all (no annotations, bad options)."""


def _read_source(path: str) -> SourceRecord | Reject:
    try:
        return read_voc_file(path)
    except AnnotationError as err:
        image_id = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        return Reject(image_id, rc.BAD_ANNOTATION, f"annotation cannot be read: {err}", path)


def _dedupe(item: tuple[str, list[SourceRecord]]):
    """Keep the first record of an image id (by source), reject the others."""
    _, records = item
    records = sorted(records, key=lambda r: r.source_ref)
    yield records[0]
    for dup in records[1:]:
        yield Reject(dup.image_id, rc.DUPLICATE_IMAGE_ID,
                     f"image id also annotated in {records[0].source_ref}", dup.source_ref)


class _CheckRecord(beam.DoFn):
    def __init__(self, images_dir: str, options: rc.CheckOptions):
        self._images_dir = images_dir.rstrip("/")
        self._options = options

    def process(self, record):
        if isinstance(record, Reject):
            yield record
            return
        path = FileSystems.join(self._images_dir, record.filename)
        try:
            with FileSystems.open(path) as handle:
                data = handle.read()
        except (OSError, IOError, FileNotFoundError):
            data = None
        yield rc.check_record(record, data, self._options)


class _WriteShard(beam.DoFn):
    def __init__(self, output: str):
        self._output = output

    def process(self, item, counts):
        (split, index), keyed = item
        path = FileSystems.join(self._output, shard_name(split, index, counts[split]))
        yield write_shard(path, split, keyed)


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


def _label_map_of(class_names: list[str], given: dict[str, int] | None) -> dict[str, int]:
    return given if given is not None else derive_label_map(class_names)


def _run_beam(options: ConvertOptions, files: list[str]) -> None:
    output = options.output
    check_options = rc.CheckOptions(keep_empty=options.keep_empty, label_map=options.label_map)
    pipeline_options = PipelineOptions(list(options.beam_args), runner=options.runner)
    with beam.Pipeline(runner=_runner(options.runner), options=pipeline_options) as p:
        checked = (
            p
            | "ListAnnotations" >> beam.Create(files, reshuffle=False)
            | "Read" >> beam.Map(_read_source)
            | "KeyById" >> beam.Map(lambda r: (r.image_id, r))
            | "GroupById" >> beam.GroupByKey()
            | "Dedupe" >> beam.FlatMap(lambda kv: _dedupe((kv[0], list(kv[1]))))
            | "Check" >> beam.ParDo(_CheckRecord(options.images, check_options))
        )
        rejects = checked | "Rejects" >> beam.Filter(lambda r: isinstance(r, Reject))
        good = checked | "Good" >> beam.Filter(lambda r: isinstance(r, CheckedRecord))
        # Derived from the records that passed the checks (a given map is used as is).
        label_map = (
            good
            | "ClassNames" >> beam.FlatMap(lambda r: set(r.class_texts))
            | "UniqueNames" >> beam.Distinct()
            | "NamesToList" >> beam.combiners.ToList()
            | "LabelMap" >> beam.Map(_label_map_of, options.label_map)
        )
        _ = label_map | "WriteLabelMap" >> beam.Map(
            lambda m: _write_json(FileSystems.join(output, "_label_map.json"), m))
        encoded = good | "Encode" >> beam.Map(
            lambda r, m: (assign_split(r.image_id, options.val_fraction, options.seed), r.image_id,
                          encode_example(r, m).SerializeToString(), r.color_mode),
            beam.pvalue.AsSingleton(label_map),
        )
        totals = (
            encoded
            | "SizeBySplit" >> beam.Map(lambda e: (e[0], (1, len(e[2]))))
            | "SumBySplit" >> beam.CombinePerKey(lambda vs: tuple(map(sum, zip(*vs))) if vs else (0, 0))
        )
        counts = (
            p
            | "One" >> beam.Create([None])
            | "ShardCounts" >> beam.Map(lambda _, t: _shard_counts(t, options), beam.pvalue.AsDict(totals))
        )
        _ = counts | "WriteCounts" >> beam.Map(lambda c: _write_json(FileSystems.join(output, "_shard_counts.json"), c))
        counts_view = beam.pvalue.AsSingleton(counts)
        shard_infos = (
            encoded
            | "KeyByShard" >> beam.Map(lambda e, c: ((e[0], shard_index(e[1], c[e[0]])), (e[1], e[2])), counts_view)
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(output), counts_view)
        )
        _ = (
            shard_infos
            | "ShardsToList" >> beam.combiners.ToList()
            | "WriteShardList" >> beam.Map(
                lambda infos: _write_json(FileSystems.join(output, "_shards.json"),
                                          sorted((i.to_dict() for i in infos), key=lambda d: d["name"])))
        )
        _ = (
            rejects
            | "RejectsToList" >> beam.combiners.ToList()
            | "WriteRejects" >> beam.Map(lambda rs: _write_rejects(FileSystems.join(output, "rejects.jsonl"), rs))
        )
        _ = (
            encoded
            | "ColorModes" >> beam.Map(lambda e: e[3])
            | "CountModes" >> beam.combiners.Count.PerElement()
            | "ModesToList" >> beam.combiners.ToList()
            | "WriteModes" >> beam.Map(lambda m: _write_json(FileSystems.join(output, "_color_modes.json"), dict(sorted(m))))
        )
        for split in (TRAIN, VAL):
            examples = (
                encoded
                | f"Only{split}" >> beam.Filter(lambda e, s=split: e[0] == s)
                | f"Serialized{split}" >> beam.Map(lambda e: e[2])
            )
            stats_transform(examples, split, FileSystems.join(output, f"stats-{split}.pb"))


def _write_text(path: str, text: str) -> None:
    """Create (or replace) a file, even an empty one, locally or on gs://."""
    with FileSystems.create(path) as handle:
        handle.write(text.encode())


def _write_json(path: str, data) -> None:
    _write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_rejects(path: str, rejects: list[Reject]) -> None:
    rows = sorted((r.to_json_dict() for r in rejects), key=lambda d: (d["source"], d["image_id"]))
    _write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


def _pop_json(path: str, default):
    """Read and delete a side file the Beam job left (absent when it saw no records)."""
    if not tf.io.gfile.exists(path):
        return default
    with tf.io.gfile.GFile(path) as handle:
        data = json.load(handle)
    tf.io.gfile.remove(path)
    return data


def _read_rejects(path: str) -> list[dict]:
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _fill_empty_shards(output: str, shards: list[dict], counts: dict[str, int]) -> list[dict]:
    """Hash assignment can leave a shard empty: write it as an empty file so every
    name `-of-N` exists and readers see a complete set."""
    present = {s["name"] for s in shards}
    for split, count in counts.items():
        for index in range(count):
            name = shard_name(split, index, count)
            if name not in present:
                shards.append(write_shard(FileSystems.join(output, name), split, []).to_dict())
    return sorted(shards, key=lambda s: s["name"])


def build_dataset(options: ConvertOptions) -> ConvertResult:
    """Run the whole step and write manifest, label map, schema, anomalies and stats HTML."""
    if options.format not in FORMATS:
        raise NotImplementedError(f"format {options.format!r} is not built yet; available: {', '.join(FORMATS)}")
    if not 0.0 <= options.val_fraction < 1.0:
        raise DataBuildError(f"--val-fraction must be in [0, 1), got {options.val_fraction}")
    started = time.monotonic()
    files = list_voc_files(options.annotations)
    if not files:
        raise DataBuildError(f"no *.xml annotation files under {options.annotations}")
    tf.io.gfile.makedirs(options.output)
    logger.info("validate-and-convert: %d annotation files, runner %s", len(files), options.runner)
    _run_beam(options, files)

    out = options.output
    label_map = _pop_json(FileSystems.join(out, "_label_map.json"), {})
    if not label_map:
        raise DataBuildError("no record with a box passed the checks: no classes to train on "
                             f"(see {FileSystems.join(out, 'rejects.jsonl')})")
    shards = _pop_json(FileSystems.join(out, "_shards.json"), [])
    color_modes = _pop_json(FileSystems.join(out, "_color_modes.json"), {})
    counts = _pop_json(FileSystems.join(out, "_shard_counts.json"), {TRAIN: 1, VAL: 1})
    written = Counter()
    for shard in shards:
        written[shard["split"]] += shard["records"]
    shards = _fill_empty_shards(out, shards, counts)
    rejects = _read_rejects(FileSystems.join(out, "rejects.jsonl"))
    if not tf.io.gfile.exists(FileSystems.join(out, "rejects.jsonl")):
        _write_rejects(FileSystems.join(out, "rejects.jsonl"), [])

    anomalies = _schema_and_anomalies(out, label_map, written)
    manifest = {
        "version": MANIFEST_VERSION,
        "format": options.format,
        "records_in": len(files),
        "written": {TRAIN: written[TRAIN], VAL: written[VAL]},
        "written_total": written[TRAIN] + written[VAL],
        "rejected": len(rejects),
        "rejected_by_reason": dict(sorted(Counter(r["reason"] for r in rejects).items())),
        "color_modes": color_modes,
        "num_classes": len(label_map),
        "shards": shards,
        "anomalies": anomalies,
        "options": {k: v for k, v in asdict(options).items() if k not in ("beam_args", "label_map")},
        "seconds": round(time.monotonic() - started, 1),
    }
    if manifest["written_total"] + manifest["rejected"] != manifest["records_in"]:
        raise DataBuildError(
            f"counts do not reconcile: {manifest['records_in']} in, {manifest['written_total']} written, "
            f"{manifest['rejected']} rejected")
    _write_json(FileSystems.join(out, "label_map.json"), label_map)
    _write_json(FileSystems.join(out, "manifest.json"), manifest)
    return ConvertResult(out, manifest, anomalies)


def _schema_and_anomalies(out: str, label_map: dict[str, int], written: Counter) -> list[str]:
    """Infer the schema on train, validate both splits; returns one line per problem."""
    problems = [f"split {split!r} has no examples" for split in (TRAIN, VAL) if not written[split]]
    stats = {s: tfdv.load_stats_binary(FileSystems.join(out, f"stats-{s}.pb")) for s in (TRAIN, VAL)
             if written[s]}
    if TRAIN not in stats:
        return problems
    schema = infer_schema(stats[TRAIN], num_labels=max(label_map.values()))
    tfdv.write_schema_text(schema, FileSystems.join(out, "schema.pbtxt"))
    all_anomalies = {}
    for split, split_stats in stats.items():
        anomalies = find_anomalies(split_stats, schema)
        all_anomalies[split] = anomalies
        problems.extend(f"[{split}] {line}" for line in anomaly_lines(anomalies))
    _write_text(FileSystems.join(out, "anomalies.txt"), "\n".join(problems) + ("\n" if problems else "no anomalies\n"))
    if VAL in stats:
        _write_text(FileSystems.join(out, "stats.html"), statistics_html(stats[TRAIN], stats[VAL]))
    return problems
