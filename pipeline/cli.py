"""The `detpipe` command line: thin adapters over the step functions.

Exit codes: 0 success, 1 a failed check (reason on stderr, one line a problem),
2 bad usage.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

from beam.contract.manifest import output_folder_problem
from beam.options import ConvertOptions
from pipeline.cli_types import (CheckFailed, DetpipeParser, UsageError, count_range, error_line, existing_file,
                                existing_path)
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import images_dir, output_dir, output_file, pixel_range
from pipeline.cli_types import positive_int as _positive_int
from pipeline.cli_types import shards_dir, tensorflow_error_line
from pipeline.compile_cli import add_compile_command
from pipeline.interrupt import EXIT_INTERRUPTED, handle_interrupts, was_interrupted
from pipeline.model_cli import add_model_commands
from pipeline.params import BY_NAME, declared
from pipeline.preflight import annotations_problem, given_split_problem
from pipeline.registry_cli import add_registry_commands
from pipeline.run_cli import add_run_command
from pipeline.train_cli import add_train_commands
from pipeline.vertex_cli import add_vertex_commands, cloud_error_line

logger = logging.getLogger("detpipe")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# ---------------------------------------------------------------- commands

def cmd_demo_data(args) -> int:
    from pipeline.demo_data import write_demo_dataset

    summary = write_demo_dataset(Path(args.out), num_train=args.train, num_val=args.val, seed=args.seed,
                                 object_size=args.object_size, image_size=args.photo_size, objects=args.objects)
    print(f"wrote {summary.num_images} images with {summary.num_objects} objects "
          f"({', '.join(f'{k}: {v}' for k, v in summary.objects_per_class.items())}) to {summary.output_dir}")
    return EXIT_OK


def _check_data_build_usage(args, beam_args: list[str]) -> None:
    """What the command line alone can tell, before Beam and TensorFlow load."""
    problem = annotations_problem(args.annotations, args.format)
    if problem:
        raise UsageError(f"--annotations {problem}")
    val_problem = given_split_problem(args.format, args.val_annotations, args.val_images, args.split_file)
    if val_problem:
        raise UsageError(val_problem)
    from pipeline.beam_options import check_beam_args

    check_beam_args(beam_args, "detpipe data build")


def cmd_data_build(args, beam_args: list[str]) -> int:
    _check_data_build_usage(args, beam_args)
    if "://" not in args.output and os.path.isdir(args.output):
        problem = output_folder_problem(args.output, os.listdir(args.output), args.overwrite,
                                        args.overwrite_unrecognised)
        if problem:
            raise UsageError(f"--output {problem}")
    from beam.data_workers import prestarted_data_workers

    # The job's worker processes start now, while this process imports Beam and TensorFlow.
    with prestarted_data_workers(args.format, args.images, args.annotations, args.output, args.runner, beam_args,
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
        images=args.images, annotations=args.annotations, output=args.output, format=args.format,
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


def cmd_probe(args) -> int:
    from components.probe.probe_report import difference_lines, load_baseline, probe_markdown, probe_with_data, write_probe

    baseline = load_baseline(Path(args.baseline)) if args.baseline else None
    if args.dry_run and not args.data:
        raise UsageError("--dry-run trains on the shards: give --data too")
    dry_run = None
    if args.dry_run:
        from components.train.config import TrainConfig

        dry_run = TrainConfig(data_dir=args.data, output_dir="", image_size=args.image_size,
                              model_size=args.model_size, precision=args.precision, xla=args.xla,
                              allow_poor_anchors=args.allow_poor_anchors, tile=args.tile)
    result = probe_with_data(args.data, {"image_size": args.image_size, "model_size": args.model_size,
                                         "batch_size": args.batch_size, "tile": args.tile},
                             dry_run=dry_run, require_gpu=args.require_gpu, baseline=baseline)
    write_probe(result, Path(args.json) if args.json else None, None)
    print(probe_markdown(result))
    if baseline is not None:
        print(f"{len(result.differences)} difference(s) from {args.baseline}:")
        print("\n".join("  " + line for line in difference_lines(result.differences)) or "  none")
    if result.verdict == "FAIL":
        raise _fail_lines([f"{c.name}: {c.reason}; fix: {c.fix}" for c in result.checks if c.status == "FAIL"])
    return EXIT_OK


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detpipe")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = DetpipeParser(
        prog="detpipe",
        description="Train object detectors on GPUs without the usual cloud failures: "
                    "validate data, probe the machine, train, evaluate.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"detpipe {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")

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

    data = sub.add_parser("data", help="dataset commands").add_subparsers(
        dest="data_command", required=True, metavar="DATA_COMMAND", help="build: validate and convert")
    p = data.add_parser(
        "build", help="validate a dataset and write sharded TFRecords",
        description="Validate every record, write the rejects (rejects-*.jsonl), TFDV statistics/schema/anomalies and "
                    "sharded TFRecords. Unknown options are passed to Beam (e.g. --project, --region, "
                    "--temp_location, --sdk_container_image for DataflowRunner).")
    p.add_argument("--format", choices=("voc", "coco", "csv"), required=True, help="annotation format")
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
    p.add_argument("--runner", choices=("DirectRunner", "DataflowRunner"), default=ConvertOptions.runner,
                   help="Beam runner (default %(default)s)")
    p.add_argument("--direct-num-workers", type=_positive_int, metavar="N",
                   help="DirectRunner: check and write in N worker processes, as Dataflow does; 1 runs in this "
                        "process (default: one per 4,000 records, at most one per usable CPU). The shards are the "
                        "same for any N")
    p.set_defaults(func=cmd_data_build, takes_beam_args=True, exits_at_once=True)

    p = sub.add_parser(
        "probe", help="check this machine before training (GPU, driver, CUDA, cuDNN, CPUs, RAM, disk, packages)",
        description="Collect facts about this machine and check them: PASS/WARN/FAIL, each with a fix. "
                    "Exits 1 on FAIL.")
    p.add_argument("--require-gpu", action="store_true", help="FAIL (exit 1) when no GPU is visible")
    p.add_argument("--data", type=shards_dir, help="folder of shards (output of `data build`): measures storage read speed on "
                   "it and checks each shard's sha256 against its manifest.json")
    p.add_argument("--baseline", type=existing_file, help="probe.json written on another machine (e.g. your laptop) to compare with")
    p.add_argument("--json", type=output_file, help="write the full probe result (facts, checks, recommendations) to this file")
    p.add_argument("--image-size", **declared("image_size", help="model input the memory check assumes, or 'auto' "
                                                               "(default): fitted to --data's training boxes as "
                                                               "training fits it"))
    p.add_argument("--model-size", **declared("model_size", help="model the memory check assumes (default "
                                                               "%(default)s)"))
    p.add_argument("--batch-size", **declared("batch_size", help="batch the memory check assumes (default "
                                                               "%(default)s)"))
    p.add_argument("--dry-run", action="store_true",
                   help="also run a few steps of the real training here on --data (the fitted model, --precision, "
                        "--xla, this machine's devices), checkpoint and export: PASS, or the first error and its fix "
                        "(the pipeline's probe step always does this)")
    p.add_argument("--precision", **declared("precision", help="precision the dry run trains in (default "
                                                             "%(default)s)"))
    p.add_argument("--xla", **declared("xla", help="XLA choice the dry run trains with (default %(default)s)"))
    p.add_argument("--allow-poor-anchors", action="store_true",
                   help="let the dry run train when few boxes can match an anchor, as `train --allow-poor-anchors`")
    p.add_argument("--tile", **declared("tile", help="tiles the memory check, the input rate and the dry run assume, "
                                                   "as `train --tile` (default %(default)s)"))
    p.set_defaults(func=cmd_probe)

    add_train_commands(sub)

    add_compile_command(sub)
    add_run_command(sub)
    add_registry_commands(sub)
    add_model_commands(sub)
    add_vertex_commands(sub)
    parser.epilog = f"The documentation: {DOCS}/index.md (`make docs` builds it as a site)."
    for name, command in [*sub.choices.items(), ("data build", data.choices["build"])]:
        if name in DOCS_PAGE:
            command.epilog = f"More in {DOCS}/{DOCS_PAGE[name]}."
    return parser


DOCS = "docs"  # the documentation's pages (mkdocs.yml), named at the end of each command's --help
DOCS_PAGE = {
    "demo-data": "getting-started.md", "data build": "data.md#what-data-build-checks",
    "probe": "training.md#what-probe-checks", "train": "training.md#how-training-chooses-its-settings",
    "tune": "training.md#hyperparameter-search", "tune-trial": "training.md#hyperparameter-search", "evaluate": "promotion.md", "review": "promotion.md#label-review", "compile": "vertex.md",
    "run": "getting-started.md", "registry": "promotion.md", "export": "serving.md", "predict": "serving.md",
    "serve": "serving.md", "submit": "vertex.md", "schedule": "vertex.md", "batch-predict": "serving.md",
    "deploy": "serving.md", "upload": "vertex.md",
}


def _quiet_libraries() -> None:
    """TensorFlow's C++ start-up chatter (no CUDA here, duplicate factory registration) and
    google-api-core's Python 3.11 notice bury the output people need to read."""
    import os
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore", category=FutureWarning, module="google.api_core")
    # The same for the processes this one starts (a local Beam job's workers print it once
    # for each Google library they import).
    os.environ.setdefault("PYTHONWARNINGS", f"ignore::FutureWarning:{PYTHON_VERSION_NOTICE}")


