"""`detpipe export | predict | serve`: the commands around a deployable model.

Thin adapters over components/export (the SavedModel) and components/serve (predictions
and the HTTP server).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from components.export.export_files import LABEL_MAP_FILE
from components.export.file_formats import (EXPORT_FORMATS, SAVED_MODEL, SETTINGS_PREFIX, SUFFIXES, ExportSettings,
                                            export_folder, is_model_file, parse_formats)
from components.serve.batch_workers import IMAGES_PER_WORKER
from beam.dataflow import RUNNERS
from pipeline.beam_options import add_dataflow_options, dataflow_settings, option_strings
from pipeline.cli_types import UsageError, existing_file, fail_lines, non_negative_float, output_dir, positive_float
from pipeline.cli_types import positive_int as _positive_int
from pipeline.cli_types import saved_model_dir, shards_dir, trained_model_dir
from pipeline.cli_types import unit_float as _unit_float
from pipeline.params import declared

EXIT_OK, EXIT_FAILED = 0, 1


def _saved_model_or_file(value: str) -> str:
    """A SavedModel folder of `detpipe export`, or a file it converted."""
    if is_model_file(value):
        return existing_file(value)
    return saved_model_dir(value)


PREDICT_CHUNK = 16  # images per call of the model in `detpipe predict`


def cmd_export(args) -> int:
    from components.evaluate.metrics_file import METRICS_FILE, chosen_threshold
    from components.export.saved_model import export_trained

    settings = ExportSettings.from_parameters({name: value for name, value in vars(args).items()
                                               if name.startswith(SETTINGS_PREFIX)})
    converted = settings.converted()
    if converted and not args.data:
        raise UsageError(f"--format {','.join(converted)}: each file is re-scored on the val split: give --data")
    if SAVED_MODEL in parse_formats(settings.formats):
        chosen = chosen_threshold(str(Path(args.evaluation) / METRICS_FILE)) \
            if args.evaluation and args.score_threshold is None else (args.score_threshold, "given")
        config = export_trained(args.model, args.output, *chosen)
        print(f"exported -> {args.output}: signature serving_default({config.input_name}), default score threshold "
              f"{config.score_threshold:g} ({config.threshold_source}); try it: detpipe predict --model "
              f"{args.output} IMAGE")
    if converted:
        return _export_converted(args, converted, settings)
    return EXIT_OK


def _export_converted(args, kinds: list[str], settings) -> int:
    """The converted files, each re-scored on --data's val split; a file under its tolerance, or
    whose conversion failed, is reported FAILED (the others stand, and the exit code says so)."""
    from components.export.converted import export_files
    from components.export.rescore import REPORT_FILE

    print(f"converting to {', '.join(kinds)}, then re-scoring each file on the val split", flush=True)
    scores, errors = export_files(args.model, kinds, args.output, args.data, settings)
    for score in scores:
        print(score.line + ("" if score.passed else " (file removed)"))
    for kind, why in errors.items():
        print(f"{kind}: FAILED: conversion: {why}")
    print(f"-> {os.path.join(args.output, REPORT_FILE)}")
    return EXIT_FAILED if errors or not all(score.passed for score in scores) else EXIT_OK


def export_after_train(train_output: str) -> None:
    """`detpipe train`'s last step: TRAIN_OUTPUT/saved_model with the default threshold."""
    from components.export.saved_model import EXPORT_DIR, export_trained

    folder = Path(train_output) / EXPORT_DIR
    served = export_trained(train_output, str(folder))
    print(f"exported a SavedModel -> {folder} (default score threshold {served.score_threshold:g}; "
          "`detpipe export --evaluation EVAL_DIR` sets the evaluation's F1-best one)")


