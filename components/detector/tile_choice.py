"""Whether a dataset's photos are seen whole or in tiles at full resolution, decided from its boxes.

A detector shrinks a whole photo to its input size (at most `SIZE_BUDGET`: 512 px on a CPU,
1,024 on a GPU), so in a 4,000 px photo a 15 px object becomes 2 to 4 px, below the
smallest anchor (`SMALLEST_ANCHOR_PX`), and the model cannot learn it. `choose_tiling`
picks tiles when, at the input size `choose_image_size` would pick, the small boxes of the
smallest class fall below that anchor while the photos hold them at least
`MIN_TILING_GAIN` times larger at full resolution:

- the tile is the model's input size (the device's budget, at most the photos' median
  short side): a tile is seen at full resolution, one pixel a pixel;
- the overlap is the large boxes' side (`LARGE_BOX_PERCENTILE` of the longer side, in the
  photos' pixels) plus the merge's border margin on both ends, so such an object lies whole
  in some tile (tiles.py drops the fragments that a tile's border cuts); at most half a tile.

Pure numpy, like geometry.py, so the probe, train and the report agree on it by construction.

Example (2,000 x 1,500 photos with 12-20 px objects; every photo's boxes listed):
    >>> rng = np.random.default_rng(0)
    >>> side = rng.uniform(12, 20, (300, 1)) / [1500, 2000]
    >>> corner = rng.uniform(0.1, 0.8, (300, 2))
    >>> sample = BoxSample(np.hstack([corner, corner + side]), np.full(30, 2000.0),
    ...                    boxes_per_image=np.full(30, 10), image_shapes=np.tile([1500, 2000], (30, 1)))
    >>> tiling, why = choose_tiling(sample, on_gpu=False)
    >>> tiling, tiles_per_photo(tiling, 1500, 2000)
    (Tiling(tile=512, overlap=24), 20)
    >>> choose_tiling(BoxSample(sample.boxes * 0 + [0.2, 0.2, 0.5, 0.5], np.full(30, 2000.0),
    ...               boxes_per_image=np.full(30, 10), image_shapes=sample.image_shapes), on_gpu=False)[0] is None
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from components.detector.geometry import (SIZE_BUDGET, SIZE_STEP, SMALL_BOX_PERCENTILE, SMALLEST_ANCHOR_PX, BoxSample,
                                          small_sides)

TILE_MODES = ("auto", "none")  # --tile: decided from the boxes, or whole photos (or SIZE[:OVERLAP]: parse_tile)
DEFAULT_TILE = "auto"  # train's, data build's and the pipeline's --tile
MIN_TILING_GAIN = 1.5  # tile only when full resolution makes the small boxes at least this much larger
LARGE_BOX_PERCENTILE = 99  # the overlap holds boxes up to this percentile of the longer side whole
BORDER_MARGIN = 2.0  # pixels: a box edge this close to a tile's inner border touches it (tiles.py)
OVERLAP_STEP = 8  # the overlap is rounded up to a multiple of this


@dataclass(frozen=True)
class Tiling:
    """Square tiles of `tile` pixels of the photo (the model's input size: full resolution),
    neighbours sharing at least `overlap` pixels."""

    tile: int
    overlap: int

    def __post_init__(self):
        if self.tile < 1 or not 0 <= self.overlap < self.tile:
            raise ValueError(f"a tiling needs tile >= 1 and 0 <= overlap < tile, got tile {self.tile}, "
                             f"overlap {self.overlap}")


def model_tiling(image_size: int, tiled: bool, overlap: int) -> Tiling | None:
    """A model config's tiling (ModelConfig, train_config.json): tiles of its input size, or
    None for whole photos."""
    return Tiling(image_size, overlap) if tiled else None


def tiles_along(length: int, tile: int, overlap: int) -> int:
    """How many tiles cover a side of `length` pixels (tiles.tile_starts lays them out)."""
    return (max(length - tile, 0) + tile - overlap - 1) // (tile - overlap) + 1


def tiles_per_photo(tiling: Tiling, height: int, width: int) -> int:
    return tiles_along(height, tiling.tile, tiling.overlap) * tiles_along(width, tiling.tile, tiling.overlap)


def tile_starts_px(length: int, tile: int, overlap: int) -> np.ndarray:
    """Where the tiles along a side start: tiles.tile_starts' layout in numpy, for counting
    (that one runs inside the SavedModel's graph on a photo's dynamic size; a test holds the
    two equal).

    >>> tile_starts_px(1000, 512, 64).tolist(), tile_starts_px(300, 512, 64).tolist()
    ([0, 244, 488], [0])
    """
    span, count = max(length - tile, 0), tiles_along(length, tile, overlap)
    gaps = max(count - 1, 1)
    return (np.arange(count) * span + gaps // 2) // gaps


def whole_in_a_tile(boxes_px: np.ndarray, height: int, width: int, tiling: Tiling) -> np.ndarray:
    """Which of a photo's boxes ((N, 4) yxyx, its pixels) lie whole in at least one of its tiles:
    the ones the tiled model can see whole (the others, larger than the overlap allows, are
    seen only in parts)."""
    boxes_px = np.asarray(boxes_px, np.float64).reshape(-1, 4)
    whole = np.ones(len(boxes_px), bool)
    for axis, length in ((0, height), (1, width)):
        starts = tile_starts_px(length, tiling.tile, tiling.overlap)[None, :]
        low, high = boxes_px[:, axis, None], boxes_px[:, axis + 2, None]
        whole &= ((starts <= low + 1e-6) & (high <= starts + tiling.tile + 1e-6)).any(axis=1)
    return whole


def box_pixel_hw(sample: BoxSample) -> np.ndarray | None:
    """(N, 2) box heights and widths in their photos' own pixels; None when the sample does
    not say which photo (of which size) each box is in."""
    if sample.image_shapes is None or sample.boxes_per_image is None:
        return None
    shapes = np.repeat(np.asarray(sample.image_shapes, np.float64), sample.boxes_per_image, axis=0)
    return sample.hw * shapes


def choose_tiling(sample: BoxSample, on_gpu: bool) -> tuple[Tiling | None, str]:
    """Tiles for `--tile auto` (None: whole photos), and why."""
    pixels = box_pixel_hw(sample)
    if pixels is None or not len(pixels):
        return None, "whole photos: no training boxes with their photos' sizes to decide from"
    device = "gpu" if on_gpu else "cpu"
    shapes = np.asarray(sample.image_shapes, np.float64)
    median_short = float(np.median(shapes.min(axis=1)))
    median_long = float(np.median(shapes.max(axis=1)))
    # The input size a whole photo is shrunk to: choose_image_size's cap (its rule wants more).
    whole_size = min(SIZE_BUDGET[device], median_long)
    groups = sample.classes()
    per_class = small_sides(sample.hw, groups)
    smallest = min(per_class, key=per_class.get)
    at_whole = per_class[smallest] * whole_size
    native = small_sides(pixels, {smallest: groups[smallest]})[smallest]
    whose = "the boxes'" if smallest == -1 else f"{sample.name(smallest)}'s"
    small = f"the {SMALL_BOX_PERCENTILE}th percentile of {whose} shorter side"
    if at_whole >= SMALLEST_ANCHOR_PX:
        return None, (f"whole photos: {small} is {at_whole:.1f}px at a {whole_size:.0f}px input, at least the "
                      f"smallest anchor ({SMALLEST_ANCHOR_PX}px)")
    if native < MIN_TILING_GAIN * at_whole:
        return None, (f"whole photos: {small} is {at_whole:.1f}px at a {whole_size:.0f}px input, under the smallest "
                      f"anchor ({SMALLEST_ANCHOR_PX}px), but only {native:.1f}px at full resolution: tiles would not "
                      f"enlarge it {MIN_TILING_GAIN:g}x")
    tile = max(SIZE_STEP, int(min(SIZE_BUDGET[device], median_short) // SIZE_STEP) * SIZE_STEP)
    tiling, holds = _with_overlap(pixels, tile)
    return tiling, (f"tiles of {tile}px at full resolution, overlapping by {tiling.overlap}px: {small} would be "
                    f"{at_whole:.1f}px at a {whole_size:.0f}px input, under the smallest anchor "
                    f"({SMALLEST_ANCHOR_PX}px), and is {native:.1f}px at full resolution; {holds}; "
                    f"a median photo takes {windows_per_photo(sample, tiling)} tiles")


def _with_overlap(pixels: np.ndarray, tile: int) -> tuple[Tiling, str]:
    """Tiles of `tile` px overlapping by the large boxes' side (`LARGE_BOX_PERCENTILE` of the
    boxes' longer side in `pixels`) plus the merge's margin on both ends, at most half a tile."""
    large = float(np.percentile(pixels.max(axis=1), LARGE_BOX_PERCENTILE))
    wanted = int(math.ceil((large + 2 * BORDER_MARGIN) / OVERLAP_STEP) * OVERLAP_STEP)
    overlap = min(wanted, tile // 2)
    capped = "" if overlap == wanted else (
        f"; capped at half a tile, so boxes above {overlap - 2 * BORDER_MARGIN:.0f}px may lie whole in no tile")
    return Tiling(tile=tile, overlap=overlap), (f"the overlap holds the {LARGE_BOX_PERCENTILE}th percentile of the "
                                                f"longer box side ({large:.0f}px) whole{capped}")


def parse_tile(value: str) -> tuple[int, int | None] | None:
    """`--tile SIZE[:OVERLAP]` → (SIZE, OVERLAP, None when left to the boxes); None for the
    modes (auto, none). Raises ValueError saying what is wrong.

    >>> parse_tile("auto"), parse_tile("640"), parse_tile("640:64")
    (None, (640, None), (640, 64))
    """
    if value in TILE_MODES:
        return None
    text, _, overlap_text = str(value).partition(":")
    try:
        size, overlap = int(text), (int(overlap_text) if overlap_text else None)
    except ValueError:
        raise ValueError(f"--tile {value!r}: give auto, none or SIZE[:OVERLAP] in pixels (e.g. 640 or 640:64)") \
            from None
    if size < 2 * SIZE_STEP or size % SIZE_STEP:
        raise ValueError(f"--tile {value}: the tile SIZE is the model's input: a multiple of {SIZE_STEP} px, at "
                         f"least {2 * SIZE_STEP}")
    if overlap is not None and not 0 <= overlap <= size // 2:
        raise ValueError(f"--tile {value}: the OVERLAP must be 0 to half the tile ({size // 2} px)")
    return size, overlap


def given_tiling(sample: BoxSample, size: int, overlap: int | None) -> tuple[Tiling, str]:
    """The tiling `--tile SIZE[:OVERLAP]` asks for (the overlap, when not given, as auto picks
    it: from the large boxes), and what it means."""
    if overlap is None:
        pixels = box_pixel_hw(sample)
        if pixels is None or not len(pixels):
            raise ValueError(f"--tile {size}: no training boxes with their photos' sizes to choose the overlap "
                             f"from; give it (--tile {size}:OVERLAP)")
        tiling, holds = _with_overlap(pixels, size)
    else:
        tiling, holds = Tiling(tile=size, overlap=overlap), "the overlap given"
    count = "" if sample.image_shapes is None else f"; a median photo takes {windows_per_photo(sample, tiling)} tiles"
    return tiling, f"tiles of {size}px at full resolution, overlapping by {tiling.overlap}px ({holds}){count}"


def windows_per_photo(sample: BoxSample, tiling: Tiling) -> int:
    """Training windows per photo and pass: the tiles a median photo of the sample takes."""
    shapes = np.asarray(sample.image_shapes, np.float64)
    return tiles_per_photo(tiling, int(np.median(shapes[:, 0])), int(np.median(shapes[:, 1])))


def tile_box_sample(sample: BoxSample, tiling: Tiling) -> BoxSample:
    """The sample as the model sees it in tiles: each box at its full-resolution size, placed
    where it lies within its tile (its centre modulo the tile), normalised by the tile; one
    "image" of the tile's side per photo. What the anchors are fitted to when tiling."""
    pixels = box_pixel_hw(sample)
    shapes = np.repeat(np.asarray(sample.image_shapes, np.float64), sample.boxes_per_image, axis=0)
    centre = (sample.boxes[:, :2] + sample.boxes[:, 2:]) / 2 * shapes
    inside = np.mod(centre, tiling.tile - tiling.overlap) if tiling.tile > tiling.overlap else centre
    boxes = np.hstack([inside - pixels / 2, inside + pixels / 2]) / tiling.tile
    return replace(sample, boxes=boxes, image_long_sides=np.full(len(sample.image_long_sides), float(tiling.tile)),
                   image_shapes=np.full((len(sample.image_long_sides), 2), float(tiling.tile)))
