"""`detpipe demo-data | data build`: the demo dataset and the data step's command.

Thin adapters over pipeline/demo_data.py and the Beam job (beam/convert_job.py).
"""

import os
import sys
from pathlib import Path

from beam.contract.manifest import output_folder_problem
from beam.data_workers import RECORDS_PER_WORKER
from beam.options import ConvertOptions
from beam.dataflow import RUNNERS
from pipeline.beam_options import add_dataflow_options, option_strings
from pipeline.cli_types import EXIT_OK, UsageError, count_range, existing_file, existing_path
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import images_dir, output_dir, pixel_range
from pipeline.cli_types import positive_int as _positive_int
from pipeline.params import BY_NAME, declared
from pipeline.preflight import annotations_problem, given_split_problem


def cmd_demo_data(args) -> int:
    from pipeline.demo_data import write_demo_dataset

    summary = write_demo_dataset(Path(args.out), num_train=args.train, num_val=args.val, seed=args.seed,
                                 object_size=args.object_size, image_size=args.photo_size, objects=args.objects)
    print(f"wrote {summary.num_images} images with {summary.num_objects} objects "
          f"({', '.join(f'{k}: {v}' for k, v in summary.objects_per_class.items())}) to {summary.output_dir}")
    return EXIT_OK


def _check_data_build_usage(args, beam_args: list[str]) -> list[str]:
    """What the command line alone can tell, before Beam and TensorFlow load; the job's Beam
    arguments (the Dataflow settings, then Beam's own options)."""
    problem = annotations_problem(args.annotations, args.data_format)
    if problem:
        raise UsageError(f"--annotations {problem}")
    val_problem = given_split_problem(args.data_format, args.val_annotations, args.val_images, args.split_file)
    if val_problem:
        raise UsageError(val_problem)
    from pipeline.beam_options import check_beam_args, dataflow_beam_args

    check_beam_args(beam_args, "detpipe data build", args.known_options)
    return list(dataflow_beam_args(args, args.runner, beam_args))


def cmd_data_build(args, beam_args: list[str]) -> int:
    beam_args = _check_data_build_usage(args, beam_args)
    if "://" not in args.output and os.path.isdir(args.output):
        problem = output_folder_problem(args.output, os.listdir(args.output), args.overwrite,
                                        args.overwrite_unrecognised)
        if problem:
            raise UsageError(f"--output {problem}")
    from beam.data_workers import prestarted_data_workers

    # The job's worker processes start now, while this process imports Beam and TensorFlow.
    with prestarted_data_workers(args.data_format, args.images, args.annotations, args.output, args.runner, beam_args,
                                 args.direct_num_workers, args.val_annotations, args.val_images):
        return _data_build(args, beam_args)


def _data_build(args, beam_args: list[str]) -> int:
    from beam.contract.label_map import read_label_map
    from functools import partial

    from beam.contract.manifest import REJECTS_GLOB, near_duplicate_line, tile_lines
    from beam.convert_job import build_dataset
    from beam.options import GateOptions
    from components.detector.tile_counts import count_tiles

    options = ConvertOptions(
        images=args.images, annotations=args.annotations, output=args.output, data_format=args.data_format,
        val_fraction=args.val_fraction, seed=args.seed,
        label_map=read_label_map(Path(args.label_map)) if args.label_map else None,
        keep_empty=not args.reject_empty, max_pixels=args.max_pixels, split_file=args.split_file,
        val_annotations=args.val_annotations, val_images=args.val_images, bad_box=args.bad_box,
        gzip=args.gzip, overwrite=args.overwrite, overwrite_unrecognised=args.overwrite_unrecognised, exif=args.exif,
        allow_anomalies=args.allow_anomalies,
        gates=GateOptions(schema_file=args.schema, max_reject_fraction=args.max_reject_fraction,
                          previous_stats=args.previous_stats, drift_threshold=args.drift_threshold,
                          allow_new_classes=args.allow_new_classes),
        runner=args.runner, num_workers=args.direct_num_workers, beam_args=tuple(beam_args),
    )
    result = build_dataset(options, count_tiles=partial(count_tiles, mode=args.tile))
    m = result.manifest
    print(f"{m.records_in} records in: {m.written['train']} train + {m.written['val']} val written, "
          f"{m.rejected} rejected -> {args.output}")
    for reason, count in m.rejected_by_reason.items():
        print(f"  rejected {count}: {reason} (details in {args.output}/{REJECTS_GLOB})")
    if m.converted_formats:
        print("  written as PNG: " + ", ".join(f"{count} {fmt}" for fmt, count in m.converted_formats.items()))
    for line in tile_lines(m):
        print("  " + line)
    if m.near_duplicates["pairs"]:
        print(f"detpipe: warning: {near_duplicate_line(m)}", file=sys.stderr)
    if args.val_annotations:
        print(f"  split: as the dataset comes: train from {args.annotations}, val from {args.val_annotations}")
    if m.split_file:
        print(f"  split file: {m.split_file['matched']} of its {m.split_file['listed']} ids matched a record"
              + (f", {m.split_file['unknown']} matched none" if m.split_file["unknown"] else ""))
    boxes = sum(c.boxes_in for c in m.boxes.values())
    for reason, count in m.boxes_rejected_by_reason.items():
        print(f"  box(es) dropped {count} of {boxes}: {reason}, their images kept (details in "
              f"{args.output}/{REJECTS_GLOB})")
    if result.anomalies:
        table = ["dataset anomalies (feature | problem | detail):", *result.anomalies]
        if not result.allowed:
            raise _fail_lines(table + ["pass --allow-anomalies to write the dataset anyway"])
        for line in table:
            print(f"detpipe: warning: {line}", file=sys.stderr)
    return EXIT_OK


