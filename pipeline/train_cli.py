"""`detpipe train | tune | evaluate`: the commands around training a detector.

Thin adapters over components/train (the trainer and the tuner) and components/evaluate.
"""

import argparse
import contextlib
import re
import sys
import tempfile
from pathlib import Path

from components.detector.box_losses import BOX_LOSSES
from pipeline.cli_types import UsageError, existing_file, output_dir, shards_dir, trained_model_dir
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import non_negative_float as _non_negative_float
from pipeline.cli_types import positive_float as _positive_float
from pipeline.cli_types import positive_int as _positive_int
from pipeline.cli_types import unit_float as _unit_float
from pipeline.model_cli import export_after_train
from pipeline.params import BY_NAME, declared

EXIT_OK = 0


def _hparams_over_defaults(args) -> dict:
    """--hparams values for the options left at their defaults (the command line wins)."""
    from components.train.tuning import DEFAULTS, load_hparams

    given = {"base_lr_per_64": args.base_lr, "weight_decay": args.weight_decay,
             "augment_strength": args.augment_strength}
    try:
        loaded = load_hparams(args.hparams) if args.hparams else {}
    except ValueError as err:
        raise _fail_lines(str(err).splitlines()) from err
    return {k: v if v is not None else loaded.get(k, DEFAULTS[k]) for k, v in given.items()}


def _common_train_config(args) -> dict:
    batch = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    return {"batch_size": batch, "image_size": args.image_size, "model_size": args.model_size,
            "preset": args.preset or None, "cache": args.cache, "flip": args.flip,
            "allow_poor_anchors": args.allow_poor_anchors, "box_loss": args.box_loss, "ema": args.ema,
            "precision": args.precision, "xla": args.xla}


def _init_from(args, fetched: str) -> dict:
    """TrainConfig's warm-start fields for `--init-from`: a train output folder as it is, a
    registry version fetched into `fetched`."""
    from components.registry.registry import Registry
    from components.registry.warm_source import warm_source

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
    from components.train.trainer import TrainConfig, train_detector

    hparams = _hparams_over_defaults(args)
    config = {**_common_train_config(args), "augment": args.flip or hparams["augment_strength"] > 0}
    # (with --no-flip and strength 0 there is nothing left to augment)
    try:
        with _fetch_folder(args) as fetched:
            result = train_detector(TrainConfig(
                data_dir=args.data, output_dir=args.output, epochs=args.epochs, seed=args.seed,
                deterministic=args.deterministic, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                fine_tune_epochs=args.fine_tune_epochs, **_init_from(args, fetched), **config, **hparams))
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
    from components.train.tuning import BEST_FILE, TuneConfig, tune

    result = tune(TuneConfig(data_dir=args.data, output_dir=args.output, trials=args.trials,
                             trial_steps=args.trial_steps, seed=args.seed, train=_common_train_config(args)))
    best = ", ".join(f"{k}={v:g}" for k, v in result.best.items())
    print(f"{len(result.trials)} trials; best mAP@[.5:.95] {result.best_score:.4f} with {best} -> "
          f"{args.output}/{BEST_FILE} (use: detpipe train --hparams {args.output}/{BEST_FILE})")
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


def _add_train_options(p: argparse.ArgumentParser, epochs: bool = True) -> None:
    """Options of `train` and `tune` that are also pipeline parameters (pipeline/params.py)."""
    if epochs:
        p.add_argument("--epochs", **declared("epochs"), help="passes over the train split (default %(default)s)")
    p.add_argument("--batch-size", **declared("batch_size"),
                   help="images per step, or 'auto' (default): what this machine's memory allows for the model "
                        "and the densest training image's boxes (trial steps on a GPU; an estimate, at most 16, "
                        "on a CPU), lowered for a small dataset so that a run from scratch makes at least "
                        "1,000 steps (at least 4 images a step); train_report.md says which and why")
    p.add_argument("--image-size", **declared("image_size"),
                   help="square model input in pixels, images resized to it; or 'auto' (default): fitted to the "
                        "training boxes so the small ones stay as large as the smallest anchor, at most the "
                        "images' median long side and 512 on a CPU, 1024 on a GPU. Pyramid levels and anchors "
                        "are fitted at either; train_report.md says what was chosen and why")
    p.add_argument("--model-size", **declared("model_size"),
                   help="tiny (default): a small ResNet, a 64-wide FPN and no head convs, the recipe the "
                        "docs/training.md measures; small: a wider backbone with KerasHub's 256-wide FPN and 2 head convs; "
                        "resnet18: ResNet-18 with 4 head convs. Larger sizes cost more time and memory per image")
    p.add_argument("--seed", **declared("seed"), help="random seed (default 0)")
    p.add_argument("--precision", **declared("precision"),
                   help="auto (default): float32 on a CPU, mixed_float16 on GPU compute capability 7.x (T4, V100), "
                        "mixed_bfloat16 on 8.x and newer (A100, L4, H100); or one of those by name. A mixed policy "
                        "on a CPU runs the GPU path's code slowly (a warning says so): a check, not a way to train")
    p.add_argument("--xla", **declared("xla"),
                   help="compile the train step with XLA: auto (default; on with one GPU, off on a CPU and over "
                        "several GPUs or machines), on, or off. train_report.md says which and why")
    p.add_argument("--preset", **declared("preset"),
                   help="start from the pretrained backbone of a KerasHub RetinaNet preset (retinanet_resnet50_fpn_coco, "
                        "a kaggle:// or gs:// handle, or a local preset folder) instead of --model-size; needs network "
                        "access or a copy")
    p.add_argument("--no-flip", dest="flip", action="store_false",
                   help="no horizontal flips (e.g. text or left/right classes)")
    p.add_argument("--allow-poor-anchors", action="store_true",
                   help="train even when, after fitting the shape, fewer than 75%% of some class's training boxes "
                        "can match an anchor with IoU 0.5 (default: refuse, since such boxes only train an anchor "
                        "that overlaps them poorly)")
    p.add_argument("--box-loss", **declared("box_loss"),
                   help="; ".join(f"{name}: {what}" for name, what in BOX_LOSSES.items())
                   + f" (default {BY_NAME['box_loss'].default})")
    p.add_argument("--no-ema", dest="ema", action="store_false",
                   help="evaluate and export the last step's weights instead of their moving average over "
                        "about the last tenth of training (the default; train_report.md says the window)")


