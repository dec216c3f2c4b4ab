"""The written shards counted in tiles: the manifest's `tiles` (beam/contract/manifest.py).

`--tile` on `data build` says what training will do with these photos before anyone trains:
whether `train --tile auto` would cut them into tiles (decided per device budget, since the
data step does not know where training runs: a GPU's 1,024 px tiles, a CPU's 512 px), and
then, per split, how many tiles the photos make, and how many of their boxes lie whole in
some tile (the rest, larger than the overlap holds, the model sees only in parts). The
decision reads the box sample training reads; the counts read every record of a tiled
dataset (boxes and sizes only, no decoding), so a dataset seen whole costs no extra pass.
"""

from __future__ import annotations

from components.detector.records import box_records, read_box_sample, shard_files
from components.detector.tile_choice import (
    Tiling,
    choose_tiling,
    given_tiling,
    parse_tile,
    tiles_per_photo,
    whole_in_a_tile,
)

DEVICES = ("gpu", "cpu")  # whose budget `--tile auto` is decided for


def _split_counts(data_dir: str, split: str, tilings: list[Tiling]) -> list[dict[str, int]]:
    """Per tiling, the split's photos, tiles, boxes and boxes whole in a tile: one read of its records."""
    counts = [{"photos": 0, "tiles": 0, "boxes": 0, "boxes_whole_in_a_tile": 0} for _ in tilings]
    if not shard_files(data_dir, split):
        return counts
    for example in box_records(data_dir, split):
        height, width = int(example["height"]), int(example["width"])
        boxes = example["boxes"].numpy() * [height, width, height, width]
        for tiling, count in zip(tilings, counts):
            count["photos"] += 1
            count["tiles"] += tiles_per_photo(tiling, height, width)
            count["boxes"] += len(boxes)
            count["boxes_whole_in_a_tile"] += int(whole_in_a_tile(boxes, height, width, tiling).sum())
    return counts


def count_tiles(data_dir: str, label_map: dict[str, int] | None = None, mode: str = "auto",
                splits: tuple[str, ...] = ("train", "val")) -> dict:
    """The manifest's `tiles` for `--tile mode` on the shards in `data_dir`: {"mode", "whole":
    {device: why whole photos}, "layouts": [{"devices", "tile", "overlap", "reason", "splits":
    {split: {"photos", "tiles", "boxes", "boxes_whole_in_a_tile"}}}]}. `label_map` names the
    classes in the reasons (the data step's, before its label_map.json is written)."""
    if mode == "none":
        return {"mode": mode, "whole": {"any": "--tile none: whole photos"}, "layouts": []}
    sample = read_box_sample(data_dir, label_map=label_map)
    given = parse_tile(mode)
    if given is not None:
        try:
            decided = [(("any",), *given_tiling(sample, *given))]
        except ValueError as err:  # no train boxes to pick the overlap from
            decided = [(("any",), None, str(err))]
    else:
        decided = [((device,), *choose_tiling(sample, on_gpu=device == "gpu")) for device in DEVICES]
    whole, layouts = {}, []
    for devices, tiling, why in decided:
        if tiling is None:
            whole[devices[0]] = why
            continue
        same = next((layout for layout in layouts if (layout["tile"], layout["overlap"]) == (tiling.tile,
                                                                                            tiling.overlap)), None)
        if same is not None:  # a CPU's tiles equal a GPU's (photos smaller than both budgets)
            same["devices"].extend(devices)
            continue
        layouts.append({"devices": list(devices), "tile": tiling.tile, "overlap": tiling.overlap, "reason": why,
                        "splits": {}})
    tilings = [Tiling(layout["tile"], layout["overlap"]) for layout in layouts]
    for split in splits if layouts else ():  # every layout counted in one read of each split
        for layout, counted in zip(layouts, _split_counts(data_dir, split, tilings)):
            layout["splits"][split] = counted
    return {"mode": mode, "whole": whole, "layouts": layouts}