def add_demo_data_command(sub) -> None:
    """Add `demo-data` to the `detpipe` parser."""
    p = sub.add_parser("demo-data", help="write the synthetic demo dataset (Pascal VOC layout)")
    p.add_argument("out", type=output_dir, help="output folder; gets images/ and annotations/")
    p.add_argument("--train", type=_positive_int, default=1024, help="number of training-sized images (default %(default)s)")
    p.add_argument("--val", type=_positive_int, default=128, help="number of extra images (default %(default)s)")
    p.add_argument("--object-size", type=pixel_range, default=(26, 58), metavar="MIN-MAX",
                   help="side of the shapes in pixels, e.g. 9-22 for small objects (default 26-58)")
    # Not the pipeline's image_size (the model's input): the sizes of the demo's photos.
    p.add_argument("--image-size", dest="photo_size", type=pixel_range, default=(128, 128), metavar="MIN-MAX",
                   help="width and height of the images in pixels, each drawn from the range, e.g. 280-400 "
                        "(default 128: squares)")
    p.add_argument("--objects", type=count_range, default=(1, 3), metavar="MIN-MAX",
                   help="objects in each image, drawn from the range, e.g. 100-150 for dense images (default 1-3; "
                        "an image keeps fewer when no free place is left)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    p.set_defaults(func=cmd_demo_data)


def add_data_commands(sub):
    """Add `data build` to the `detpipe` parser; returns the `data` subparsers."""
    data = sub.add_parser("data", help="dataset commands").add_subparsers(
        dest="data_command", required=True, metavar="DATA_COMMAND", help="build: validate and convert")
    p = data.add_parser(
        "build", help="validate a dataset and write sharded TFRecords",
        description="Validate every record, write the rejects (rejects-*.jsonl), TFDV statistics/schema/anomalies and "
                    "sharded TFRecords. On Dataflow: --runner DataflowRunner with the Dataflow options below "
                    "(docs/data.md); any other option is passed to Beam as its own.")
    p.add_argument("--format", **declared("data_format"))
    p.add_argument("--images", required=True, type=images_dir, help="folder of images (local or gs://)")
    p.add_argument("--annotations", required=True, type=existing_path,
                   help="VOC: folder of *.xml; COCO: instances JSON file; CSV: file with columns "
                        "filename,width,height,class,xmin,ymin,xmax,ymax, one row a box (class and coordinates "
                        "empty: an image with no boxes)")
    p.add_argument("--output", required=True, type=output_dir,
                   help="output folder for shards, manifest, stats (empty or new; a _job/ folder left by a build "
                        "that was killed is removed)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier build in --output: remove what a build writes, keep any other file "
                        "(default: refuse a non-empty --output). A folder that is not an earlier build is refused "
                        "even then")
    p.add_argument("--overwrite-unrecognised", action="store_true",
                   help="with --overwrite, also build into a non-empty folder that is not an earlier build (its own "
                        "files are kept)")
    p.add_argument("--val-fraction", **declared("val_fraction"))
    p.add_argument("--seed", **declared("seed", help="seed of the train/val split hash (default %(default)s)"))
    p.add_argument("--label-map", type=existing_file, help="JSON file {class name: id}; classes not in it are rejected")
    p.add_argument("--reject-empty", action="store_true",
                   help="reject images with no boxes, also those whose every box was dropped (default: keep as "
                        "negatives)")
    p.add_argument("--bad-box", **declared("bad_box"))
    p.add_argument("--max-pixels", type=_positive_int, default=ConvertOptions.max_pixels,
                   help="reject images with more pixels than this (default %(default)s)")
    for name in ("split_file", "val_annotations", "val_images"):
        p.add_argument(BY_NAME[name].option, **declared(name))
    p.add_argument("--gzip", action="store_true", help="GZIP-compress the shards (*.tfrecord.gz)")
    p.add_argument("--exif", **declared("exif"))
    p.add_argument("--tile", **declared("tile", help="count the photos in the tiles `train --tile` would cut them "
                                                   "into (auto: decided for a GPU's and a CPU's input budget), in the "
                                                   "manifest and on the dataset page (default %(default)s)"))
    p.add_argument("--schema", type=existing_file, help="pin the TFDV schema (schema.pbtxt of an earlier run) instead of inferring it")
    p.add_argument("--max-reject-fraction", **declared("max_reject_fraction"))
    p.add_argument("--previous-stats", type=existing_file, help="stats-train.pb of an earlier run: fail on drift of the class "
                                            "distribution or box sizes beyond --drift-threshold")
    p.add_argument("--drift-threshold", **declared("drift_threshold"))
    p.add_argument("--allow-new-classes", action="store_true",
                   help="with --schema: accept classes the schema does not list (and skip the class drift check)")
    p.add_argument("--allow-anomalies", action="store_true",
                   help="write the dataset and exit 0 despite anomalies (they are still reported)")
    p.add_argument("--runner", choices=RUNNERS, default=ConvertOptions.runner,
                   help="Beam runner (default %(default)s)")
    p.add_argument("--direct-num-workers", type=_positive_int, metavar="N",
                   help="DirectRunner: check and write in N worker processes, as Dataflow does; 1 runs in this "
                        f"process (default: one per {RECORDS_PER_WORKER:,} records, at most one per usable CPU). "
                        "The shards are the same for any N")
    add_dataflow_options(p)
    p.set_defaults(func=cmd_data_build, takes_beam_args=True, exits_at_once=True, known_options=option_strings(p))

    return data
