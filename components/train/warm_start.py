"""Warm start: training that begins from another run's weights (the champion's, or
`detpipe train --init-from`) instead of random ones, when that model can be continued.

`choose_warm_start` decides (pure but for reading the source's `train_config.json`) and
says why, in every case; `warm_weights` reads the source's weights once, outside the
distribution strategy; `apply_warm_weights` puts them into the freshly built model.

A source can be continued when it is the same architecture (model size or preset, and
the widths and depths that size has today), was trained at the input size this run
would use when one is pinned, and its shape (input size, pyramid levels, anchors) still
covers the new training boxes: at least the fit's target (95% of all boxes, 90% of each
class's), or no more than COVERAGE_TOLERANCE below what it covered of its own boxes. A
new class gets its own rows in the classification head, started as a fresh model starts
them; known classes keep theirs, matched by name (so the ids may differ). When more than
MAX_NEW_SHARE of the train images are new to the champion (both have `train_keys.txt`),
training starts from scratch; a source a person names is continued as asked.

Example (no source given: from scratch, and why):
    >>> from components.train.config import TrainConfig
    >>> choice, _ = choose_warm_start(TrainConfig("data", "out", init_note="--warm-start never"), {"cat": 1})
    >>> choice.used, choice.line()
    (False, 'from scratch: --warm-start never')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from beam.contract.label_map import num_class_slots
from beam.contract.train_keys import new_share, read_train_keys
from components.detector.artifacts import MODEL_FILE, TrainConfigFile
from components.detector.fitted_shape import FittedShape, kept_shape
from components.detector.geometry import CLASS_TARGET_COVERAGE, TARGET_COVERAGE, BoxSample
from components.detector.model import ModelConfig, model_config_for
from components.train.config import TrainConfig

# A kept shape may cover the new boxes this much less than it covered its own.
COVERAGE_TOLERANCE = 0.02
# At most this share of the train images may be new to the champion (train_keys.txt) for a
# warm start; with more, training starts from scratch. Measured on raccoon (benchmarks/
# warm_start.py, 10 epochs from scratch; docs/promotion.md, "Warm starts"): with a sixth of the
# train images new (20% more than the champion saw) the warm start beat a retrain from scratch
# (mAP 0.236 vs 0.218, seeds 0-4) at 0.46x its CPU time; with a third new (50% more) it fell
# short at both peaks tried (0.202 at 0.25x, 0.199 at 0.1x vs 0.223, seeds 0-2). The limit
# lies between the two.
MAX_NEW_SHARE = 0.25
# The architecture fields that must match for the weights to fit (the rest is the shape).
ARCHITECTURE = ("backbone_filters", "backbone_blocks", "head_conv_layers", "fpn_filters")


@dataclass(frozen=True)
class WarmStart:
    """Where training starts from, and why. `train_config.json`, the train report, the
    Model's metadata, `decision.json` and the run report carry `to_dict()`."""

    used: bool
    reason: str
    source: str = ""  # the folder holding the weights (model.keras, train_config.json)
    name: str = ""  # how people know it: "v3 (the champion)", or the folder given
    label_map: dict[str, int] = field(default_factory=dict)  # the source's
    new_classes: tuple[str, ...] = ()  # this run's classes the source never saw
    new_images: float | None = None  # the share of this run's train images the source never saw (None: unknown)

    def line(self) -> str:
        return (f"from {self.name}: {self.reason}" if self.used else f"from scratch: {self.reason}")

    def to_dict(self) -> dict:
        record = asdict(self)
        record["new_classes"] = list(self.new_classes)
        record["line"] = self.line()
        return record


def _other_model(config: TrainConfig, source: TrainConfigFile, source_model: ModelConfig) -> str | None:
    """Why the source is another model than this run trains (its size or preset, an
    architecture changed since, an input size pinned otherwise), or None."""
    asked = config.preset or config.model_size
    had = source.train.get("preset") or source.train.get("model_size")
    if asked != had:
        return f"it is a {had} model and this run trains {asked}"
    if not config.preset:
        today = model_config_for(config.model_size, source_model.image_size, source_model.num_classes)
        changed = [key for key in ARCHITECTURE if getattr(today, key) != getattr(source_model, key)]
        if changed:
            return f"the {config.model_size} architecture changed since it was trained ({', '.join(changed)})"
    if config.image_size != "auto" and config.image_size != source_model.image_size:
        return f"it was trained at {source_model.image_size}px and --image-size pins {config.image_size}"
    return None


