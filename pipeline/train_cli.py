"""`detpipe train | tune | evaluate`: the commands around training a detector.

Thin adapters over components/train (the trainer and the tuner) and components/evaluate.
"""

import contextlib
import re
import sys
import tempfile
from pathlib import Path

from components.tune.hparams_file import SEARCH_SPACE
from components.tune.trials import TRIAL_OWN
from pipeline.cli_types import UsageError, existing_dir, existing_file
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import output_dir
from pipeline.cli_types import positive_int as _positive_int
from pipeline.cli_types import review_folds, shards_dir, trained_model_dir, unit_float
from pipeline.model_cli import export_after_train
from pipeline.params import BY_NAME, add_declared_option, add_training_options, declared, training_values

EXIT_OK = 0


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
    from components.train.trainer import ProbeAdvice, TrainConfig, train_detector

    settings = {**training_values(args), **_hparams_over_defaults(args)}
    try:
        advice = ProbeAdvice.from_probe_file(args.probe) if args.probe else ProbeAdvice()
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise _fail_lines([f"--probe {args.probe}: not a probe.json of `detpipe probe --json` ({err!r})"]) from err
    try:
        with _fetch_folder(args) as fetched:
            result = train_detector(TrainConfig(
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


def cmd_tune(args) -> int:
    from components.train.loop import PREEMPTED_EXIT_CODE, Preempted
    from components.tune.hparams_file import BEST_FILE
    from components.tune.search import TuneConfig, tune
    from components.tune.study import SearchStopped

    try:
        result = tune(TuneConfig(data_dir=args.data, output_dir=args.output, trials=args.tune_trials,
                                 trial_epochs=args.tune_trial_epochs, backend="local",  # no trial machine here
                                 parallel=args.tune_parallel_trials, seed=args.seed, train=training_values(args),
                                 start={name: getattr(args, name) for name in HPARAMS_OPTIONS}))
    except (Preempted, SearchStopped) as stopped:  # as `train`: the code a restarting scheduler expects
        print(f"detpipe: {stopped}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    best = result.best
    chosen = ", ".join(f"{k}={v:.4g}" for k, v in best.hparams.items())
    print(f"tune: {best.decision}")
    if best.trials:
        gain = "n/a" if best.gain is None else f"{best.gain:+.4f}"
        print(f"{best.trials} trials in {best.search['seconds']:.0f} s ({best.search['cost']:g}x the training's steps); "
              f"{best.metric} {result.best_score:.4f}, {gain} over the defaults")
    print(f"{chosen} -> {args.output}/{BEST_FILE} (use: detpipe train --hparams {args.output}/{BEST_FILE})")
    return EXIT_OK


def cmd_tune_trial(args) -> int:
    from components.tune.vertex_job import vertex_trial

    hparams = {name: getattr(args, name) for name in SEARCH_SPACE if getattr(args, name) is not None}
    score = vertex_trial(args.plan, args.output, hparams)
    print(f"tune-trial: mAP@[.5:.95] on the tuning split {score:.4f}")
    return EXIT_OK


def cmd_evaluate(args) -> int:
    from components.evaluate.evaluator import GateFailed, evaluate_detector

    try:
        result = evaluate_detector(args.model, args.data, args.output, min_map=args.min_map)
    except GateFailed as err:
        raise _fail_lines([f"gate failed: {err}"]) from err
    m = result.metrics
    print(f"{result.num_images} val images: mAP@[.5:.95] {m['mAP']:.4f}, AP50 {m['AP50']:.4f}, "
          f"AP75 {m['AP75']:.4f} -> {args.output}/metrics.json")
    return EXIT_OK


def cmd_review(args) -> int:
    from components.review.review import review_model

    if args.review_folds:
        from components.review.fold_review import fold_cost

        print(f"reviewing the train split too: {fold_cost(args.model, args.review_folds, args.fold_epochs)}",
              flush=True)
    result = review_model(args.model, args.data, args.output, confident=args.confident,
                          evaluation_dir=args.evaluation, folds=args.review_folds, fold_epochs=args.fold_epochs)
    print(f"{result.images - result.train_images} val"
          + (f" and {result.train_images} train" if result.train_images else "")
          + f" images reviewed: {result.summary} -> {args.output}/label_review.html, "
          f"{args.output}/label_review.jsonl")
    return EXIT_OK


# `train` takes these from --hparams (the tune step's best_hparams.json) unless given: not given
# is None, and the declaration's default applies when --hparams has none either.
HPARAMS_OPTIONS = ("base_lr_per_64", "weight_decay", "augment_strength")


def add_train_commands(sub) -> None:
    """Add the train, tune, tune-trial, evaluate and review subcommands to the `detpipe` parser."""
    for add in (_add_train, _add_tune, _add_evaluate):
        add(sub)


def _add_train(sub) -> None:
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


def _add_tune(sub) -> None:
    """`tune`, and `tune-trial` that a Vertex AI tuning job runs."""
    p = sub.add_parser(
        "tune", help="search learning rate, weight decay and augmentation strength on images held out of train",
        description="Trials are short versions of the training tuned (its batch, input size, precision and schedule "
                    "shape, fewer epochs) on part of the train split, scored by mAP on the rest of it (held out by "
                    "the data split's hash rule); the val split is never read. Optuna's TPE sampler proposes the "
                    "values, a successive-halving pruner stops poor trials early; the given values are the first "
                    "trial. A SIGTERM checkpoints the running trial and exits 143: the same command goes on from "
                    "there. Writes OUTPUT/best_hparams.json for `detpipe train --hparams`.")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir,
                   help="folder for best_hparams.json, trials.jsonl, tune_report.md, the study and the trials")
    for name in ("tune_trials", "tune_trial_epochs", "tune_parallel_trials"):
        add_declared_option(p, name, BY_NAME[name].option.replace("--tune-", "--"))
    add_training_options(p, leave_out=tuple(TRIAL_OWN))  # base_lr_per_64, ... : the first candidate
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "tune-trial", help="one trial of a Vertex AI tuning job (the tune step starts them; not for hand use)",
        description="Train the regime of a search plan (the tune step's search_plan.json) with the values Vertex AI "
                    "passes as --NAME=VALUE, score each rung on the tuning split and report it to the service "
                    "(cloudml-hypertune). Resumes from its checkpoints when Vertex restarts it.")
    p.add_argument("--plan", required=True, type=existing_file, help="the tune step's search_plan.json")
    p.add_argument("--output", required=True, help="folder for the trials' models (a folder per trial id)")
    for name in SEARCH_SPACE:  # Vertex's spelling: --base_lr_per_64=0.01
        given = declared(name, help=BY_NAME[name].help.replace("%", "%%") + f" (default {BY_NAME[name].default})")
        p.add_argument(f"--{name}", **{**given, "default": None})
    p.set_defaults(func=cmd_tune_trial)


def _add_evaluate(sub) -> None:
    """`evaluate` and `review`."""
    p = sub.add_parser("evaluate", help="COCO metrics of a trained model on the val split")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for metrics.json and eval_report.md")
    p.add_argument("--min-map", **declared("min_map", help="exit 1 when mAP@[.5:.95] is below this (default "
                                                          "%(default)s)"))
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("review", help="the val labels most likely wrong (missing, wrong-class, misplaced, duplicate "
                                      "boxes), from a trained model's predictions",
                       description="Score the val split's labels against the predictions of a model trained "
                                   "without them (cleanlab's object-detection scores: missing, wrong-class and "
                                   "misplaced boxes; and duplicate boxes) and write label_review.jsonl (the flagged "
                                   "issues, best first, boxes in the images' pixels, for a labelling tool) and "
                                   "label_review.html (crops to look at). The pipeline's review step runs this "
                                   "after every evaluation.")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build` (its val "
                                                                    "split is reviewed; with --review-folds, its "
                                                                    "train split too)")
    p.add_argument("--output", required=True, type=output_dir, help="folder for label_review.jsonl and "
                                                                      "label_review.html")
    p.add_argument("--confident", type=unit_float, default=None,
                   help="score from which a prediction counts as evidence against a label (default: the "
                        "evaluation's best-F1 threshold from --evaluation, else 0.5)")
    p.add_argument("--evaluation", type=existing_dir, default=None,
                   help="output folder of `detpipe evaluate` for this model on this data: its detections are "
                        "reviewed (no second prediction pass) and its threshold is the default --confident")
    p.add_argument("--review-folds", type=review_folds, default=0, metavar="K",
                   help="also review the train split: K models trained from scratch with the model's options on "
                        "K-1 folds each predict the fold they did not see. Costs about K-1 times the model's "
                        "training (printed first); default 0: val only")
    p.add_argument("--fold-epochs", type=_positive_int, default=None,
                   help="epochs of each fold model (default: the model's)")
    p.set_defaults(func=cmd_review)