def _add_local_train_options(p: argparse.ArgumentParser) -> None:
    """Options of `train` and `tune` that the pipeline does not take."""
    p.add_argument("--cache", metavar="memory|PATH",
                   help="keep the encoded training records after the first epoch, in memory or in files "
                        "at PATH; saves re-reading slow storage such as gs://")


def add_train_commands(sub) -> None:
    """Add the train, tune and evaluate subcommands to the `detpipe` parser."""
    p = sub.add_parser(
        "train", help="train a RetinaNet on the shards of `data build`",
        description="Train a RetinaNet on the shards of `data build`. Resumes from the last checkpoint in --output. "
                    "A SIGTERM saves a checkpoint at the current step and exits 143; run the same command to resume. "
                    "With TF_CONFIG naming several machines (a Vertex custom job with --train-replicas), every "
                    "machine runs this same command: they train in lockstep (MultiWorkerMirroredStrategy), the "
                    "global batch is --batch-size x machines, and only the chief writes --output.")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for model.keras, history, report")
    _add_train_options(p)
    _add_local_train_options(p)
    p.add_argument("--deterministic", action="store_true", help="deterministic ops and input order (slower)")
    p.add_argument("--max-steps", type=_positive_int, help="stop after this many steps in all")
    p.add_argument("--base-lr", type=_positive_float,
                   help="peak learning rate per 64 images, scaled linearly with the batch (default 0.008)")
    p.add_argument("--weight-decay", type=_non_negative_float, help="AdamW weight decay (default 0.0001)")
    p.add_argument("--hparams", metavar="JSON", type=existing_file,
                   help="best_hparams.json of `detpipe tune`: its learning rate, weight decay and augmentation "
                        "strength, unless given on the command line")
    p.add_argument("--checkpoint-every", type=_positive_int,
                   help="steps between checkpoints in OUTPUT/checkpoints (default: once an epoch); "
                        "running the same command again resumes from the latest")
    p.add_argument("--augment-strength", type=_unit_float,
                   help="0-1: random crops (boxes cut away are dropped) and brightness/contrast jitter; "
                        "flips are always on unless --no-flip (default 0.25)")
    p.add_argument("--no-export", action="store_true",
                   help="do not write OUTPUT/saved_model (the SavedModel `detpipe serve` loads)")
    p.add_argument("--init-from", metavar="MODEL_DIR|VERSION",
                   help="start from a trained model's weights instead of random ones (a warm start): the output "
                        "folder of an earlier `detpipe train`, or a registry version (v3, with --registry). Used "
                        "when it can be continued (the same --model-size, a shape that still covers these boxes; "
                        "new classes get fresh head rows); else training starts from scratch and train_report.md "
                        "says why. A warm start trains --fine-tune-epochs at a quarter of the peak learning rate")
    p.add_argument("--fine-tune-epochs", type=_positive_int,
                   help="epochs of a warm-started run (default: 15%% of --epochs, rounded, at least 1)")
    p.add_argument("--registry", **declared("registry"), help="model registry folder (local or gs://) for --init-from VERSION")
    p.add_argument("--model-name", **declared("model_name"),
                   help=f"model name in --registry (default {BY_NAME['model_name'].default})")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("tune", help="search learning rate, weight decay and augmentation strength on short trials",
                       description="Successive halving: TRIALS candidates (the first is the defaults) train "
                                   "TRIAL_STEPS steps each and are scored by mAP on the val split; the best third "
                                   "trains 3x longer and the best of those wins. About 2 x TRIALS x TRIAL_STEPS "
                                   "steps in all. Writes OUTPUT/best_hparams.json for `detpipe train --hparams`.")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir,
                   help="folder for best_hparams.json, trials.jsonl, tune_report.md")
    p.add_argument("--trials", type=_positive_int, default=6, help="candidates in the first round (default 6)")
    p.add_argument("--trial-steps", type=_positive_int, default=100,
                   help="training steps of a first-round trial (default 100)")
    _add_train_options(p, epochs=False)
    _add_local_train_options(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("evaluate", help="COCO metrics of a trained model on the val split")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for metrics.json and eval_report.md")
    p.add_argument("--min-map", **declared("min_map"), help="exit 1 when mAP@[.5:.95] is below this (default 0)")
    p.set_defaults(func=cmd_evaluate)