def choose_warm_start(config: TrainConfig, label_map: dict[str, int], sample: BoxSample | None = None,
                      fresh: FittedShape | None = None) -> tuple[WarmStart, FittedShape | None]:
    """Whether this run starts from `config.init_from`, why, and the shape it trains:
    the source's when it continues it, else `fresh` (the shape fitted to `sample`)."""
    if not config.init_from:
        return WarmStart(False, config.init_note or "no model to start from"), fresh
    name = config.init_name or config.init_from
    folder = Path(config.init_from)
    if not (folder / MODEL_FILE).exists():
        raise FileNotFoundError(f"{folder / MODEL_FILE} not found: --init-from takes the output folder of "
                                "`detpipe train` or a registry version (v3) with --registry")
    source = TrainConfigFile.read(folder)
    source_model = ModelConfig.from_dict(source.model)

    unseen = new_share(read_train_keys(config.data_dir), read_train_keys(str(folder)))

    def scratch(reason: str) -> tuple[WarmStart, FittedShape | None]:
        return WarmStart(False, f"{name} cannot be continued: {reason}", new_images=unseen), fresh

    mismatch = _other_model(config, source, source_model)
    if mismatch:
        return scratch(mismatch)
    asked = config.preset or config.model_size
    shared = sorted(set(label_map) & set(source.label_map))
    if not shared:
        return scratch("no class in common with this data")
    if config.init_champion and unseen is not None and unseen > MAX_NEW_SHARE:
        return WarmStart(False, f"{unseen:.0%} of the train images are new to {name} (more than "
                                f"{MAX_NEW_SHARE:.0%}): a warm start from it learns less of them than a "
                                "training from scratch", new_images=unseen), fresh
    shape = fresh
    if sample is not None and fresh is not None:
        run_model = replace(source_model, num_classes=num_class_slots(label_map))
        shape = kept_shape(sample, run_model, fresh, name)
        own = float(source.result.get("shape", {}).get("anchor_coverage", TARGET_COVERAGE))
        needed = min(TARGET_COVERAGE, own - COVERAGE_TOLERANCE)
        needed_class = min(CLASS_TARGET_COVERAGE, needed)
        weakest = min(shape.class_coverage.items(), key=lambda kv: kv[1], default=("", 1.0))
        if shape.coverage < needed or weakest[1] < needed_class:
            worst = f", {weakest[0]} {weakest[1]:.1%}" if weakest[0] else ""
            return scratch(f"its shape ({source_model.image_size}px, P{source_model.min_level}-"
                           f"P{source_model.max_level}) covers {shape.coverage:.1%} of the new training boxes"
                           f"{worst} (needs {needed:.1%}, {needed_class:.1%} of each class's): the shape is "
                           "fitted afresh, so training starts from scratch")
    new = tuple(sorted(set(label_map) - set(source.label_map)))
    reason = (f"the same {asked} architecture; its shape ({source_model.image_size}px, "
              f"P{source_model.min_level}-P{source_model.max_level}) "
              + (f"covers {shape.coverage:.1%} of the new training boxes" if shape is not fresh and shape else "is kept")
              + f"; {len(shared)} known class(es) keep their weights"
              + (f", {len(new)} new ({', '.join(new)}) start fresh" if new else "")
              + ("" if unseen is None else f"; {unseen:.0%} of the train images are new to it"))
    return WarmStart(True, reason, source=str(folder), name=name, label_map=source.label_map,
                     new_classes=new, new_images=unseen), shape


def warm_weights(choice: WarmStart) -> list:
    """The source model's weights as numpy arrays, in `model.weights` order (read outside
    any distribution strategy)."""
    from components.detector.artifacts import load_trained

    model, _ = load_trained(choice.source)
    return [w.numpy() for w in model.weights]


def apply_warm_weights(model, weights: list, choice: WarmStart, label_map: dict[str, int]) -> None:
    """Assign the source's weights to `model` (the same architecture): every weight as it
    is, but the classification head's last layer, whose output channels are (anchor,
    class) pairs: a known class's channels are copied from the source's channel of the
    same name; a new class keeps the fresh initialisation."""
    head = model.classification_head.prediction_layer
    head_weights = {id(head.kernel), id(head.bias)}
    if len(model.weights) != len(weights):
        raise RuntimeError(f"{choice.name} has {len(weights)} weight tensors and this model {len(model.weights)}: "
                           "not the same architecture")
    new_slots, old_slots = model.num_classes, num_class_slots(choice.label_map)
    rows = [(label_map[name] - 1, choice.label_map[name] - 1) for name in sorted(set(label_map) & set(choice.label_map))]
    for variable, value in zip(model.weights, weights):
        if id(variable) in head_weights:
            current = variable.numpy()
            anchors = current.shape[-1] // new_slots
            if value.shape[-1] != anchors * old_slots:
                raise RuntimeError(f"{choice.name}'s classification head has {value.shape[-1]} outputs, expected "
                                   f"{anchors} anchors x {old_slots} classes")
            per_class = current.reshape(*current.shape[:-1], anchors, new_slots)  # a view of `current`
            source = value.reshape(*value.shape[:-1], anchors, old_slots)
            for new, old in rows:
                per_class[..., new] = source[..., old]
            variable.assign(current)
            continue
        if tuple(variable.shape) != tuple(value.shape):
            raise RuntimeError(f"{choice.name}: weight {variable.path} is {tuple(value.shape)} there and "
                               f"{tuple(variable.shape)} here: not the same architecture")
        variable.assign(value)
