"""The model's shape for a dataset: `--image-size auto`, pyramid levels and anchors
fitted to the train split's boxes (geometry.py), and the refusal to train on boxes no
anchor can learn from.

The boxes come straight from the train shards (their box and image-size features; a
parse of up to `records` records, seconds even for large sets), so a data folder written
before this existed works as well as a new one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from components.detector.geometry import (FAIL_COVERAGE, FIXED_SIZE, FIXED_SPEC, MIN_CLASS_BOXES, POSITIVE_IOU,
                                          PREFERRED_LOWEST_LEVEL, SIZE_STEP, AnchorFit, AnchorSpec, BoxSample,
                                          CostModel, best_anchor_iou, choose_image_size, choose_max_detections,
                                          coverage, fit_anchors, size_cap)
from components.detector.model import ModelConfig, model_config_for
from components.detector.tile_choice import choose_tiling, given_tiling, parse_tile, tile_box_sample

logger = logging.getLogger(__name__)


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
    class_coverage: dict[str, float] = field(default_factory=dict)  # per class with enough boxes
    densest_image_boxes: int = 0  # the most boxes a sampled image has (the loss's anchor matching grows with it)

    def metadata(self) -> dict[str, object]:
        """Flat facts for the Model artifact's metadata."""
        m = self.model
        return {"image_size": m.image_size, "pyramid_levels": f"P{m.min_level}-P{m.max_level}",
                "anchor_size": m.anchor_size, "anchor_scales": m.num_scales,
                "aspect_ratios": ",".join(f"{r:g}" for r in m.aspect_ratios),
                "anchor_coverage": round(self.coverage, 4), "anchor_coverage_fixed_shape": round(self.coverage_fixed, 4),
                "relative_compute": round(self.relative_compute, 2)}


def cost_model(config: ModelConfig) -> CostModel:
    return CostModel(backbone_filters=config.backbone_filters, backbone_blocks=config.backbone_blocks,
                     head_conv_layers=config.head_conv_layers, num_classes=config.num_classes,
                     fpn_filters=config.fpn_filters)


def fit_shape(sample: BoxSample, base: ModelConfig, image_size: int | str, on_gpu: bool,
              allow_poor_anchors: bool = False, tile: str = "none") -> FittedShape:
    """`base` (model_config_for's config of the model size) with the input size (when
    `image_size` is "auto"), levels and anchors fitted to `sample`. Raises PoorAnchors
    when fewer than FAIL_COVERAGE of the boxes (of any class) can match an anchor, unless allowed.
    With `tile` "auto" and an "auto" size, large photos with small objects are seen in tiles at
    full resolution when `tile_choice.choose_tiling` says so (with `tile` "SIZE[:OVERLAP]", always):
    the input size is the tile, and the anchors are fitted to the boxes as the tiles hold them."""
    decisions = {}
    tiling = None
    given = parse_tile(tile)
    if given is not None:
        if image_size not in ("auto", given[0], str(given[0])):
            raise ValueError(f"--tile {tile} makes the model's input the {given[0]}px tile: leave --image-size auto "
                             f"(it is {image_size})")
        tiling, why = given_tiling(sample, *given)
        decisions["tiling"] = f"{tile}: given with --tile: {why}"
    elif tile == "auto" and image_size == "auto":  # auto with a pinned --image-size: whole photos, as asked
        tiling, why = choose_tiling(sample, on_gpu)
        decisions["tiling"] = f"auto: {why}"
    if tiling is not None:  # the size is the tile's; a search over sizes would change the tiles
        sample = tile_box_sample(sample, tiling)
        image_size = size = tiling.tile
        decisions["image_size"] = f"{size}: the tile (see tiling)"
    elif image_size == "auto":
        size, decisions["image_size"] = choose_image_size(sample, on_gpu)
        decisions["image_size"] = "auto: " + decisions["image_size"]
    else:
        size = image_size
        decisions["image_size"] = f"{size}: given with --image-size"
    preset = base.extra.get("preset")
    fixed_levels = (base.min_level, base.max_level) if preset else None
    costs = cost_model(base)
    groups = sample.classes()
    fit = fit_anchors(sample.boxes * size, size, costs, fixed_levels, groups)
    if image_size == "auto" and fit.spec.min_level < PREFERRED_LOWEST_LEVEL:
        size, fit, decisions["size_candidates"] = _cheaper_without_p2(sample, size, fit, costs, groups, on_gpu)
        if not decisions["size_candidates"].startswith(f"{size}px P2"):
            decisions["image_size"] += f"; then raised to {size}px, where P3 and up cover the boxes at less compute"
    spec = fit.spec
    model = replace(base, image_size=size, min_level=spec.min_level, max_level=spec.max_level,
                    anchor_size=spec.anchor_size, num_scales=spec.num_scales, aspect_ratios=spec.aspect_ratios,
                    tiled=tiling is not None, tile_overlap=tiling.overlap if tiling is not None else 0)
    decisions["pyramid_and_anchors"] = fit.reason + (f" (levels fixed by preset {preset})" if preset else "")
    if sample.boxes_per_image is not None:
        limit, decisions["max_detections"] = choose_max_detections(sample)
        model = replace(model, max_detections=limit)
    relative = costs.total(size, spec) / costs.total(FIXED_SIZE, FIXED_SPEC)
    before = coverage(sample.boxes * FIXED_SIZE, FIXED_SPEC, FIXED_SIZE)
    smallest = float((sample.hw * size).min()) if len(sample.boxes) else 0.0
    decisions["anchor_coverage"] = (
        f"{fit.coverage:.1%} of {len(sample.boxes)} sampled training boxes reach IoU 0.5 with an anchor (the fixed "
        f"shape, {FIXED_SIZE}px {FIXED_SPEC.describe()}: {before:.1%}); smallest box side {smallest:.0f}px; "
        f"estimated compute {relative:.2f}x the fixed shape's")
    if -1 not in fit.class_coverage:
        decisions["class_coverage"] = class_coverage_line(sample, fit)
    if fit.weakest < FAIL_COVERAGE:
        worst = "" if -1 in fit.class_coverage else (
            f" ({sample.name(min(fit.class_coverage, key=fit.class_coverage.get))}: {fit.weakest:.0%})")
        problem = (f"only {min(fit.coverage, fit.weakest):.0%} of {len(sample.boxes)} training boxes{worst} can match "
                   f"an anchor with IoU 0.5 at {size}px input even after fitting levels and anchors (needs "
                   f"{FAIL_COVERAGE:.0%} of every class; smallest box side {smallest:.0f}px), so the rest would "
                   "teach the model nothing")
        if not allow_poor_anchors:
            raise PoorAnchors(f"{problem}: pin a larger --image-size (e.g. --image-size {2 * size}) or crop the "
                              "images around the objects; --allow-poor-anchors trains anyway")
        decisions["anchor_coverage"] += f"; WARNING (--allow-poor-anchors): {problem}"
        logger.warning("train: %s (--allow-poor-anchors)", problem)
    return FittedShape(model=model, coverage=fit.coverage, coverage_fixed=before, relative_compute=relative,
                       boxes=len(sample.boxes), smallest_box_px=smallest, decisions=decisions,
                       class_coverage={sample.name(c): v for c, v in fit.class_coverage.items() if c != -1},
                       densest_image_boxes=sample.densest_image_boxes)


