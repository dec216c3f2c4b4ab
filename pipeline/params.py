"""The pipeline's parameters, declared once.

The DAG's signature and its docstring (which kfp turns into the parameter descriptions of
the compiled YAML), and the options of `detpipe run --local`, all come from `PARAMS`.
A parameter the local run cannot use (Dataflow, Vertex AI Model Registry) has `local=False`.
"""

from __future__ import annotations

import argparse
import inspect
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from beam.contract.exif import EXIF_MODES
from beam.dataflow import PARAMETER_PREFIX, RUNNERS, DataflowSettings
from beam.options import FORMATS, ConvertOptions, GateOptions
from beam.record_checks import BAD_BOX_MODES, CheckOptions
from components.detector.box_losses import BOX_LOSSES
from components.detector.geometry import FAIL_COVERAGE
from components.detector.precision import PRECISIONS, XLA_MODES
from components.export.file_formats import SETTINGS_PREFIX as EXPORT_PREFIX
from components.export.file_formats import ExportSettings
from components.model_registry.decision import PromotionRule
from components.model_registry.warm_source import DEFAULT_WARM_START
from components.model_registry.registry import DEFAULT_MODEL_NAME
from components.model_registry.vertex_endpoint import EndpointSpec
from components.model_registry.vertex_model import DEFAULT_REGION
from components.train.config import TrainConfig
from components.train.augment_settings import (LONG_RUN_EPOCHS, LONG_RUN_STRENGTH_FACTOR, MOSAIC_CLEAN_SHARE, MOSAIC_IMAGES,
                                              MOSAIC_SCALE, ORIENTATIONS, STRENGTH_GROWS_AFTER)
from components.train.refit_choice import REFIT_MIN_SHARE, REFIT_MODES
from components.train.plan import EMA_WINDOW_SHARE, FINE_TUNE_EPOCH_SHARE, FINE_TUNE_LR_SHARE
from components.detector.holdout_size import HOLDOUT_MAX_IMAGES
from components.train.time_budget import (CPU_AUTO_IMAGES, CPU_AUTO_SECONDS, DEFAULT_PATIENCE, GPU_AUTO_SECONDS,
                                          MAX_BUDGET_EPOCHS, PATIENCE_SHARE, SMOOTHED_SCORES)
from components.tune.search import TuneConfig
from components.tune.vertex_job import BACKENDS
from pipeline import cli_types

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: object
    help: str
    flag: str = ""  # the `run` option, default --name-with-dashes
    choices: tuple = ()
    cli_type: object = None  # argparse type that checks the value (default: `type`)
    cli_default: object = REQUIRED  # the `run` default when it differs (e.g. the demo data)
    local: bool = True  # offered by `detpipe run --local`
    path: bool = False  # a local path `run` makes absolute
    extra: dict = field(default_factory=dict)

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def settings_params(settings: type, prefix: str, checks: dict, leave_out: tuple[str, ...] = (),
                    **common) -> tuple[Param, ...]:
    """The parameters of a settings dataclass whose fields declare them (help and choices in
    their metadata): one a field, named `prefix` + the field's name; `checks`: the argparse type
    of a field's option where its type alone does not check it; `common`: Param's other fields."""
    types = typing.get_type_hints(settings)
    return tuple(Param(prefix + f.name, types[f.name], f.default, f.metadata["help"],
                       choices=f.metadata.get("choices", ()), cli_type=checks.get(f.name), **common)
                 for f in fields(settings) if f.name not in leave_out)


# The data step's Dataflow settings (beam/dataflow.py) but the workers' image: they run the step's own.
DATAFLOW_PARAMS = settings_params(DataflowSettings, PARAMETER_PREFIX, {"max_workers": cli_types.non_negative_int},
                                  leave_out=("image",), local=False)
RULE_PARAMS = settings_params(PromotionRule, "", {"max_regression": cli_types.non_negative_float})
EXPORT_PARAMS = settings_params(ExportSettings, EXPORT_PREFIX, {
    "formats": cli_types.export_formats_arg, "max_map_loss": cli_types.non_negative_float,
    "max_int8_map_loss": cli_types.non_negative_float, "calibration_images": cli_types.positive_int})