def cmd_predict(args, beam_args: list[str]) -> int:
    if args.images_source:
        return _predict_batch(args, beam_args)
    if beam_args:
        raise UsageError(f"unrecognized arguments: {' '.join(beam_args)} (Beam options need --images)")
    if not args.images:
        raise UsageError("give IMAGE files, or --images DIR|gs://PREFIX|GLOB --output DIR for a batch job")
    if args.runner != "DirectRunner" or args.draw or args.direct_num_workers or dataflow_settings(args).given():
        raise UsageError("--runner, --draw, --direct-num-workers and the Dataflow options are options of the batch "
                         "job (--images)")
    missing = [name for name in args.images if not os.path.isfile(name)]
    if len(missing) == len(args.images):  # said at once, before TensorFlow loads the model (seconds)
        raise fail_lines([f"{name}: no such file" for name in missing])
    from components.serve.drawing import draw_detections
    from components.export.predictor import BadImage, Predictor, model_image_bytes

    if is_model_file(args.model):
        from components.export.file_predictor import FilePredictor

        predictor = FilePredictor.load(args.model)
    else:
        predictor = Predictor.load(args.model)
    from beam.contract.images import FileTooLarge, read_image_file

    problems, ready = [], []
    for name in args.images:
        try:
            with open(name, "rb") as handle:
                ready.append((name, model_image_bytes(read_image_file(handle))))
        except (OSError, BadImage, FileTooLarge) as err:
            problems.append(f"{name}: {err}")
    results = []
    for start in range(0, len(ready), PREDICT_CHUNK):
        chunk = ready[start:start + PREDICT_CHUNK]
        predictions = predictor.predict_each([data for _, data in chunk], args.score_threshold)
        for (name, data), answer in zip(chunk, predictions):
            if isinstance(answer, BadImage):
                problems.append(f"{name}: {answer}")
            else:
                results.append(({"image": name, **answer}, data))
    out = Path(args.output) if args.output else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        num_classes = max([0] + [c for r, _ in results for c in r["detection_classes"]])
        folder = export_folder(args.model)
        if os.path.isfile(os.path.join(folder, LABEL_MAP_FILE)):  # export writes it beside the model
            num_classes = len(json.loads(Path(folder, LABEL_MAP_FILE).read_text()))
    for result, data in results:
        print(json.dumps(result))
        if out:
            draw_detections(data, result, out / f"{Path(result['image']).stem}.jpg", num_classes)
    if out:
        (out / "predictions.json").write_text(json.dumps([r for r, _ in results], indent=1) + "\n")
    for line in problems:
        print(f"detpipe: {line}", file=sys.stderr)
    return EXIT_FAILED if problems else EXIT_OK


def _predict_batch(args, beam_args: list[str]) -> int:
    """`detpipe predict --images ...`: the Beam job (components/serve/batch_job.py), its
    worker processes started while this process imports Beam and TensorFlow."""
    from components.serve.batch_workers import prestarted_predict_workers
    from pipeline.beam_options import check_beam_args, dataflow_beam_args

    if args.images:  # with Beam options, IMAGE may hold an option's value written after a space
        raise UsageError("give either IMAGE files or --images, not both" + (
            f" (if {args.images[0]!r} is a Beam option's value, write Beam options as --option=value)"
            if beam_args else ""))
    if not args.output:
        raise UsageError("--images needs --output: the folder for the predictions")
    check_beam_args(beam_args, "detpipe predict", args.known_options)
    beam_args = list(dataflow_beam_args(args, args.runner, beam_args))
    if args.draw and "://" in args.output:
        raise UsageError("--draw writes local files: give a local --output")
    with prestarted_predict_workers(args.images_source, args.runner, beam_args, args.direct_num_workers):
        from components.serve.batch_job import BatchOptions, predict_images

        summary = predict_images(BatchOptions(
            model_dir=args.model, images=args.images_source, output=args.output, model_version=args.model_version,
            score_threshold=args.score_threshold, draw=args.draw, runner=args.runner, beam_args=tuple(beam_args),
            num_workers=args.direct_num_workers))
    reasons = ", ".join(f"{n} {r}" for r, n in summary.rejects_by_reason.items())
    print(f"{summary.images_in} files: {summary.predicted} predicted, {summary.rejected} rejected"
          + (f" ({reasons})" if reasons else "") + f" in {summary.seconds:g} s with {summary.workers} worker(s) -> "
          f"{args.output}/predictions-*.jsonl" + (f", {args.output}/rejects-*.jsonl" if summary.rejected else ""))
    return EXIT_OK


