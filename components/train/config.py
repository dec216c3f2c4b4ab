"""What a training run is asked to do (`TrainConfig`) and what the probe advised for this
machine (`ProbeAdvice`): plain data, no TensorFlow, shared by the plan, the trainer, the
tuner, the CLI and the KFP component."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from components.detector.tile_choice import DEFAULT_TILE
from components.train.augment_settings import ORIENTATIONS
from components.train.refit_choice import REFIT_MODES
from components.train.time_budget import AUTO, check_budget, check_patience


@dataclass(frozen=True)
class ProbeAdvice:
    """What the probe measured on this machine (components/probe): starting points."""

    safe_batch: int | None = None
    precision: str | None = None  # "mixed_bfloat16" | "mixed_float16" | "float32"
    input_parallelism: int | None = None
    gpus: int | None = None  # GPUs the probe saw; None: no probe (the tuner counts them itself)
    # Images/s training reaches here as the probe measured it (the slower of the model's steps and
    # the input pipeline); a time budget turns it into epochs. None: the trainer measures it.
    images_per_second: float | None = None

    @classmethod
    def from_probe_file(cls, path: str) -> "ProbeAdvice":
        """The recommendations of a probe.json (`detpipe probe --json`, the probe step's artifact)."""
        with open(path) as handle:
            return cls.from_recommendations(json.load(handle)["recommendations"])

    @classmethod
    def from_recommendations(cls, rec: dict) -> "ProbeAdvice":
        """From the probe's `recommendations` (probe_report.recommend)."""
        return cls(safe_batch=rec.get("largest_safe_batch") or None, precision=rec.get("mixed_precision"),
                   input_parallelism=rec.get("input_parallelism"), gpus=rec.get("gpus"),
                   images_per_second=rec.get("images_per_second"))


def number_or_auto(value: int | str, name: str) -> int | str:
    """A size or batch as the config holds it: a whole number, or "auto". Where it arrives
    as text (a pipeline parameter, "auto" or "320"), it becomes a number here, once.

    >>> number_or_auto("320", "image_size"), number_or_auto("auto", "image_size"), number_or_auto(16, "batch_size")
    (320, 'auto', 16)
    """
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(f"{name} must be 'auto' or a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    output_dir: str
    # How long to train: `epochs` N trains exactly N passes over the whole train split; 0 (the
    # default) trains as many as `time_budget` buys on this machine (time_budget.py) on the train
    # split less `holdout`, scored on the held-out part as it trains: the best point's weights
    # are kept, and `patience` epochs without a better score stop it ("auto": tied to the plan,
    # time_budget.patience_epochs).
    epochs: int = 0
    time_budget: str = AUTO
    patience: int | str = AUTO
    # The share of train held out (by the data split's hash rule, components/detector/holdout.py)
    # to score the learning curve and tuning trials, at most holdout.HOLDOUT_MAX_IMAGES images;
    # the same carve for both.
    holdout: float = 0.2
    # After a budgeted run: train again on the whole train split for the epochs its curve ran, and
    # hand over that model (refit.py); "auto": where the carve is a large share of train and the
    # budget has room (refit_choice.choose_refit), "on", "off".
    refit: str = AUTO
    batch_size: str | int = "auto"  # images per step on one machine, or "auto"
    image_size: int | str = "auto"  # square model input in pixels, or "auto": fitted to the boxes (fitted_shape.py)
    # With a time budget given in time and `image_size` auto: spend what the budget buys beyond the capped
    # epochs (and the refit) on a larger input (afforded_size.py). Off until measured to pay on two real
    # sets (docs/measurements.md: raccoon at 25 minutes, +0.054 and -0.008 in two seeds).
    grow_input: bool = False
    allow_poor_anchors: bool = False  # train even when few boxes can match an anchor after fitting
    tile: str = DEFAULT_TILE  # "auto": tiles at full resolution for large photos with small objects (tile_choice.py); "none"
    model_size: str = "tiny"
    preset: str | None = None  # KerasHub preset whose pretrained backbone replaces model_size's
    base_lr_per_64: float = 8e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 1e-4
    clipnorm: float = 10.0
    augment: bool = True
    box_loss: str = "giou"  # "giou" (1 - GIoU of the decoded boxes) or "huber" (KerasHub's default); losses.py
    ema: bool = True  # evaluate and export a moving average of the weights (losses.AveragedAdamW)
    augment_strength: float = 0.25  # of a run up to augment_settings.STRENGTH_GROWS_AFTER epochs; longer: run_strength
    flip: bool = True
    # Which ways up a training image may be turned (augment_settings.ORIENTATIONS): "upright" (horizontal
    # flips only, as `flip` says), "flips" (vertical flips too), "any" (also quarter turns): for
    # photos with no up or down (microscopy, aerial), never on by default for every photo.
    orientations: str = "upright"
    # Four images in one (mosaic.py), the last MOSAIC_CLEAN_SHARE of the steps without: off until
    # measured to pay on real sets (docs/training.md).
    mosaic: bool = False
    cache: str = ""  # "memory" or a file path: keep encoded records after the first epoch; "": none
    seed: int = 0
    deterministic: bool = False
    max_steps: int = 0  # cap on total steps (smoke tests); 0: none
    checkpoint_every: int = 0  # steps between checkpoints; 0: once an epoch
    # End this process once this many steps of the schedule are done, the model saved as at
    # the end; the same config with a larger value continues from the checkpoint there (a
    # tuning trial's rungs, components/tune). 0: train to the end. Unlike `max_steps` the
    # schedule (warmup, cosine decay) stays that of the whole run.
    stop_after_steps: int = 0
    # Check every shard's sha256 against manifest.json before the first step (a shard changed at
    # the same size after the build); the probe step's data check always does.
    verify_shards: bool = False
    max_nan_recoveries: int = 3
    nan_lr_factor: float = 0.5  # learning-rate scale after each NaN recovery
    probe: ProbeAdvice = field(default_factory=ProbeAdvice)
    # The Keras policy ("auto": the rule for this machine's GPUs, precision.py) and whether the
    # train step is compiled with XLA ("auto": on one GPU only); the plan says which and why.
    precision: str = "auto"
    xla: str = "auto"
    # Warm start (warm_start.py): a folder with another run's model.keras and train_config.json
    # to start from when it can be continued; how people know it ("v3 (the champion)"); why
    # there is none (e.g. "--warm-start never"); whether it is the champion, taken by itself
    # (then continued only when little of the train split is new to it: warm_start.MAX_NEW_SHARE;
    # a source a person names is continued as asked); the epochs of a warm-started run (0: a
    # share of `epochs`).
    init_from: str | None = None
    init_name: str = ""
    init_note: str = ""
    init_champion: bool = False
    fine_tune_epochs: int = 0
    fine_tune_lr_share: float = 0.0

    def __post_init__(self):
        for name in ("batch_size", "image_size"):  # typed here, not halfway down
            object.__setattr__(self, name, number_or_auto(getattr(self, name), name))
        object.__setattr__(self, "preset", self.preset or None)  # a pipeline parameter's "": none
        if not self.flip and self.augment_strength <= 0:  # nothing is left to augment, in every adapter
            object.__setattr__(self, "augment", False)
        check_budget(self.time_budget)
        object.__setattr__(self, "patience", check_patience(self.patience))
        if not 0 < self.holdout < 1:
            raise ValueError(f"holdout must be between 0 and 1, got {self.holdout}")
        if self.orientations not in ORIENTATIONS:
            raise ValueError(f"orientations must be one of {', '.join(ORIENTATIONS)}, got {self.orientations!r}")
        if self.refit not in REFIT_MODES:
            raise ValueError(f"refit must be one of {', '.join(REFIT_MODES)}, got {self.refit!r}")

    @property
    def budgeted(self) -> bool:
        """The run's length comes from the time budget and the held-out curve (no --epochs)."""
        return self.epochs == 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """From `to_dict()` or a train_config.json's `train`; keys this version does not know
        (another version's) are left out."""
        known = {f.name for f in fields(cls)}
        advice = {f.name for f in fields(ProbeAdvice)}
        options = {name: value for name, value in data.items() if name in known}
        options["probe"] = ProbeAdvice(**{k: v for k, v in (data.get("probe") or {}).items() if k in advice})
        return cls(**options)