def class_coverage_line(sample: BoxSample, fit: AnchorFit) -> str:
    """Per class: boxes sampled, their smallest side, and the share an anchor reaches."""
    counts = {int(c): int((sample.labels == c).sum()) for c in np.unique(sample.labels)}
    parts = [f"{sample.name(c)} {fit.class_coverage[c]:.1%} of {counts[c]}" for c in sorted(fit.class_coverage)]
    few = [sample.name(c) for c in sorted(counts) if c not in fit.class_coverage]
    return ("per class, share of sampled boxes an anchor reaches with IoU 0.5: " + ", ".join(parts)
            + (f"; not fitted to (fewer than {MIN_CLASS_BOXES} boxes sampled): {', '.join(few)}" if few else ""))


def _cheaper_without_p2(sample: BoxSample, size: int, fit: AnchorFit, costs: CostModel,
                        groups: dict[int, np.ndarray], on_gpu: bool) -> tuple[int, AnchorFit, str]:
    """The shape at `size` needs P2; a larger input with P3 and up may cover the boxes at
    less compute (P2's grid is 4x P3's). Tries each larger size up to the cap, takes the
    first where every class reaches FAIL_COVERAGE from P3 up, and keeps the cheaper. Returns the size, its fit, and the
    candidates with their cost, for the plan."""
    fixed = costs.total(FIXED_SIZE, FIXED_SPEC)
    options = [(costs.total(size, fit.spec), size, fit)]
    for larger in range(size + SIZE_STEP, size_cap(sample, on_gpu) + 1, SIZE_STEP):
        other = fit_anchors(sample.boxes * larger, larger, costs, groups=groups, allow_p2=False)
        if other.weakest >= FAIL_COVERAGE:
            options.append((costs.total(larger, other.spec), larger, other))
            break  # larger sizes only cost more at the same levels
    cost, chosen_size, chosen = min(options, key=lambda o: o[0])
    lines = [f"{s}px P{f.spec.min_level}-P{f.spec.max_level}: compute {c / fixed:.1f}x the fixed shape's, worst class "
             f"{f.weakest:.1%} covered" for c, s, f in sorted(options, key=lambda o: o[0])]
    return chosen_size, chosen, "; ".join(lines) + " (the cheapest kept)"


def gpu_visible() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def shape_for_data(data_dir: str, model_size: str, num_classes: int, image_size: int | str, on_gpu: bool,
                   preset: str | None = None, allow_poor_anchors: bool = False, tile: str = "none") -> FittedShape:
    """`fit_shape` of the model size's (or preset's) detector on the train split of the
    shards in `data_dir`."""
    from beam.contract.label_map import read_dataset_label_map
    from components.detector.records import read_box_sample

    sample = read_box_sample(data_dir, label_map=read_dataset_label_map(data_dir))
    return shape_for_sample(sample, model_size, num_classes, image_size, on_gpu, preset, allow_poor_anchors, tile)