def cmd_serve(args) -> int:
    from components.export.model_files import check_model_dir

    model_dir = args.model or os.environ.get("AIP_STORAGE_URI")
    if not model_dir:
        raise ValueError("no model: pass --model DIR or set AIP_STORAGE_URI")
    try:  # before TensorFlow and before binding the port: a wrong path fails at once, as predict's --model does
        check_model_dir(model_dir)
    except (OSError, ValueError) as err:
        raise UsageError(f"--model: {err}") from None
    from components.serve.access import listen_host, serve_token

    try:
        token = serve_token(args.token_file)
    except OSError as err:
        raise UsageError(f"--token-file: {err}") from None
    except ValueError as err:  # an empty file or variable: the message names which
        raise UsageError(str(err)) from None
    from components.export.predictor import Predictor
    from components.serve.app import Routes, ServeOptions, create_app
    from components.serve.server import run_server

    routes = Routes.from_env()
    port = args.port or routes.port
    host = listen_host(args.host)
    options = ServeOptions(max_instances=args.max_instances, max_batch_size=args.max_batch_size,
                           batch_timeout_ms=args.batch_timeout_ms, body_timeout_s=args.body_timeout_s, token=token)
    # checked above: the folder (and a registered one's checksums) is not read twice at start-up
    app = create_app(model_dir, routes, options, load=lambda folder: Predictor.load(folder, checked=True))
    guard = "a bearer token required" if token else "no token asked"
    print(f"serving {model_dir} on http://{host}:{port}{routes.predict} (health: {routes.health}; {guard})",
          file=sys.stderr)
    run_server(app, host, port)
    return EXIT_OK


def add_model_commands(sub) -> None:
    """Add export, predict and serve to the `detpipe` parser."""
    _add_export_command(sub)
    _add_predict_command(sub)
    _add_serve_command(sub)


def _add_export_command(sub) -> None:
    p = sub.add_parser("export", help="write a SavedModel that takes image bytes (for serving), and TFLite / ONNX files "
                                      "re-scored")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for the SavedModel, label_map.json, serving_config.json")
    p.add_argument("--evaluation", help="output folder of `detpipe evaluate`: its F1-best threshold becomes the default")
    p.add_argument("--score-threshold", type=_unit_float, help="default score threshold (overrides --evaluation)")
    p.add_argument("--data", type=shards_dir, help="output folder of `detpipe data build`: its val split re-scores "
                                                   "each converted file, its train split calibrates the INT8 one")
    own_words = {"formats": f"what to write: {', '.join(EXPORT_FORMATS)} (default %(default)s); each file is "
                            "re-scored on --data's val split against the trained model, FAILED beyond its "
                            "--max-*map-loss"}  # the command writes no SavedModel unless asked, unlike the step
    for setting in fields(ExportSettings):  # the export step's settings, as its pipeline parameters declare them
        name = SETTINGS_PREFIX + setting.name
        option = setting.metadata["flag"] or "--" + setting.name.replace("_", "-")
        p.add_argument(option, metavar="F[,F...]" if setting.name == "formats" else option[2:].upper().replace("-", "_"),
                       **declared(name, help=own_words.get(setting.name)))
    p.set_defaults(func=cmd_export)


def _add_predict_command(sub) -> None:
    p = sub.add_parser(
        "predict", help="detections for image files, or for a folder or bucket as a Beam job (--images)",
        description="Two ways. `detpipe predict --model M IMAGE...`: detections for a few files, printed as "
                    "JSON, drawn on copies with --output. `detpipe predict --model M --images DIR|gs://PREFIX|GLOB "
                    "--output DIR`: a Beam job over every file there (locally in worker processes, as Dataflow "
                    "runs it; on Dataflow: --runner DataflowRunner with the Dataflow options below, any other option "
                    "passed to Beam as its own): OUTPUT/predictions-*.jsonl, one line per image; "
                    "files that are not usable images in OUTPUT/rejects-*.jsonl with the reason; "
                    "OUTPUT/summary.json with counts that reconcile. Every image is checked, turned upright by its "
                    "EXIF orientation and preprocessed as `detpipe serve` does.")
    p.add_argument("--model", required=True, type=_saved_model_or_file,
                   help=f"output folder of `detpipe export`, or a file it converted ({', '.join(SUFFIXES)})")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="JPEG or PNG files")
    p.add_argument("--images", dest="images_source", metavar="DIR|gs://PREFIX|GLOB",
                   help="every file in this folder or under this prefix, not its subfolders' (DIR/** takes "
                        "those too), or matching this glob: a Beam job")
    p.add_argument("--output", type=output_dir,
                   help="with IMAGE files: copies with the boxes drawn and predictions.json; with --images: the "
                        "folder (local or gs://) for predictions, rejects and summary.json")
    p.add_argument("--score-threshold", type=_unit_float, help="keep detections scoring at least this "
                                                               "(default: the export's)")
    p.add_argument("--model-version", default="", help="--images: the version written on every line "
                                                       "(e.g. the registry version of --model)")
    p.add_argument("--draw", action="store_true", help="--images: also OUTPUT/drawn/, copies with the boxes drawn "
                                                       "(for small local runs)")
    p.add_argument("--runner", choices=RUNNERS, default="DirectRunner",
                   help="--images: Beam runner (default %(default)s)")
    p.add_argument("--direct-num-workers", type=_positive_int, metavar="N",
                   help="--images, DirectRunner: predict in N worker processes, each loading the model (default: "
                        f"one per {IMAGES_PER_WORKER:,} images, at most one per usable CPU: a second worker pays only on "
                        "larger sets); 1 runs in this process")
    add_dataflow_options(p)
    p.set_defaults(func=cmd_predict, takes_beam_args=True, exits_at_once=True, known_options=option_strings(p))


