"""The detector's geometry fitted to the training boxes: the input size, the pyramid
levels and the anchors. Pure numpy, no TensorFlow.

RetinaNet learns from a box only through an anchor that overlaps it with IoU >= 0.5
(KerasHub's label encoder); a box no anchor reaches teaches the model nothing, and a set
of such boxes trains to a loss of 0. So the geometry is chosen in three steps:

1. the input size (`choose_image_size`): large enough that the small boxes (the 10th
   percentile of the shorter side) reach the smallest anchor detpipe would use, never
   above what the images hold (their median long side) nor a per-device budget;
2. the anchors' aspect ratios from the boxes' own shapes (`fit_aspect_ratios`);
3. the pyramid levels and anchor sizes (`fit_anchors`): the cheapest levels whose anchors
   let at least 95% of the boxes reach IoU 0.5, counted on the real anchor grid.

Anchors are computed the way KerasHub's `AnchorGenerator` computes them (tested against
it in tests/test_geometry.py), so coverage here is what training will see.

Example (only square boxes, 20-40 px in 128 px images):
    >>> rng = np.random.default_rng(0)
    >>> side = rng.uniform(20, 40, 200) / 128
    >>> centre = rng.uniform(0.3, 0.7, (200, 2))
    >>> boxes = np.stack([centre[:, 0] - side / 2, centre[:, 1] - side / 2,
    ...                   centre[:, 0] + side / 2, centre[:, 1] + side / 2], 1)
    >>> size, _ = choose_image_size(BoxSample(boxes, np.full(50, 128)), on_gpu=False)
    >>> fit = fit_anchors(boxes * size, size, CostModel())
    >>> size, fit.spec.min_level, fit.coverage >= 0.95
    (128, 3, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

POSITIVE_IOU = 0.5  # KerasHub RetinaNetLabelEncoder's positive threshold
TARGET_COVERAGE = 0.95  # share of training boxes that should reach POSITIVE_IOU with some anchor
CLASS_TARGET_COVERAGE = 0.90  # ... and of each class's boxes (a small class may sit below the rest)
# Below this for some class even after fitting, training refuses (unless --allow-poor-anchors).
# Lower than the target because reaching it may take P2 (see PREFERRED_LOWEST_LEVEL). (Matching
# every box to its best anchor whatever the IoU would let uncovered boxes train too, but
# KerasHub 0.31's BoxMatcher cannot: its force match indexes past the last box.)
FAIL_COVERAGE = 0.75
SMALL_BOX_PERCENTILE = 10
# A class counts for the size rule and the coverage target with at least this many sampled
# boxes: fewer give no stable percentile (and such a class is reported, not fitted to).
MIN_CLASS_BOXES = 20
# The smallest anchor detpipe aims the small boxes at: P3 (stride 8) at anchor size 2.
# P2 anchors exist too, but cost 4x P3's compute, so the size rule does not plan on them.
SMALLEST_ANCHOR_PX = 16
MIN_AUTO_SIZE = 128  # below this the backbone sees too little of each object
SIZE_BUDGET = {"cpu": 512, "gpu": 1024}  # largest auto input size per device
COCO_MAX_DETECTIONS = 100  # detections per image COCO's metrics count, and the model's limit for sparse images
DETECTION_HEADROOM = 1.5  # for denser images: this times the densest image's boxes ...
DETECTION_STEP = 50  # ... rounded up to a multiple of this ...
MAX_DETECTIONS_LIMIT = 1000  # ... and at most this (each image's NMS keeps up to this many)
SIZE_STEP = 32  # the backbone's deepest stride (P5); levels above come from strided convs that take any size
FIXED_SIZE = 128  # the shape every model had before the fit: 128 px, P4-P6, anchor size 2

LEVEL_RANGE = (2, 7)  # pyramid levels the small ResNet backbone and its FPN can give
# The top level is at least P5, the backbone's deepest stage: below it the FPN would
# leave the deeper stages out (untrained weights) and give the fine levels no context.
MIN_TOP_LEVEL = 5
ANCHOR_SIZES = (1.0, 1.5, 2.0, 3.0, 4.0)  # anchor side in strides, KerasHub's `anchor_size`
NUM_SCALES = (1, 2, 3)
NUM_RATIOS = (1, 2, 3)
HEAD_FILTERS = 256  # KerasHub's head conv layers: fixed width


@dataclass(frozen=True)
class AnchorSpec:
    """The arguments of KerasHub's AnchorGenerator that the fit chooses."""

    min_level: int = 4
    max_level: int = 6
    anchor_size: float = 2.0
    num_scales: int = 3
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)  # height / width

    @property
    def anchors_per_location(self) -> int:
        return self.num_scales * len(self.aspect_ratios)

    def describe(self) -> str:
        ratios = ", ".join(f"{r:g}" for r in self.aspect_ratios)
        return (f"P{self.min_level}-P{self.max_level}, anchor size {self.anchor_size:g} strides, "
                f"{self.num_scales} scale(s), aspect ratios (h/w) {ratios}")


