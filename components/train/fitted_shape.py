"""The model's shape for a dataset: `--image-size auto`, pyramid levels and anchors
fitted to the train split's boxes (geometry.py), and the refusal to train on boxes no
anchor can learn from.

The boxes come straight from the train shards (their box and image-size features; a
parse of up to `records` records, seconds even for large sets), so a data folder written
before this existed works as well as a new one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from components.train.geometry import (FAIL_COVERAGE, FIXED_SIZE, FIXED_SPEC, BoxSample, CostModel,
                                       choose_image_size, coverage, fit_anchors)
from components.train.model import ModelConfig, model_config_for

logger = logging.getLogger(__name__)

SAMPLE_RECORDS = 2000


class PoorAnchors(ValueError):
    """Too few training boxes can match any anchor, even after fitting the shape."""


@dataclass(frozen=True)
class FittedShape:
    model: ModelConfig  # with the fitted image size, levels and anchors
    coverage: float  # share of the sampled training boxes some anchor reaches with IoU >= 0.5
    coverage_fixed: float  # the same with the fixed shape (128 px, P4-P6, anchor size 2, ratios 0.5/1/2)
    relative_compute: float  # estimated forward-pass compute / the fixed shape's
    boxes: int  # training boxes sampled
    smallest_box_px: float  # the smallest sampled box side at the chosen input size
    decisions: dict[str, str]

    def metadata(self) -> dict[str, object]:
        """Flat facts for the Model artifact's metadata."""
        m = self.model
        return {"image_size": m.image_size, "pyramid_levels": f"P{m.min_level}-P{m.max_level}",
                "anchor_size": m.anchor_size, "anchor_scales": m.num_scales,
                "aspect_ratios": ",".join(f"{r:g}" for r in m.aspect_ratios),
                "anchor_coverage": round(self.coverage, 4), "anchor_coverage_fixed_shape": round(self.coverage_fixed, 4),
                "relative_compute": round(self.relative_compute, 2)}


def read_box_sample(data_dir: str, records: int = SAMPLE_RECORDS) -> BoxSample:
    """The boxes and image sizes of the first `records` train records (in shard order)."""
    import tensorflow as tf

    from components.train.input_pipeline import compression_type, parse_boxes, shard_files

    files = shard_files(data_dir, "train")
    data = tf.data.TFRecordDataset(files, compression_type=compression_type(files)).take(records).map(parse_boxes)
    boxes, sides = [], []
    for example in data:
        boxes.append(example["boxes"].numpy())
        sides.append(max(int(example["height"]), int(example["width"])))
    return BoxSample(np.concatenate(boxes) if boxes else np.zeros((0, 4)), np.asarray(sides, np.float64))


def cost_model(config: ModelConfig) -> CostModel:
    return CostModel(backbone_filters=config.backbone_filters, backbone_blocks=config.backbone_blocks,
                     head_conv_layers=config.head_conv_layers, num_classes=config.num_classes)


def fit_shape(sample: BoxSample, base: ModelConfig, requested_size: int | str, on_gpu: bool,
              allow_poor_anchors: bool = False) -> FittedShape:
    """`base` (model_config_for's config of the model size) with the input size (when
    `requested_size` is "auto"), levels and anchors fitted to `sample`. Raises PoorAnchors
    when fewer than FAIL_COVERAGE of the boxes can match an anchor, unless allowed."""
    decisions = {}
    if requested_size == "auto":
        size, decisions["image_size"] = choose_image_size(sample, on_gpu)
        decisions["image_size"] = "auto: " + decisions["image_size"]
    else:
        size = int(requested_size)
        decisions["image_size"] = f"{size}: given with --image-size"
    preset = base.extra.get("preset")
    fixed_levels = (base.min_level, base.max_level) if preset else None
    costs = cost_model(base)
    fit = fit_anchors(sample.boxes * size, size, costs, fixed_levels)
    spec = fit.spec
    model = replace(base, image_size=size, min_level=spec.min_level, max_level=spec.max_level,
                    anchor_size=spec.anchor_size, num_scales=spec.num_scales, aspect_ratios=spec.aspect_ratios)
    decisions["pyramid_and_anchors"] = fit.reason + (f" (levels fixed by preset {preset})" if preset else "")
    relative = costs.total(size, spec) / costs.total(FIXED_SIZE, FIXED_SPEC)
    before = coverage(sample.boxes * FIXED_SIZE, FIXED_SPEC, FIXED_SIZE)
    smallest = float((sample.hw * size).min()) if len(sample.boxes) else 0.0
    decisions["anchor_coverage"] = (
        f"{fit.coverage:.1%} of {len(sample.boxes)} sampled training boxes reach IoU 0.5 with an anchor (the fixed "
        f"shape, {FIXED_SIZE}px {FIXED_SPEC.describe()}: {before:.1%}); smallest box side {smallest:.0f}px; "
        f"estimated compute {relative:.2f}x the fixed shape's")
    if fit.coverage < FAIL_COVERAGE:
        problem = (f"only {fit.coverage:.0%} of {len(sample.boxes)} training boxes can match an anchor with IoU 0.5 at "
                   f"{size}px input even after fitting levels and anchors (needs {FAIL_COVERAGE:.0%}; smallest box "
                   f"side {smallest:.0f}px), so the rest would teach the model nothing")
        if not allow_poor_anchors:
            raise PoorAnchors(f"{problem}: pin a larger --image-size (e.g. --image-size {2 * size}) or crop the "
                              "images around the objects; --allow-poor-anchors trains anyway")
        decisions["anchor_coverage"] += f"; WARNING (--allow-poor-anchors): {problem}"
        logger.warning("train: %s (--allow-poor-anchors)", problem)
    return FittedShape(model=model, coverage=fit.coverage, coverage_fixed=before, relative_compute=relative,
                       boxes=len(sample.boxes), smallest_box_px=smallest, decisions=decisions)


def gpu_visible() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def shape_for_data(data_dir: str, model_size: str, num_classes: int, requested_size: int | str, on_gpu: bool,
                   preset: str | None = None, allow_poor_anchors: bool = False) -> FittedShape:
    """`fit_shape` of the model size's (or preset's) detector on the train split of the
    shards in `data_dir`."""
    # the size given here is a placeholder: fit_shape replaces it with the chosen one
    base = model_config_for(model_size, FIXED_SIZE, num_classes, preset)
    return fit_shape(read_box_sample(data_dir), base, requested_size, on_gpu, allow_poor_anchors)