def _add_serve_command(sub) -> None:
    from components.serve.access import ALL_INTERFACES, LOOPBACK, TOKEN_ENV, VERTEX_PORT_ENV
    from components.export.export_files import EXPORT_BATCH
    from components.serve.batching import DEFAULT_TIMEOUT_MS, GPU_CHUNKS
    from components.serve.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_INSTANCES, MAX_BODY_BYTES, MAX_IMAGE_PIXELS

    p = sub.add_parser(
        "serve", help="HTTP predictions on Vertex AI's custom-container contract",
        description="Answers Vertex AI online predictions ({\"instances\": [{\"image_bytes\": {\"b64\": ...}}]}) "
                    f"with the model of `detpipe export`. Limits: a body of at most {MAX_BODY_BYTES:,} bytes (Vertex "
                    "AI's; 413 over it, however it is sent), arriving within --body-timeout-s (408), at most "
                    f"--max-instances images a request, each of at most {MAX_IMAGE_PIXELS:,} pixels (400). Concurrent "
                    "requests are answered by one call of the model (dynamic batching; each answer is the one "
                    "the request gets alone). On SIGTERM, requests in flight are answered, new ones get 503, "
                    "then the process exits 0.")
    # Not checked by argparse: --model or $AIP_STORAGE_URI, a missing model exits 1 in one line either way.
    p.add_argument("--model", help="output folder of `detpipe export` (default: $AIP_STORAGE_URI)")
    p.add_argument("--host", help=f"address to listen on (default: {ALL_INTERFACES} when ${VERTEX_PORT_ENV} is set, "
                                  f"inside a Vertex AI container; else {LOOPBACK}, this machine only)")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"predict requests must carry 'Authorization: Bearer TOKEN', TOKEN this file's first line "
                        f"(default: ${TOKEN_ENV} when set, else no token); 401 without it, health stays open")
    p.add_argument("--port", type=_positive_int, help="port (default: $AIP_HTTP_PORT, else 8080)")
    p.add_argument("--max-instances", type=_positive_int, default=DEFAULT_MAX_INSTANCES,
                   help="most images in one request (default %(default)s)")
    p.add_argument("--max-batch-size", type=_positive_int, metavar="N",
                   help="most images in one call of the model, gathered from concurrent requests; 1 turns "
                        f"batching off (default: on a CPU {EXPORT_BATCH - 1}, the model's chunk of {EXPORT_BATCH} less "
                        f"its last slot; with a GPU {GPU_CHUNKS * EXPORT_BATCH}). A request is never split")
    p.add_argument("--batch-timeout-ms", type=non_negative_float, metavar="MS",
                   help=f"the longest a request waits for others to share its call (default {DEFAULT_TIMEOUT_MS:g})")
    p.add_argument("--body-timeout-s", type=positive_float, default=DEFAULT_BODY_TIMEOUT_S, metavar="S",
                   help="a request body must arrive within this (default %(default)s); a slow or "
                        "stalled sender gets 408")
    p.set_defaults(func=cmd_serve)