FIXED_SPEC = AnchorSpec()


def pyramid_positions(image_size: int, min_level: int, max_level: int) -> int:
    """Grid positions over the pyramid levels: at each, KerasHub's feature map (and anchor
    grid) of ceil(size / stride) squared.

    >>> pyramid_positions(256, 3, 7), pyramid_positions(97, 3, 6)
    (1364, 238)
    """
    return sum(math.ceil(image_size / 2**level) ** 2 for level in range(min_level, max_level + 1))


@dataclass(frozen=True)
class BoxSample:
    """Boxes of the train split and the sizes of their images."""

    boxes: np.ndarray  # (N, 4) normalised ymin, xmin, ymax, xmax
    image_long_sides: np.ndarray  # (M,) pixels, one per sampled image
    labels: np.ndarray | None = None  # (N,) class ids of the boxes; None: one group
    class_names: dict[int, str] = field(default_factory=dict)  # for the reasons; "class N" without
    boxes_per_image: np.ndarray | None = None  # (M,) boxes of each sampled image; None: not counted
    image_shapes: np.ndarray | None = None  # (M, 2) heights and widths of the sampled images; None: not read

    @property
    def densest_image_boxes(self) -> int:
        """The most boxes any sampled image has (0 when not counted or nothing sampled)."""
        counts = self.boxes_per_image
        return int(counts.max()) if counts is not None and len(counts) else 0

    @property
    def hw(self) -> np.ndarray:
        """(N, 2) normalised heights and widths."""
        return box_hw(self.boxes)

    def name(self, label: int) -> str:
        return self.class_names.get(int(label), f"class {int(label)}")

    def classes(self) -> dict[int, np.ndarray]:
        """Box indices per class with at least MIN_CLASS_BOXES boxes (every box as one group,
        -1, without labels or when no class has that many)."""
        if self.labels is None or not len(self.boxes):
            return {-1: np.arange(len(self.boxes))}
        groups = {int(c): np.flatnonzero(self.labels == c) for c in np.unique(self.labels)}
        kept = {c: idx for c, idx in groups.items() if len(idx) >= MIN_CLASS_BOXES}
        return kept or {-1: np.arange(len(self.boxes))}


def box_hw(boxes: np.ndarray) -> np.ndarray:
    """(N, 2) heights and widths of (N, 4) yxyx boxes."""
    return np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1)


def small_sides(hw: np.ndarray, groups: dict[int, np.ndarray]) -> dict[int, float]:
    """Per group (class) of the (N, 2) heights and widths, the SMALL_BOX_PERCENTILE-th
    percentile of the shorter side: what the size rule and the finest level serve."""
    shorter = hw.min(axis=1)
    return {c: float(np.percentile(shorter[idx], SMALL_BOX_PERCENTILE)) for c, idx in groups.items() if len(idx)}