def shape_for_sample(sample: BoxSample, model_size: str, num_classes: int, image_size: int | str, on_gpu: bool,
                     preset: str | None = None, allow_poor_anchors: bool = False, tile: str = "none") -> FittedShape:
    """`fit_shape` of the model size's (or preset's) detector on `sample`."""
    # the size given here is a placeholder: fit_shape replaces it with the chosen one
    base = model_config_for(model_size, FIXED_SIZE, num_classes, preset)
    return fit_shape(sample, base, image_size, on_gpu, allow_poor_anchors, tile)


def anchor_spec(model: ModelConfig) -> AnchorSpec:
    """The anchors of a model's config, as the fit describes them."""
    return AnchorSpec(model.min_level, model.max_level, model.anchor_size, model.num_scales, model.aspect_ratios)


def shape_coverage(sample: BoxSample, model: ModelConfig) -> tuple[float, dict[str, float]]:
    """The share of `sample`'s boxes an anchor of `model`'s shape reaches with IoU 0.5, in
    all and per class (classes with enough boxes): how well a kept shape fits new boxes."""
    size = model.image_size
    spec = anchor_spec(model)
    if not len(sample.boxes):
        return 1.0, {}
    hits = best_anchor_iou(sample.boxes * size, spec, size) >= POSITIVE_IOU
    groups = sample.classes()
    per_class = {sample.name(c): float(hits[idx].mean()) for c, idx in groups.items() if c != -1 and len(idx)}
    return float(hits.mean()), per_class


def kept_detection_limit(model: ModelConfig, fresh: FittedShape, source: str) -> tuple[ModelConfig, str]:
    """The detection limit of a continued model, and why: the limit holds no weights (it is
    the decoder's NMS output count), so a run on denser data raises it to what `fresh` fitted
    to this data; it never lowers what the source (a deployed champion) returned.

    >>> dense = FittedShape(ModelConfig(3, max_detections=250), 1.0, 1.0, 1.0, 10, 8.0,
    ...                     {"max_detections": "250: the densest of 9 sampled training images has 160 boxes"})
    >>> raised, why = kept_detection_limit(ModelConfig(3, max_detections=100), dense, "v1")
    >>> raised.max_detections, why
    (250, "250: raised from v1's 100: the densest of 9 sampled training images has 160 boxes")
    >>> kept, why = kept_detection_limit(ModelConfig(3, max_detections=300), dense, "v1")
    >>> kept.max_detections, why
    (300, '300: kept from v1 (this data needs 250)')
    """
    kept, needed = model.max_detections, fresh.model.max_detections
    if needed > kept:
        why = fresh.decisions.get("max_detections", str(needed)).split(": ", 1)[-1]
        return replace(model, max_detections=needed), f"{needed}: raised from {source}'s {kept}: {why}"
    return model, f"{kept}: kept from {source}" + (f" (this data needs {needed})" if needed < kept else "")


def kept_shape(sample: BoxSample, model: ModelConfig, fresh: FittedShape, source: str) -> FittedShape:
    """The shape of a model training starts from (`model`, e.g. the champion's), described
    as `fit_shape` describes a fitted one, with its coverage of this run's boxes; `fresh` is
    the shape fitted to the same boxes, for comparison."""
    covered, per_class = shape_coverage(sample, model)
    spec = anchor_spec(model)
    costs = cost_model(model)
    relative = costs.total(model.image_size, spec) / costs.total(FIXED_SIZE, FIXED_SPEC)
    smallest = float((sample.hw * model.image_size).min()) if len(sample.boxes) else 0.0
    decisions = {
        "image_size": f"{model.image_size}: kept from {source} (its weights are trained at this size)",
        "pyramid_and_anchors": f"{spec.describe()}: kept from {source}",
        "anchor_coverage": (f"{covered:.1%} of {len(sample.boxes)} sampled training boxes reach IoU 0.5 with an "
                            f"anchor of the kept shape (a fresh fit: {fresh.model.image_size}px, "
                            f"{fresh.coverage:.1%}); smallest box side {smallest:.0f}px; estimated compute "
                            f"{relative:.2f}x the fixed shape's"),
    }
    if per_class:
        decisions["class_coverage"] = ("per class, share of sampled boxes an anchor reaches with IoU 0.5: "
                                       + ", ".join(f"{name} {value:.1%}" for name, value in sorted(per_class.items())))
    model, decisions["max_detections"] = kept_detection_limit(model, fresh, source)
    return FittedShape(model=model, coverage=covered, coverage_fixed=fresh.coverage_fixed, relative_compute=relative,
                       boxes=len(sample.boxes), smallest_box_px=smallest, decisions=decisions,
                       class_coverage=per_class, densest_image_boxes=sample.densest_image_boxes)