PYTHON_VERSION_NOTICE = "google.api_core._python_version_support"  # the module that warns
BEAM_WORKER_RELAY = "apache_beam.runners.portability.local_job_service"  # re-logs worker processes' lines


def not_beam_chatter(record: logging.LogRecord) -> bool:
    """False for Beam's own INFO/WARNING notes: those it logs straight on the root logger
    ("BatchElements statistics", "Resource module is not available") and those its worker
    processes send to the driver ("No semi_persistent_directory found"). The job's own
    lines (e.g. "checked N records on worker P", relayed from a worker) and errors pass;
    a relayed line is rewritten to the worker's own message on the way (`_as_worker_line`)."""
    where = record.pathname
    if record.name == BEAM_WORKER_RELAY:
        where = _as_worker_line(record)
    if record.levelno >= logging.ERROR:
        return True
    return f"{os.sep}apache_beam{os.sep}" not in where


def _as_worker_line(record: logging.LogRecord) -> str:
    """A worker's line as Beam relays it ("Worker: %s" with the whole LogEntry as text:
    severity, timestamp, instruction and transform ids, ...) turned into "worker: MESSAGE"
    (and its traceback), in place; returns where the worker logged it."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from google.protobuf import text_format

    if not (record.msg == "Worker: %s" and len(record.args or ()) == 1):
        return ""
    entry = beam_fn_api_pb2.LogEntry()
    try:
        text_format.Parse(str(record.args[0]), entry)
    except text_format.ParseError:
        return ""  # not a LogEntry after all: left as Beam wrote it
    record.msg, record.args = "worker: %s", (entry.message + (f"\n{entry.trace}" if entry.trace else ""),)
    return entry.log_location


def _quiet_beam() -> None:
    """Beam's chatter off (without --verbose), but not the Dataflow runner's INFO (the job's
    console URL and state) nor worker lines the job logs; idempotent."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    for name in ("apache_beam.runners.dataflow", BEAM_WORKER_RELAY):
        logging.getLogger(name).setLevel(logging.INFO)
    for logger in (logging.getLogger(), logging.getLogger(BEAM_WORKER_RELAY)):
        if not_beam_chatter not in logger.filters:
            logger.addFilter(not_beam_chatter)