def size_cap(sample: BoxSample, on_gpu: bool) -> int:
    """The largest input size `auto` may choose: the images' median long side or the
    device's budget, whichever is smaller, as a multiple of SIZE_STEP."""
    budget = SIZE_BUDGET["gpu" if on_gpu else "cpu"]
    held = float(np.median(sample.image_long_sides)) if len(sample.image_long_sides) else budget
    return max(SIZE_STEP, int(min(held, budget) // SIZE_STEP) * SIZE_STEP)


def choose_max_detections(sample: BoxSample) -> tuple[int, str]:
    """The most detections the model returns for one image, and why: COCO's 100, or for
    denser images 1.5x the densest sampled image's boxes (in steps of 50, at most
    MAX_DETECTIONS_LIMIT). With a fixed 100 an image of 150 objects could never show them
    all, and its recall (and AP) would be capped by the limit, not the model.

    >>> def counted(*counts):
    ...     return BoxSample(np.zeros((0, 4)), np.zeros(len(counts)), boxes_per_image=np.array(counts))
    >>> choose_max_detections(counted(3, 12, 40))[0], choose_max_detections(counted(90, 187))[0]
    (100, 300)
    """
    densest = sample.densest_image_boxes
    need = int(math.ceil(densest * DETECTION_HEADROOM / DETECTION_STEP)) * DETECTION_STEP
    described = f"the densest of {len(sample.image_long_sides)} sampled training images has {densest} boxes"
    if need <= COCO_MAX_DETECTIONS:
        return COCO_MAX_DETECTIONS, f"{COCO_MAX_DETECTIONS} (COCO's): {described}"
    if need > MAX_DETECTIONS_LIMIT:
        return MAX_DETECTIONS_LIMIT, f"{MAX_DETECTIONS_LIMIT}: {described}; {DETECTION_HEADROOM:g}x that is capped"
    return need, f"{need}: {described}, {DETECTION_HEADROOM:g}x that in steps of {DETECTION_STEP}"


def choose_image_size(sample: BoxSample, on_gpu: bool) -> tuple[int, str]:
    """The square input size for `--image-size auto`, and why."""
    device = "gpu" if on_gpu else "cpu"
    budget = SIZE_BUDGET[device]
    if not len(sample.boxes):
        return FIXED_SIZE, f"{FIXED_SIZE}: no training boxes to fit to"
    # Per class, so a class of small objects is not outvoted by a numerous class of large ones.
    per_class = small_sides(sample.hw, sample.classes())
    smallest = min(per_class, key=per_class.get)
    short = per_class[smallest]
    need = SMALLEST_ANCHOR_PX / max(float(short), 1e-6)
    held = float(np.median(sample.image_long_sides)) if len(sample.image_long_sides) else budget
    whose = "" if smallest == -1 else (
        f" of {sample.name(smallest)}, the smallest of {len(per_class)} class(es) with >= {MIN_CLASS_BOXES} boxes "
        f"({', '.join(f'{sample.name(c)} {v:.3f}' for c, v in sorted(per_class.items()))})")
    reason = (f"the {SMALL_BOX_PERCENTILE}th percentile of the shorter box side{whose} is {short:.3f} of the image, "
              f"so {need:.0f}px makes it {SMALLEST_ANCHOR_PX}px (the smallest P3 anchor)")
    if need > min(held, budget):
        cap, why = (held, f"the images' median long side {held:.0f}px") if held <= budget else (
            budget, f"the {device.upper()} budget of {budget}px")
        size = max(SIZE_STEP, int(cap // SIZE_STEP) * SIZE_STEP)
        return size, f"{size}: {reason}; capped by {why}, rounded down to a multiple of {SIZE_STEP}"
    if need < MIN_AUTO_SIZE:
        size = min(MIN_AUTO_SIZE, max(SIZE_STEP, int(held // SIZE_STEP) * SIZE_STEP))
        return size, f"{size}: {reason}; raised to the floor of {MIN_AUTO_SIZE}px" + (
            f", capped by the images' median long side {held:.0f}px" if size < MIN_AUTO_SIZE else "")
    size = int(math.ceil(need / SIZE_STEP - 1e-9) * SIZE_STEP)  # 320.00000001 is 320
    return size, f"{size}: {reason}; rounded up to a multiple of {SIZE_STEP}"


def anchor_half_sizes(spec: AnchorSpec, level: int) -> np.ndarray:
    """(K, 2) half-heights and half-widths in pixels of one level's anchors, rounded as
    KerasHub's AnchorGenerator rounds them (float32, round half to even)."""
    sizes = np.array([int(2**level * spec.anchor_size * 2 ** (s / spec.num_scales)) for s in range(spec.num_scales)],
                     np.float32)
    h_ratios = np.sqrt(np.asarray(spec.aspect_ratios, np.float32))
    hs = (h_ratios[:, None] * sizes[None, :]).reshape(-1)
    ws = ((1 / h_ratios)[:, None] * sizes[None, :]).reshape(-1)
    return np.round(np.stack([hs, ws], 1) / 2).astype(np.float64)


def best_anchor_iou(boxes_px: np.ndarray, spec: AnchorSpec, image_size: int) -> np.ndarray:
    """For each box (yxyx, model-input pixels), the best IoU of any anchor on the grid.

    For one anchor shape the IoU only falls as its centre moves away from the box's in
    either axis, so the nearest grid centre of each level is the one to test."""
    y0, x0, y1, x1 = (boxes_px[:, i][:, None] for i in range(4))
    cy, cx = (y0 + y1) / 2, (x0 + x1) / 2
    area = (y1 - y0) * (x1 - x0)
    best = np.zeros(len(boxes_px))
    for level in range(spec.min_level, spec.max_level + 1):
        cells = math.ceil(image_size / 2**level)
        stride = image_size // cells  # KerasHub: centres at i * stride, i = 0 .. cells - 1
        ay = np.clip(np.rint(cy / stride), 0, cells - 1) * stride
        ax = np.clip(np.rint(cx / stride), 0, cells - 1) * stride
        half = anchor_half_sizes(spec, level)
        hh, hw = half[None, :, 0], half[None, :, 1]
        inter = (np.clip(np.minimum(y1, ay + hh) - np.maximum(y0, ay - hh), 0, None)
                 * np.clip(np.minimum(x1, ax + hw) - np.maximum(x0, ax - hw), 0, None))
        iou = inter / np.maximum(area + 4 * hh * hw - inter, 1e-12)
        best = np.maximum(best, iou.max(axis=1))
    return best


def coverage(boxes_px: np.ndarray, spec: AnchorSpec, image_size: int) -> float:
    """Share of the boxes that some anchor reaches with IoU >= 0.5."""
    if not len(boxes_px):
        return 1.0
    return float((best_anchor_iou(boxes_px, spec, image_size) >= POSITIVE_IOU).mean())


def fit_aspect_ratios(hw: np.ndarray, k: int, iterations: int = 20) -> tuple[float, ...]:
    """`k` anchor aspect ratios (height / width) from the boxes' shapes.

    This is k-means with YOLO's 1 - IoU distance over the box shapes scaled to one area
    (sizes are the levels' and scales' job). For two such shapes the IoU is
    q / (2 - q) with q = exp(-|log r1 - log r2| / 2), a function of the distance in
    log ratio alone, so the clustering runs in one dimension on log(h / w); the centres
    are the clusters' medians (robust to a few odd boxes). Deterministic: starts at
    quantiles. Written by hand: no library clusters with this distance, and it is short."""
    ratios = np.log(np.maximum(hw[:, 0], 1e-9) / np.maximum(hw[:, 1], 1e-9))
    if not len(ratios):
        return {1: (1.0,), 2: (0.5, 2.0)}.get(k, FIXED_SPEC.aspect_ratios)
    centres = np.quantile(ratios, (np.arange(k) + 0.5) / k)
    for _ in range(iterations):
        nearest = np.abs(ratios[:, None] - centres[None, :]).argmin(axis=1)
        moved = np.array([np.median(ratios[nearest == j]) if (nearest == j).any() else centres[j] for j in range(k)])
        if np.allclose(moved, centres):
            break
        centres = moved
    return tuple(sorted({float(np.round(np.exp(c), 2)) for c in centres}))


@dataclass(frozen=True)
class CostModel:
    """Multiply-accumulates of one forward pass of detpipe's RetinaNet (small ResNet with
    basic blocks, an FPN `fpn_filters` wide, KerasHub's 256-wide head convs), counted over
    its convolutions: an estimate for ranking shapes and for the report, not a measurement."""

    backbone_filters: tuple[int, ...] = (64, 64, 96, 128)
    backbone_blocks: tuple[int, ...] = (1, 1, 1, 1)
    head_conv_layers: int = 1
    num_classes: int = 4
    fpn_filters: int = 256

    def backbone(self, size: int) -> float:
        side = size / 2
        macs = side**2 * 49 * 3 * self.backbone_filters[0]  # 7x7 stem at stride 2, then a stride-2 pool
        channels = self.backbone_filters[0]
        for stage, (filters, blocks) in enumerate(zip(self.backbone_filters, self.backbone_blocks)):
            side = size / 2 ** (stage + 2)
            macs += side**2 * 9 * (channels * filters + filters * filters * (2 * blocks - 1))
            channels = filters
        return macs

    def levels(self, size: int, spec: AnchorSpec) -> float:
        """The FPN and both heads over the pyramid levels."""
        fpn, heads = self.fpn_filters, self.head_conv_layers
        head_convs = 2 * (9 * fpn * HEAD_FILTERS + 9 * HEAD_FILTERS**2 * (heads - 1)) if heads else 0
        predicted_from = HEAD_FILTERS if heads else fpn  # the prediction layers read the last conv or the FPN
        per_position = (9 * fpn**2 + head_convs
                        + 9 * predicted_from * spec.anchors_per_location * (self.num_classes + 4))
        return pyramid_positions(size, spec.min_level, spec.max_level) * per_position

    def total(self, size: int, spec: AnchorSpec) -> float:
        return self.backbone(size) + self.levels(size, spec)


@dataclass(frozen=True)
class AnchorFit:
    spec: AnchorSpec
    coverage: float  # over all boxes
    reason: str
    levels_tried: list[str] = field(default_factory=list)  # cheapest first, the chosen last
    class_coverage: dict[int, float] = field(default_factory=dict)  # per group of `fit_anchors`' groups

    @property
    def reached(self) -> bool:
        """The fit's target: TARGET_COVERAGE of all boxes and CLASS_TARGET_COVERAGE of each class's."""
        return self.coverage >= TARGET_COVERAGE and self.weakest >= CLASS_TARGET_COVERAGE

    @property
    def weakest(self) -> float:
        """The coverage of the worst-covered class (all boxes without classes)."""
        return min(self.class_coverage.values(), default=self.coverage)


# P2 costs 4x P3's compute and trained worst in measurement (issue 24: 9-22 px objects at
# 352 px, P2-P5 with 100% coverage reached AP50 0.04 in 8 epochs at 68x the compute; P3-P5
# with 83% reached 0.52 in 15): P2 only when from P3 up some class stays below FAIL_COVERAGE.
PREFERRED_LOWEST_LEVEL = 3


# Localisation needs the small boxes to span a few cells of the finest level: on the demo
# (10th percentile of the shorter side 27 px at 128 px) P4-P5 (1.7 cells) reached mAP 0.67
# and P3-P5 (3.4 cells) 0.84 in the same 8 epochs and about the same CPU time (docs/training.md).
MIN_CELLS_PER_BOX = 3


def finest_level_needed(boxes_px: np.ndarray, groups: dict[int, np.ndarray]) -> int:
    """The coarsest level whose stride fits MIN_CELLS_PER_BOX times into the small boxes'
    shorter side (the 10th percentile of the class with the smallest), from P3 to P5.

    >>> finest_level_needed(np.array([[0, 0, 27, 27.0]]), {-1: np.arange(1)})
    3
    """
    sides = small_sides(box_hw(boxes_px) if len(boxes_px) else np.zeros((0, 2)), groups)
    if not sides:
        return MIN_TOP_LEVEL
    level = math.floor(math.log2(max(min(sides.values()) / MIN_CELLS_PER_BOX, 1.0)))
    return int(min(max(level, PREFERRED_LOWEST_LEVEL), MIN_TOP_LEVEL))


def _level_pairs(size: int, fixed_levels: tuple[int, int] | None, lowest: int,
                 finest: int = MIN_TOP_LEVEL) -> list[tuple[int, int]]:
    if fixed_levels:
        return [fixed_levels]
    low, high = LEVEL_RANGE
    return [(lo, hi) for lo in range(max(low, lowest), min(finest, MIN_TOP_LEVEL) + 1)
            for hi in range(max(lo, MIN_TOP_LEVEL), high + 1)]


def fit_anchors(boxes_px: np.ndarray, image_size: int, cost: CostModel,
                fixed_levels: tuple[int, int] | None = None, groups: dict[int, np.ndarray] | None = None,
                allow_p2: bool = True) -> AnchorFit:
    """The cheapest pyramid levels whose best anchor set lets TARGET_COVERAGE of the boxes
    of every group (class) reach IoU 0.5, with that anchor set; when no levels reach it,
    the best found. P2 only when no levels from P3 reach it (and `allow_p2`).

    Levels are what cost compute (every level adds an FPN output and two heads over its
    grid); the anchors per location cost little (only each head's last convolution), so
    at given levels the anchor set that covers the worst-covered class most, then all
    boxes, then with the best mean IoU, then with the fewest anchors, wins. `groups`: box
    indices per class (BoxSample.classes); `fixed_levels`: a pretrained backbone's levels."""
    groups = groups or {-1: np.arange(len(boxes_px))}
    fit = _fit_from(boxes_px, image_size, cost, fixed_levels, groups, PREFERRED_LOWEST_LEVEL)
    if fit.weakest < FAIL_COVERAGE and allow_p2 and not fixed_levels and LEVEL_RANGE[0] < PREFERRED_LOWEST_LEVEL:
        finer = _fit_from(boxes_px, image_size, cost, fixed_levels, groups, LEVEL_RANGE[0])
        if finer.weakest > fit.weakest:
            return finer
    return fit


def _fit_from(boxes_px: np.ndarray, image_size: int, cost: CostModel, fixed_levels: tuple[int, int] | None,
              groups: dict[int, np.ndarray], lowest: int) -> AnchorFit:
    ratio_sets = [fit_aspect_ratios(box_hw(boxes_px), k) for k in NUM_RATIOS]
    if len(groups) > 1:  # each class's own typical shape, so a few odd-shaped boxes of one class are not outvoted
        own = {float(np.round(np.exp(np.median(np.log(np.maximum(hw[:, 0], 1e-9) / np.maximum(hw[:, 1], 1e-9)))), 2))
               for hw in (box_hw(boxes_px[idx]) for idx in groups.values() if len(idx))}
        if len(own) <= max(NUM_RATIOS):
            ratio_sets.append(tuple(sorted(own)))
    finest = finest_level_needed(boxes_px, groups)
    pairs = sorted(_level_pairs(image_size, fixed_levels, lowest, finest),
                   key=lambda p: (cost.levels(image_size, AnchorSpec(*p)), -p[1]))
    best: tuple | None = None
    seen = []
    for lo, hi in pairs:
        seen.append(f"P{lo}-P{hi}")
        for size in ANCHOR_SIZES:
            for scales in NUM_SCALES:
                for ratios in ratio_sets:
                    spec = AnchorSpec(lo, hi, size, scales, ratios)
                    ious = best_anchor_iou(boxes_px, spec, image_size) if len(boxes_px) else np.ones(1)
                    hits = ious >= POSITIVE_IOU
                    per_class = {c: float(hits[idx].mean()) if len(idx) else 1.0 for c, idx in groups.items()}
                    weakest = min(per_class.values())
                    # at these levels: the worst class's coverage, then all boxes', then mean IoU, then fewest anchors
                    reached = hits.mean() >= TARGET_COVERAGE and weakest >= CLASS_TARGET_COVERAGE
                    key = (reached, weakest, float(hits.mean()), float(ious.mean()), -spec.anchors_per_location)
                    if best is None or key > best[0]:
                        best = (key, spec, float(hits.mean()), per_class)
        if best[0][0]:  # the cheapest levels so far that reach the target: stop here
            break
    (reached, *_), spec, covered, per_class = best
    weakest = min(per_class.values())
    if reached:
        skipped = seen[:-1]
        reason = (f"{spec.describe()}: the cheapest levels from P{finest} or finer (the small boxes span "
                  f"{MIN_CELLS_PER_BOX}+ of its cells) with {covered:.1%} of the training boxes"
                  + (f" (and at least {weakest:.1%} of every class's)" if len(per_class) > 1 else "")
                  + f" reaching IoU {POSITIVE_IOU} with an anchor (target {TARGET_COVERAGE:.0%}"
                  + (f", {CLASS_TARGET_COVERAGE:.0%} of each class's)" if len(per_class) > 1 else ")")
                  + (f"; cheaper levels tried first: {', '.join(skipped[:6])}{' ...' if len(skipped) > 6 else ''}"
                     if skipped else ""))
    else:
        reason = (f"{spec.describe()}: the best coverage found, {covered:.1%} of the training boxes"
                  + (f" ({weakest:.1%} of the worst-covered class's)" if len(per_class) > 1 else "")
                  + f", below the target ({TARGET_COVERAGE:.0%}, {CLASS_TARGET_COVERAGE:.0%} of each class's) at "
                  f"{image_size}px")
    return AnchorFit(spec=spec, coverage=covered, reason=reason, levels_tried=seen, class_coverage=per_class)
