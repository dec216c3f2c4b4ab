"""`detpipe train`: training a detector (components/train), a thin adapter."""

import contextlib
import re
import sys
import tempfile
from pathlib import Path

from pipeline.cli_types import EXIT_OK, UsageError, existing_file
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import output_dir, shards_dir
from pipeline.model_cli import export_after_train
from pipeline.params import BY_NAME, add_declared_option, add_training_options, declared, training_values


def _hparams_over_defaults(args) -> dict:
    """--hparams values for the options left at their defaults (the command line wins)."""
    from components.tune.hparams_file import DEFAULTS, load_hparams

    given = {name: getattr(args, name) for name in HPARAMS_OPTIONS}
    try:
        loaded = load_hparams(args.hparams) if args.hparams else {}
    except ValueError as err:
        raise _fail_lines(str(err).splitlines()) from err
    return {k: v if v is not None else loaded.get(k, DEFAULTS[k]) for k, v in given.items()}


def _init_from(args, fetched: str) -> dict:
    """TrainConfig's warm-start fields for `--init-from`: a train output folder as it is, a
    registry version fetched into `fetched`."""
    from components.model_registry.registry import Registry
    from components.model_registry.warm_source import warm_source

    request = args.init_from
    if not request:
        return {"init_note": "no --init-from given"}
    if re.fullmatch(r"v\d+", request) and not Path(request).exists():
        if not args.registry:
            raise UsageError(f"--init-from {request} names a registry version: give --registry too")
        registry = Registry.open(args.registry, args.model_name)
        source = warm_source(request, registry, registry.champion_version(), fetched)
        return {"init_from": source.folder, "init_name": source.name, "init_note": source.note}
    return {"init_from": request, "init_name": request}


def _fetch_folder(args):
    """A temporary folder for `--init-from` to fetch a registry version into; none without
    `--init-from` (a run that is killed, out of memory, leaves its folder behind)."""
    return tempfile.TemporaryDirectory(prefix="detpipe-init-") if args.init_from else contextlib.nullcontext("")


def cmd_train(args) -> int:
    from components.detector.fitted_shape import PoorAnchors
    from components.train.loop import PREEMPTED_EXIT_CODE, Preempted
    from components.train.refit import train_and_refit
    from components.train.trainer import ProbeAdvice, TrainConfig

    settings = {**training_values(args), **_hparams_over_defaults(args)}
    try:
        advice = ProbeAdvice.from_probe_file(args.probe) if args.probe else ProbeAdvice()
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise _fail_lines([f"--probe {args.probe}: not a probe.json of `detpipe probe --json` ({err!r})"]) from err
    try:
        with _fetch_folder(args) as fetched:
            result = train_and_refit(TrainConfig(
                data_dir=args.data, output_dir=args.output, verify_shards=args.verify_shards, probe=advice,
                **_init_from(args, fetched), **settings))
    except Preempted as stopped:  # the code a restarting scheduler (Vertex, --train-retries) expects
        print(f"detpipe: {stopped}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    except PoorAnchors as err:
        raise _fail_lines([str(err)]) from err
    loss = "n/a (nothing left to train)" if result.final_loss is None else f"{result.final_loss:.4f}"
    precision, xla = result.decisions["precision"].split(":")[0], result.decisions["xla"].split(":")[0]
    print(f"trained {result.steps} steps at {result.images_per_second} images/s ({precision}, XLA {xla}), "
          f"final loss {loss} -> {result.model_path}")
    if not result.is_chief:  # the chief exports; a replica that read its files could race it
        print("this replica's part is done; the chief writes the model and exports it")
    elif not args.no_export:
        export_after_train(args.output)
    return EXIT_OK


# `train` takes these from --hparams (the tune step's best_hparams.json) unless given: not given
# is None, and the declaration's default applies when --hparams has none either.
HPARAMS_OPTIONS = ("base_lr_per_64", "weight_decay", "augment_strength")


def add_train_command(sub) -> None:
    """Add `train` to the `detpipe` parser."""
    p = sub.add_parser(
        "train", help="train a RetinaNet on the shards of `data build`",
        description="Train a RetinaNet on the shards of `data build`. Resumes from the last checkpoint in --output. "
                    "A SIGTERM saves a checkpoint at the current step and exits 143; run the same command to resume. "
                    "With TF_CONFIG naming several machines (a Vertex custom job with --train-replicas), every "
                    "machine runs this same command: they train in lockstep (MultiWorkerMirroredStrategy), the "
                    "global batch is --batch-size x machines, and only the chief writes --output.")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for model.keras, history, report")
    add_training_options(p, leave_out=HPARAMS_OPTIONS)
    for name in HPARAMS_OPTIONS:
        add_declared_option(p, name, default=None, help=BY_NAME[name].help.replace("%", "%%")
                            + f" (default: --hparams's value, else {BY_NAME[name].default})")
    p.add_argument("--hparams", metavar="JSON", type=existing_file,
                   help="best_hparams.json of `detpipe tune`: its learning rate, weight decay and augmentation "
                        "strength, unless given on the command line")
    p.add_argument("--probe", metavar="JSON", type=existing_file,
                   help="probe.json of `detpipe probe --json` on this machine: its measured training rate (a time "
                        "budget's epochs), safe batch, precision and input parallelism, as the pipeline's train step "
                        "takes them")
    p.add_argument("--no-export", action="store_true",
                   help="do not write OUTPUT/saved_model (the SavedModel `detpipe serve` loads)")
    p.add_argument("--verify-shards", action="store_true",
                   help="before the first step, check each shard's sha256 against manifest.json and name any "
                        "shard that changed since the build (a full read of the shards)")
    p.add_argument("--init-from", metavar="MODEL_DIR|VERSION",
                   help="start from a trained model's weights (a warm start): an earlier `detpipe train` output "
                        "folder, or a registry version (v3, with --registry); used when it can be continued, else "
                        "training starts from scratch and train_report.md says why")
    p.add_argument("--registry", **declared("registry", help="model registry folder (local or gs://) for --init-from "
                                                             "VERSION"))
    p.add_argument("--model-name", **declared("model_name"))
    p.set_defaults(func=cmd_train)