def run() -> None:
    """The `detpipe` command (the console script): `main`, leaving at once after a command
    that allows it (`exits_at_once`); a Ctrl-C stops it and every process it started, with
    one line and exit status 130 (pipeline/interrupt.py)."""
    handle_interrupts()
    try:
        code = main(exit_at_once=True)
    except KeyboardInterrupt:
        _exit_at_once(EXIT_INTERRUPTED)  # its own clean-up has run; the libraries' teardown need not
    sys.exit(code)


def _exit_at_once(code: int) -> None:
    """Leave now, without Python's interpreter teardown: with TensorFlow and Beam loaded it
    took ~1-1.5 s after a `data build` or a `predict` whose work was done (their modules'
    and C++ objects' destruction). Only for commands whose every file is written and closed
    when they return; the log handlers and the standard streams are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None, exit_at_once: bool = False) -> int:
    """Run one `detpipe` command; its exit status. `exit_at_once`: after a command that
    allows it, leave the process at once (`_exit_at_once`), as the console script does."""
    _quiet_libraries()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_beam_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        _quiet_beam()
    code = _run_command(args, extra)
    if was_interrupted():  # a library that swallowed the Ctrl-C's KeyboardInterrupt and went on
        code = EXIT_INTERRUPTED
    if exit_at_once and getattr(args, "exits_at_once", False):
        _exit_at_once(code)
    return code


def _run_command(args, extra: list[str]) -> int:
    try:
        return args.func(args, extra) if getattr(args, "takes_beam_args", False) else args.func(args)
    except Exception as err:
        if was_interrupted():  # a library's own error around the Ctrl-C's KeyboardInterrupt (Beam's)
            return EXIT_INTERRUPTED
        return _reported(err)


def _reported(err: Exception) -> int:
    """One line (or the check's lines) for a command's error; its exit status."""
    if isinstance(err, UsageError):
        print(f"detpipe: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(err, CheckFailed):
        for line in str(err).splitlines():
            print(f"detpipe: {line}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(err, (OSError, ValueError, RuntimeError, NotImplementedError)):
        print(f"detpipe: error: {error_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    line = cloud_error_line(err) or tensorflow_error_line(err)  # TensorFlow's and Google Cloud's: a line
    if line is None:
        raise err
    print(f"detpipe: error: {line}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    run()
