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
FAIL_COVERAGE = 0.90  # below this even after fitting, training refuses (unless --allow-poor-anchors)
SMALL_BOX_PERCENTILE = 10
# The smallest anchor detpipe aims the small boxes at: P3 (stride 8) at anchor size 2.
# P2 anchors exist too, but cost 4x P3's compute, so the size rule does not plan on them.
SMALLEST_ANCHOR_PX = 16
MIN_AUTO_SIZE = 128  # below this the backbone sees too little of each object
SIZE_BUDGET = {"cpu": 512, "gpu": 1024}  # largest auto input size per device
SIZE_STEP = 32  # the backbone's deepest stride (P5); levels above come from strided convs that take any size
FIXED_SIZE = 128  # the shape every model had before the fit: 128 px, P4-P6, anchor size 2

LEVEL_RANGE = (2, 7)  # pyramid levels the small ResNet backbone and its FPN can give
# The top level is at least P5, the backbone's deepest stage: below it the FPN would
# leave the deeper stages out (untrained weights) and give the fine levels no context.
MIN_TOP_LEVEL = 5
ANCHOR_SIZES = (1.0, 1.5, 2.0, 3.0, 4.0)  # anchor side in strides, KerasHub's `anchor_size`
NUM_SCALES = (1, 2, 3)
NUM_RATIOS = (1, 2, 3)
FPN_FILTERS = 256  # KerasHub's FPN and prediction heads: fixed width


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


@dataclass(frozen=True)
class BoxSample:
    """Boxes of the train split and the sizes of their images."""

    boxes: np.ndarray  # (N, 4) normalised ymin, xmin, ymax, xmax
    image_long_sides: np.ndarray  # (M,) pixels, one per sampled image

    @property
    def hw(self) -> np.ndarray:
        """(N, 2) normalised heights and widths."""
        return box_hw(self.boxes)


def box_hw(boxes: np.ndarray) -> np.ndarray:
    """(N, 2) heights and widths of (N, 4) yxyx boxes."""
    return np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1)


def choose_image_size(sample: BoxSample, on_gpu: bool) -> tuple[int, str]:
    """The square input size for `--image-size auto`, and why."""
    device = "gpu" if on_gpu else "cpu"
    budget = SIZE_BUDGET[device]
    if not len(sample.boxes):
        return FIXED_SIZE, f"{FIXED_SIZE}: no training boxes to fit to"
    short = np.percentile(sample.hw.min(axis=1), SMALL_BOX_PERCENTILE)
    need = SMALLEST_ANCHOR_PX / max(float(short), 1e-6)
    held = float(np.median(sample.image_long_sides)) if len(sample.image_long_sides) else budget
    reason = (f"the {SMALL_BOX_PERCENTILE}th percentile of the shorter box side is {short:.3f} of the image, "
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
    size = int(math.ceil(need / SIZE_STEP) * SIZE_STEP)
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
    basic blocks, KerasHub's 256-wide FPN and heads), counted over its convolutions: an
    estimate for ranking shapes and for the report, not a measurement."""

    backbone_filters: tuple[int, ...] = (64, 64, 96, 128)
    backbone_blocks: tuple[int, ...] = (1, 1, 1, 1)
    head_conv_layers: int = 1
    num_classes: int = 4

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
        per_position = (9 * FPN_FILTERS**2 * (1 + 2 * self.head_conv_layers)
                        + 9 * FPN_FILTERS * spec.anchors_per_location * (self.num_classes + 4))
        return sum(math.ceil(size / 2**level) ** 2 * per_position for level in range(spec.min_level, spec.max_level + 1))

    def total(self, size: int, spec: AnchorSpec) -> float:
        return self.backbone(size) + self.levels(size, spec)


@dataclass(frozen=True)
class AnchorFit:
    spec: AnchorSpec
    coverage: float
    reason: str
    levels_tried: list[str] = field(default_factory=list)  # cheapest first, the chosen last


def _level_pairs(size: int, fixed_levels: tuple[int, int] | None) -> list[tuple[int, int]]:
    if fixed_levels:
        return [fixed_levels]
    low, high = LEVEL_RANGE
    return [(lo, hi) for lo in range(low, MIN_TOP_LEVEL + 1) for hi in range(max(lo, MIN_TOP_LEVEL), high + 1)]


def fit_anchors(boxes_px: np.ndarray, image_size: int, cost: CostModel,
                fixed_levels: tuple[int, int] | None = None) -> AnchorFit:
    """The cheapest pyramid levels whose best anchor set reaches TARGET_COVERAGE, with that
    anchor set; when no levels reach it, the best coverage found.

    Levels are what cost compute (every level adds an FPN output and two heads over its
    grid); the anchors per location cost little (only each head's last convolution), so
    at given levels the anchor set that covers most boxes, then with the best mean IoU,
    then with the fewest anchors, wins. `fixed_levels`: a pretrained backbone's levels."""
    ratio_sets = [fit_aspect_ratios(box_hw(boxes_px), k) for k in NUM_RATIOS]
    pairs = sorted(_level_pairs(image_size, fixed_levels),
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
                    covered = float((ious >= POSITIVE_IOU).mean())
                    # at these levels: most coverage, then best mean IoU, then fewest anchors
                    key = (covered >= TARGET_COVERAGE, covered, float(ious.mean()), -spec.anchors_per_location)
                    if best is None or key > best[0]:
                        best = (key, spec, covered, (lo, hi))
        if best[0][0]:  # the cheapest levels so far that reach the target: stop here
            break
    _, spec, covered, _ = best
    if covered >= TARGET_COVERAGE:
        skipped = seen[:-1]
        reason = (f"{spec.describe()}: the cheapest levels with {covered:.1%} of the training boxes reaching IoU "
                  f"{POSITIVE_IOU} with an anchor (target {TARGET_COVERAGE:.0%})"
                  + (f"; cheaper levels tried first: {', '.join(skipped[:6])}{' ...' if len(skipped) > 6 else ''}"
                     if skipped else ""))
    else:
        reason = (f"{spec.describe()}: the best coverage found, {covered:.1%} of the training boxes, below the "
                  f"{TARGET_COVERAGE:.0%} target at {image_size}px")
    return AnchorFit(spec=spec, coverage=covered, reason=reason, levels_tried=seen)