PARAMS: tuple[Param, ...] = (
    Param("images", str, REQUIRED, "Folder of images, local path or gs:// URI.",
          cli_default="demo-data/images", path=True, cli_type=cli_types.images_dir),
    Param("annotations", str, REQUIRED, "VOC folder of *.xml, COCO instances JSON, or CSV "
          "(filename,width,height,class,xmin,ymin,xmax,ymax).", cli_default="demo-data/annotations", path=True,
          cli_type=cli_types.existing_path),
    Param("data_format", str, ConvertOptions.data_format, "Annotation format: voc, coco or csv.", flag="--format",
          choices=FORMATS),
    Param("val_fraction", float, ConvertOptions.val_fraction, "Share of images for validation (hash of the image id).",
          cli_type=cli_types.fraction_arg),
    Param("split_file", str, "", 'The split you already have instead of val_fraction\'s hash: a JSON file '
          '{"train": [image ids], "val": [image ids]}, local or gs://; images listed in neither are rejected '
          "(not_in_split_file). Empty: the hash split.", path=True, cli_type=cli_types.optional_existing_file),
    Param("val_annotations", str, "", "The val split's own annotations, in the same format, for a dataset that comes "
          "split (COCO's val file, a Roboflow export's valid/); annotations then holds the train split. Empty: "
          "one set of annotations, split by the hash or split_file.",
          path=True, cli_type=cli_types.optional_existing_path),
    Param("val_images", str, "", "Folder of the val split's images when they are not in images (e.g. a "
          "Roboflow export's valid/); empty: images.", path=True, cli_type=cli_types.optional_images_dir),
    Param("bad_box", str, CheckOptions.bad_box, "A box that cannot be trusted on its own (empty, inverted, NaN, zero area once "
          "clipped, outside the image): drop it and keep its image with the other boxes, or reject-image.",
          choices=BAD_BOX_MODES),
    Param("seed", int, TrainConfig.seed, "Seed of the split, of training and of the bootstrap."),
    Param("max_reject_fraction", float, GateOptions.max_reject_fraction, "Fail the data step when more records than this share are rejected."),
    Param("allow_anomalies", bool, ConvertOptions.allow_anomalies, "Let the data step pass despite dataset anomalies (still reported)."),
    Param("allow_new_classes", bool, GateOptions.allow_new_classes, "Let the data step pass when it finds classes the champion never saw; "
          "the comparison then uses the shared classes."),
    Param("drift_threshold", float, GateOptions.drift_threshold, "Drift against the champion's training statistics that fails the data "
          "step: L-infinity distance of the class distribution, Jensen-Shannon divergence of box sizes.",
          cli_type=cli_types.unit_float),
    Param("exif", str, CheckOptions.exif, "Photos with an EXIF orientation: auto (the annotated size decides), apply (as "
          "displayed) or ignore (as stored).", choices=EXIF_MODES),
    Param("data_runner", str, ConvertOptions.runner, "DirectRunner (inside the step) or DataflowRunner (the step "
          "launches a Dataflow job).", local=False, choices=RUNNERS),
    *DATAFLOW_PARAMS,
    Param("beam_options", str, "", "Other Beam options for Dataflow than the dataflow_* parameters, e.g. "
          '"--disk_size_gb=100 --experiments=use_runner_v2".', local=False),
    Param("epochs", int, TrainConfig.epochs, "Passes over the whole training split; 0: as many as time_budget buys "
          "on this machine, on the train split less holdout, stopped by the held-out curve (patience).",
          cli_type=cli_types.non_negative_int),
    Param("time_budget", str, TrainConfig.time_budget, "Time for training and the search when epochs is 0 (20m, "
          f"1.5h, 90s). auto without a GPU: until the held-out curve is flat, at most {CPU_AUTO_IMAGES:,} images and "
          f"{CPU_AUTO_SECONDS / 60:g} min; with one: {GPU_AUTO_SECONDS / 60:g} min or {MAX_BUDGET_EPOCHS} epochs.",
          cli_type=cli_types.time_budget_arg),
    Param("patience", str, TrainConfig.patience, "Epochs without a better held-out mAP (smoothed over "
          f"{SMOOTHED_SCORES} scores) that stop a budgeted run; auto: {PATIENCE_SHARE:.0%} of the planned epochs, at "
          f"least {DEFAULT_PATIENCE}; 0: never early.", cli_type=cli_types.patience_arg),
    Param("holdout", float, TrainConfig.holdout, "Share of the train images held out (by the data split's hash rule) "
          f"to score a budgeted run's learning curve, at most {HOLDOUT_MAX_IMAGES} images; never val.",
          cli_type=cli_types.open_fraction),
    Param("refit", str, TrainConfig.refit, "After a budgeted run, train again on the whole train split for the "
          f"epochs its held-out curve ran and hand over that model: auto (where the carve is at least "
          f"{REFIT_MIN_SHARE:.0%} of train and the budget has room), on or off.", choices=REFIT_MODES),
    Param("batch_size", str, TrainConfig.batch_size, "Images per step, or auto to size it to the machine.",
          cli_type=cli_types.batch_size_arg),
    Param("image_size", str, TrainConfig.image_size, "Square model input in pixels, or auto: fitted to the training boxes "
          "(with the pyramid levels and anchors).", cli_type=cli_types.image_size_arg),
    Param("grow_input", bool, TrainConfig.grow_input, "With a time_budget given in time and image_size auto: spend "
          f"what the budget buys beyond {MAX_BUDGET_EPOCHS} epochs (and the refit) on a larger input, up to the "
          "photos' size; off until measured on more sets."),
    Param("tile", str, TrainConfig.tile, "auto: tiles at full resolution for large photos whose small objects a "
          "resize would lose (with --image-size auto); none: whole photos; SIZE[:OVERLAP]: tiles of SIZE px "
          "overlapping by OVERLAP px.",
          cli_type=cli_types.tile_arg),
    Param("allow_poor_anchors", bool, TrainConfig.allow_poor_anchors, "Train (and tune) even when, after fitting the input size, levels "
          f"and anchors, fewer than {FAIL_COVERAGE:.0%} of some class's training boxes can match an anchor (tiny objects in large "
          "images); the train report warns. A larger image_size is the better fix."),
    Param("warm_start", str, DEFAULT_WARM_START, "Where training starts: auto (from the champion's weights when its model can "
          "be continued, on a shorter, gentler schedule), never (from scratch), or a registry version (e.g. v3).",
          cli_type=cli_types.warm_start_arg),
    Param("model_size", str, TrainConfig.model_size, "Backbone and head size: tiny, small or resnet18.",
          choices=("tiny", "small", "resnet18")),
    Param("precision", str, TrainConfig.precision, "Training precision: auto (float32 on a CPU, mixed_float16 on GPU compute "
          "capability 7.x such as the T4, mixed_bfloat16 on 8.x and newer), or one by name (a mixed policy on a "
          "CPU runs slowly). The train report says why.", choices=PRECISIONS),
    Param("xla", str, TrainConfig.xla, "Compile the train step with XLA: auto (on with one GPU, off on a CPU and "
          "over several GPUs or machines), on or off. The train report says which and why.", choices=XLA_MODES),
    Param("box_loss", str, TrainConfig.box_loss, "Box regression loss: " + "; ".join(
          f"{name}: {what}" for name, what in BOX_LOSSES.items()) + ".", choices=tuple(BOX_LOSSES)),
    Param("ema", bool, TrainConfig.ema, "Evaluate and export a moving average of the weights over about the last "
          f"{EMA_WINDOW_SHARE:.0%} of training; false: the last step's weights."),
    Param("flip", bool, TrainConfig.flip, "Horizontal flips when augmenting; false for text or classes that "
          "differ left from right."),
    Param("orientations", str, TrainConfig.orientations, "Which ways up a training image may be turned: upright "
          "(left-right flips only), flips (also upside down) or any (also quarter turns): for photos with no up "
          "or down.", choices=ORIENTATIONS),
    Param("mosaic", bool, TrainConfig.mosaic, f"Train on mosaics of {MOSAIC_IMAGES} images, zoomed "
          f"{1 - MOSAIC_SCALE:g}-{1 + MOSAIC_SCALE:g}x, the last {MOSAIC_CLEAN_SHARE:.0%} of the steps on whole "
          "images; not with tiling."),
    Param("preset", str, "", "A KerasHub RetinaNet preset (retinanet_resnet50_fpn_coco, a kaggle:// or gs:// "
          "handle) whose pretrained backbone replaces model_size's; needs network access on the training machine. "
          "Empty: none."),
    Param("base_lr_per_64", float, TrainConfig.base_lr_per_64, "Peak learning rate per 64 images, scaled linearly "
          "with the batch.", flag="--base-lr",
          cli_type=cli_types.positive_float),
    Param("weight_decay", float, TrainConfig.weight_decay, "AdamW weight decay.", cli_type=cli_types.non_negative_float),
    Param("augment_strength", float, TrainConfig.augment_strength, "0-1: random crops (boxes cut away are dropped) "
          f"and brightness/contrast jitter, flips apart, of a run up to {STRENGTH_GROWS_AFTER} epochs; a longer run's "
          f"grows with its planned epochs, to {LONG_RUN_STRENGTH_FACTOR:g}x at {LONG_RUN_EPOCHS} (at most 1).",
          cli_type=cli_types.unit_float),
    Param("fine_tune_epochs", int, TrainConfig.fine_tune_epochs, f"Epochs of a warm-started run; 0: "
          f"{FINE_TUNE_EPOCH_SHARE:.0%} of epochs, rounded, at least 1.", cli_type=cli_types.non_negative_int),
    Param("fine_tune_lr_share", float, TrainConfig.fine_tune_lr_share, "Peak learning rate of a warm-started run "
          f"as a share of a from-scratch run's; 0: {FINE_TUNE_LR_SHARE:g}.", cli_type=cli_types.unit_float),
    Param("cache", str, TrainConfig.cache, "Keep the encoded training records after the first epoch: memory, or "
          "files at a path prefix; saves re-reading slow storage such as gs://. Empty: read the shards each epoch."),
    Param("checkpoint_every", int, TrainConfig.checkpoint_every, "Training steps between checkpoints (a restarted "
          "step resumes from the latest); 0: once an epoch.", cli_type=cli_types.non_negative_int),
    Param("max_steps", int, TrainConfig.max_steps, "Stop training after about this many steps in all (rounded up to whole "
          "checkpoint_every chunks); 0: no cap.",
          cli_type=cli_types.non_negative_int),
    Param("deterministic", bool, TrainConfig.deterministic, "Deterministic ops and input order: the same run "
          "twice gives the same weights (slower; XLA off)."),
    Param("require_gpu", bool, False, "Fail the probe when no GPU is visible.", local=False),
    Param("probe_dry_run", bool, True, "Run a few steps of the real training in the probe step, checkpoint and "
          "export (an out-of-memory, driver or precision fault shows there, not hours in); false: the machine's "
          "checks only, and the probe warns."),
    Param("tune_trials", str, TuneConfig.trials, "Hyperparameter search on held-out train images: auto (where it pays: "
          "a budget with room beside the training, or a GPU with epochs given), 0 (off: the given values) or N "
          "trials, the given values first.",
          cli_type=cli_types.tune_trials_arg),
    Param("tune_trial_epochs", int, TuneConfig.trial_epochs, "Epochs of one tuning trial (at the training's batch, "
          "input size and precision); 0: as many as keep the search within a few trainings' steps.",
          cli_type=cli_types.non_negative_int),
    Param("tune_parallel_trials", int, TuneConfig.parallel, "Tuning trials at once, each in its own process; 0: one per "
          "GPU of the machine (one on a CPU).", cli_type=cli_types.non_negative_int),
    Param("tune_backend", str, TuneConfig.backend, "Where tuning trials run: local (in the tune step), vertex (a Vertex AI "
          "tuning job, each trial on a training machine of its own, tune_parallel_trials at once) or auto (vertex "
          "when the pipeline runs on Vertex AI).", choices=BACKENDS,
          local=False),
    Param("registry", str, "", "Model registry folder (local or gs://); empty: the folder registry under the "
          "pipeline root. Each run records a version there and compares with the champion.",
          cli_default="", path=True, cli_type=cli_types.output_dir),
    Param("model_name", str, DEFAULT_MODEL_NAME, "Name of the model in the registry (its folder)."),
    *RULE_PARAMS,
    *EXPORT_PARAMS,
    Param("vertex_model", str, "", "Vertex AI Model Registry display name: each run uploads a version there "
          "(alias champion when blessed); empty: no upload.", local=False),
    Param("vertex_region", str, DEFAULT_REGION, "Region of the Vertex AI Model Registry.", local=False),
    Param("vertex_endpoint", str, "", "Vertex AI endpoint (display name; created when missing) that serves the "
          "champion: a blessed, uploaded version is deployed there and gets all traffic once it answers its health "
          "route, then the earlier deployment is removed; empty: no deployment. Needs vertex_model.", local=False),
    Param("endpoint_machine_type", str, EndpointSpec.machine_type, "Machine type of the endpoint's replicas.", local=False),
    Param("endpoint_accelerator", str, "", "GPUs per endpoint replica as TYPE:COUNT, e.g. NVIDIA_TESLA_T4:1; "
          "empty: none.", local=False),
    Param("endpoint_min_replicas", int, EndpointSpec.min_replicas, "Endpoint replicas at least.", local=False),
    Param("endpoint_max_replicas", int, EndpointSpec.max_replicas, "Endpoint replicas at most (autoscaling between).", local=False),
    Param("experiment", str, "", "Vertex AI Experiments experiment the run joins from its register step, to be "
          "compared there with the others (schedule create sets it; submit has Vertex AI join the run itself); "
          "empty: none.", local=False),
)

BY_NAME = {p.name: p for p in PARAMS}
# The training settings: every parameter named for a field of TrainConfig. The probe's dry run, the
# tune step and the train step take them together (pipeline/kfp_settings.py), `train` and `tune`
# offer each as an option, and each reaches TrainConfig by its name: adding one is its Param here
# and the TrainConfig field it sets.
TRAINING: dict[str, type] = {p.name: p.type for p in PARAMS if p.name in {f.name for f in fields(TrainConfig)}}
# The settings a step takes from a dataclass whose fields declare them, one parameter a field:
# the data step's Dataflow settings (beam/dataflow.py), the evaluate step's promotion rule, the
# export step's settings.
DATAFLOW: dict[str, type] = {p.name: p.type for p in DATAFLOW_PARAMS}
RULE: dict[str, type] = {p.name: p.type for p in RULE_PARAMS}
EXPORT: dict[str, type] = {p.name: p.type for p in EXPORT_PARAMS}
DEFAULT_REGISTRY_DIR = "registry"  # under the pipeline root


def in_signature_order(params: tuple[Param, ...] = PARAMS) -> list[Param]:
    """The parameters as a pipeline function takes them: the required ones first."""
    return sorted(params, key=lambda p: p.default is not REQUIRED)


def pipeline_signature(params: tuple[Param, ...] = PARAMS) -> inspect.Signature:
    return inspect.Signature([
        inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default, annotation=p.type)
        for p in in_signature_order(params)])


def pipeline_docstring(summary: str, params: tuple[Param, ...] = PARAMS) -> str:
    """Google-style docstring: kfp reads the descriptions of the parameters from `Args:`."""
    lines = [summary, "", "Args:"]
    lines += [f"    {p.name}: {p.help}" for p in in_signature_order(params)]
    return "\n".join(lines) + "\n"


def _bool_arg(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {value!r}")


class Switch(argparse.Action):
    """A setting that is on unless turned off, one spelling in every command: `--ema` / `--no-ema`.
    `--ema true|false` (what `run` took before) still works, for scripts that use it."""

    def __init__(self, option_strings, dest, default=True, help=None, **kwargs):
        self.negated = [f"--no-{o[2:]}" for o in option_strings if o.startswith("--")]  # shown by --help as such
        super().__init__([*option_strings, *self.negated], dest, nargs="?", default=default, help=help,
                         metavar="true|false")

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        try:
            setattr(namespace, self.dest, True if values is None else _bool_arg(values))
        except argparse.ArgumentTypeError as err:
            parser.error(f"argument {option_string}: {err}")


def declared_help(name: str) -> str:
    """The declaration's help as argparse shows it: `%` escaped, the default named by argparse
    (`%(default)s`, never written a second time) unless it is empty or the option is a flag."""
    p = BY_NAME[name]
    return _help_with_default(p.help, p.default, flag=p.type is bool and p.default is False)


def _help_with_default(text: str, default: object, flag: bool = False) -> str:
    shown = not flag and default not in ("", None, REQUIRED)
    return text.replace("%", "%%") + (" (default %(default)s)" if shown else "")


def declared(name: str, help: str | None = None) -> dict:
    """argparse's keyword arguments (dest, type with its checks, default, choices, help) of a
    declared parameter, for the commands that take the same setting (`train --epochs`, `data
    build --drift-threshold`, ...), so none of them can drift from the pipeline's declaration.
    `help`: where a command uses the setting for something narrower (the probe's memory check
    assumes `--image-size`), its own words, in argparse's format; else the declaration's."""
    p = BY_NAME[name]
    kwargs = {"dest": p.name, "default": p.default, "type": p.cli_type or (_bool_arg if p.type is bool else p.type),
              "help": declared_help(name) if help is None else help}
    if p.choices:
        kwargs["choices"] = p.choices
    return kwargs


def add_declared_option(parser: argparse.ArgumentParser, name: str, *aliases: str, default: object = REQUIRED,
                        help: str | None = None) -> None:
    """The option of a declared parameter, spelled as in every command: a flag for a bool that
    is false by default, `--name` / `--no-name` for one that is on, else an option with the
    declaration's type, check and choices. `default`: where a command's differs (`run`'s demo
    data); `help`: a command's own words, in argparse's format."""
    p = BY_NAME[name]
    default = p.default if default is REQUIRED else default
    flag = p.type is bool and default is False
    text = _help_with_default(p.help, default, flag) if help is None else help
    if flag:
        parser.add_argument(*aliases, p.option, dest=p.name, action="store_true", help=text)
    elif p.type is bool:
        parser.add_argument(*aliases, p.option, dest=p.name, action=Switch, default=default, help=text)
    else:
        parser.add_argument(*aliases, p.option, **{**declared(p.name, help=text), "default": default})


def add_training_options(parser: argparse.ArgumentParser, leave_out: tuple[str, ...] = ()) -> None:
    """One option per training setting (TRAINING), as `run` takes it, but those in `leave_out`."""
    for name in TRAINING:
        if name not in leave_out:
            add_declared_option(parser, name)


def training_values(args: argparse.Namespace) -> dict[str, object]:
    """The training settings a command was given (those it offers), by name: TrainConfig's fields."""
    return {name: getattr(args, name) for name in TRAINING if hasattr(args, name)}


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The `detpipe run` options, one per local parameter."""
    for p in PARAMS:
        if p.local:
            add_declared_option(parser, p.name, default=p.default if p.cli_default is REQUIRED else p.cli_default)


def params_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The local run's parameter values; local paths made absolute."""
    values = {}
    for p in PARAMS:
        if p.local:
            value = getattr(args, p.name)
            values[p.name] = str(Path(value).resolve()) if p.path and value and "://" not in value else value
    return values


def typed_values(pairs: list[str]) -> dict[str, object]:
    """`KEY=VALUE` strings (`submit` / `schedule create --param`) → values of each parameter's
    declared type, checked as `detpipe run` checks its options: `batch_size=16` stays the
    string the template declares, `epochs=3` is a whole number. An unknown name, or a value
    its parameter refuses, raises UsageError naming it.

    >>> typed_values(["batch_size=16", "epochs=3", "min_map=0", "allow_anomalies=true", "images=gs://b/i"])
    {'batch_size': '16', 'epochs': 3, 'min_map': 0.0, 'allow_anomalies': True, 'images': 'gs://b/i'}
    """
    import difflib

    values: dict[str, object] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        key = key.strip()
        param = BY_NAME.get(key)
        if param is None:
            close = difflib.get_close_matches(key, BY_NAME, n=1)
            raise cli_types.UsageError(f"--param {key}: no such pipeline parameter"
                                       + (f" (did you mean {close[0]}?)" if close else "")
                                       + "; `detpipe run --help` lists them")
        if param.choices and raw not in param.choices:
            raise cli_types.UsageError(f"--param {key}: must be one of {', '.join(param.choices)}, got {raw!r}")
        check = _bool_arg if param.type is bool else (param.type if param.path else param.cli_type or param.type)
        try:
            values[key] = param.type(check(raw))
        except argparse.ArgumentTypeError as err:
            raise cli_types.UsageError(f"--param {key}: {err}") from None
        except ValueError:
            raise cli_types.UsageError(f"--param {key}: must be a {param.type.__name__}, got {raw!r}") from None
    _check_dataflow(values)
    return values


def _check_dataflow(values: dict[str, object]) -> None:
    """The data step's Dataflow settings among `values` (the others at their defaults), checked
    as the step checks them: before a run is submitted, not minutes into it."""
    from beam.dataflow import pipeline_settings

    given = {name: values.get(name, BY_NAME[name].default) for name in DATAFLOW}
    _, problems = pipeline_settings(given, values.get("data_runner", BY_NAME["data_runner"].default),
                                    "the step's image", values.get("beam_options", BY_NAME["beam_options"].default))
    if problems:
        raise cli_types.UsageError("\n".join(f"--param {line}" for line in problems))
