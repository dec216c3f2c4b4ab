"""Tiles of large photos: the layout covers every pixel with the asked overlap and no tile
too many, tiles are the photo's pixels, and the tiles' detections merge into the photo's:
an object cut by a tile border is one detection in the photo's pixels."""

import numpy as np
import pytest
import tensorflow as tf

from components.detector.tile_choice import Tiling
from components.detector.tile_choice import tiles_along
from components.detector.tiles import PAD_GREY, cut_tiles, detect_tiled, merge_tile_detections, tile_starts


@pytest.mark.parametrize("length,tile,overlap", [(1000, 512, 64), (512, 512, 64), (513, 512, 0), (4000, 640, 90),
                                                  (641, 640, 639), (37, 64, 8), (2000, 320, 160)])
def test_tiles_cover_the_side_overlapping_by_at_least_the_overlap_with_the_fewest_tiles(length, tile, overlap):
    starts = tile_starts(length, tile, overlap).numpy()
    assert len(starts) == tiles_along(length, tile, overlap)  # the count tile_choice plans with
    assert starts[0] == 0 and starts[-1] == max(length - tile, 0)
    assert (np.diff(starts) > 0).all()
    assert (tile - np.diff(starts) >= overlap).all()  # neighbours share at least `overlap` pixels
    if len(starts) > 1:  # one tile fewer could not cover the side with that overlap
        assert (len(starts) - 2) * (tile - overlap) + tile < length


@pytest.mark.parametrize("length,tile,overlap", [(1000, 512, 64), (513, 512, 0), (4000, 640, 90), (37, 64, 8),
                                                  (2000, 320, 160), (1799, 1024, 48)])
def test_the_counted_layout_is_the_layout_the_model_cuts(length, tile, overlap):
    from components.detector.tile_choice import tile_starts_px

    assert tile_starts_px(length, tile, overlap).tolist() == tile_starts(length, tile, overlap).numpy().tolist()


def test_a_box_is_whole_in_a_tile_when_some_tile_holds_it_on_both_axes():
    from components.detector.tile_choice import Tiling, whole_in_a_tile

    # 1000 x 1000 photo, tiles of 512 at 0, 244 and 488 on each axis.
    boxes = [[10, 10, 50, 50], [480, 480, 520, 520], [100, 600, 140, 1000], [300, 200, 740, 260], [0, 0, 1000, 30]]
    assert whole_in_a_tile(np.array(boxes, float), 1000, 1000, Tiling(512, 64)).tolist() == [
        True, True, True, True, False]
    assert whole_in_a_tile(np.array([[250, 250, 260, 760]], float), 1000, 1000, Tiling(512, 0)).tolist() == [False]


def test_the_manifest_counts_the_tiles_training_would_cut_and_they_reconcile(large_photo_shards, demo_shards):
    from beam.contract.files import read_manifest
    from beam.contract.manifest import tile_lines
    from components.detector.records import parse_boxes, shard_files
    from components.detector.tile_choice import Tiling, tiles_per_photo
    from components.detector.tile_counts import count_tiles
    from components.report.run_report import write_dataset_page

    manifest = read_manifest(str(large_photo_shards))  # written by data build, --tile auto (the default)
    assert manifest.tiles["mode"] == "auto" and manifest.reconcile_problems() == []
    # 700-1000 px photos: a CPU's 512 px input would shrink the objects below the anchors, a GPU's
    # 1,024 px budget takes the photos whole (full resolution would not enlarge them 1.5x).
    (layout,) = manifest.tiles["layouts"]
    assert layout["devices"] == ["cpu"] and "at full resolution" in layout["reason"]
    assert any(f"{name}'s shorter side" in layout["reason"] for name in ("circle", "square", "triangle"))
    assert "would not enlarge" in manifest.tiles["whole"]["gpu"]
    tiling = Tiling(layout["tile"], layout["overlap"])
    for split in ("train", "val"):
        records = [parse_boxes(r) for r in tf.data.TFRecordDataset(shard_files(str(large_photo_shards), split))]
        counted = layout["splits"][split]
        assert counted["photos"] == manifest.written[split] == len(records)
        assert counted["tiles"] == sum(tiles_per_photo(tiling, int(r["height"]), int(r["width"])) for r in records)
        assert counted["boxes"] == manifest.boxes[split].written
        # 10-16 px objects, an overlap of the large boxes' side: every one whole in some tile
        assert counted["boxes_whole_in_a_tile"] == counted["boxes"]
    assert tile_lines(manifest)[0].startswith(f"tiles of {tiling.tile}px overlapping by {tiling.overlap}px")
    page = write_dataset_page(str(large_photo_shards), large_photo_shards.parent / "dataset_page.html").read_text()
    assert f"tiles of {tiling.tile} px, overlap {tiling.overlap} px" in page
    # Given tiles are counted as given; none and photos that need no tiles count none.
    given = count_tiles(str(large_photo_shards), mode="256:8")
    assert given["layouts"][0]["devices"] == ["any"] and given["layouts"][0]["overlap"] == 8
    assert count_tiles(str(large_photo_shards), mode="none")["layouts"] == []
    demo = count_tiles(str(demo_shards), mode="auto")
    assert demo["layouts"] == [] and set(demo["whole"]) == {"gpu", "cpu"}
    # A count that does not match what was written is a reconcile problem.
    from dataclasses import replace

    wrong = {**manifest.tiles, "layouts": [{**layout, "splits": {"train": {**layout["splits"]["train"], "boxes": 1}}}]}
    assert "train in tiles of" in replace(manifest, tiles=wrong).reconcile_problems()[0]


def test_tiles_are_the_photo_s_pixels_and_grey_beyond_its_edge():
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (70, 150, 3)).astype(np.uint8)
    tiles, origins = cut_tiles(tf.constant(photo), Tiling(tile=96, overlap=16))
    assert tiles.shape == (2, 96, 96, 3) and origins.numpy().tolist() == [[0, 0], [0, 54]]
    for tile, (y, x) in zip(tiles.numpy(), origins.numpy()):
        np.testing.assert_array_equal(tile[:70], photo[y:y + 96, x:x + 96])
        assert (tile[70:] == PAD_GREY).all()


def _tile_detections(per_tile: list[list[tuple]], limit: int = 5) -> dict:
    """`detect`'s output for tiles, from (box in the tile, score, label) lists."""
    boxes = np.full((len(per_tile), limit, 4), -1.0, np.float32)
    scores = np.full((len(per_tile), limit), -1.0, np.float32)
    labels = np.full((len(per_tile), limit), -1, np.int32)
    for t, found in enumerate(per_tile):
        for d, (box, score, label) in enumerate(found):
            boxes[t, d], scores[t, d], labels[t, d] = box, score, label
    return {"boxes": tf.constant(boxes), "confidence": tf.constant(scores), "labels": tf.constant(labels),
            "num_detections": tf.constant([len(f) for f in per_tile], tf.int32)}


def test_an_object_cut_by_tile_borders_is_one_detection_in_the_photo_s_pixels():
    # A 600 x 1000 photo in 512 px tiles (x starts 0, 244, 488; y starts 0, 88): object A at photo
    # (100, 480)-(140, 530) is cut by the first tile's right border and the third's left border and
    # whole in the second and fifth; B at the photo's corner touches only the photo's edge; C (268 px
    # wide, more than the 64 px overlap, so whole in no tile) is cut in both tiles that hold it: its
    # fragments stay, not covered by a whole detection (the tiling's overlap is chosen to prevent this).
    tiling = Tiling(tile=512, overlap=64)
    origins = tf.constant([[0, 0], [0, 244], [0, 488], [88, 0], [88, 244], [88, 488]])
    detections = _tile_detections([
        [((100, 480, 140, 512), 0.6, 0), ((0, 0, 30, 30), 0.8, 2)],   # A's fragment; B
        [((100, 236, 140, 286), 0.9, 0), ((300, 300, 400, 512), 0.5, 1)],  # A whole; C's fragment
        [((100, 0, 140, 42), 0.7, 0), ((300, 0, 400, 70), 0.4, 1)],   # A's fragment; C's smaller fragment
        [],
        [((12, 236, 52, 286), 0.85, 0)],                               # A whole again (tile at y 88)
        [],
    ])
    out = merge_tile_detections(detections, origins, 600, 1000, tiling.tile, max_detections=10)
    count = int(out["num_detections"])
    found = [(round(float(score), 2), int(label), box.tolist()) for score, label, box in
             zip(out["confidence"].numpy()[:count], out["labels"].numpy()[:count], out["boxes"].numpy()[:count])]
    assert found == [(0.9, 0, [100, 480, 140, 530]), (0.8, 2, [0, 0, 30, 30]), (0.5, 1, [300, 544, 400, 756]),
                     (0.4, 1, [300, 488, 400, 558])]
    assert (out["labels"].numpy()[count:] == -1).all() and out["boxes"].shape == (10, 4)


def test_two_tiles_overlapping_objects_of_two_classes_both_stay_and_one_class_s_repeat_goes():
    # A 300 x 400 photo in two 256 px tiles (x starts 0 and 144): a card of class 0 and a card of
    # class 1 fanned over it (IoU 0.6), each seen whole by both tiles.
    origins = tf.constant([[0, 0], [0, 144]])
    detections = _tile_detections([
        [((50, 150, 150, 230), 0.9, 0), ((50, 170, 150, 250), 0.7, 1)],
        [((50, 6, 150, 86), 0.8, 0), ((50, 26, 150, 106), 0.6, 1)],
    ])
    out = merge_tile_detections(detections, origins, 300, 400, tile=256, max_detections=5)
    count = int(out["num_detections"])
    assert [(round(float(s), 2), int(c)) for s, c in zip(out["confidence"].numpy()[:count],
                                                          out["labels"].numpy()[:count])] == [(0.9, 0), (0.7, 1)]


def test_a_detection_in_the_grey_beyond_the_photo_is_clipped_to_it():
    out = merge_tile_detections(_tile_detections([[((10, 10, 90, 60), 0.9, 0)]]), tf.constant([[0, 0]]), 50, 200,
                                tile=128, max_detections=3)
    np.testing.assert_allclose(out["boxes"].numpy()[0], [10, 10, 50, 60])


def test_a_photo_answers_from_its_tiles_in_its_own_pixels():
    from components.detector.model import ModelConfig, build_detector

    model = build_detector(ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 16, 16, 16),
                                       score_threshold=0.0, max_detections=7))
    photo = tf.constant(np.random.default_rng(1).integers(0, 256, (90, 200, 3)).astype(np.uint8))
    out = detect_tiled(model, photo, Tiling(tile=64, overlap=16), batch_size=4)
    count = int(out["num_detections"])
    assert 0 < count <= 7 and out["boxes"].shape == (7, 4)
    boxes = out["boxes"].numpy()[:count]
    assert (boxes >= 0).all() and (boxes[:, [0, 2]] <= 90).all() and (boxes[:, [1, 3]] <= 200).all()
    assert (np.diff(out["confidence"].numpy()[:count]) <= 0).all()


def test_module_examples():
    import doctest

    from components.detector import tile_choice, tiles

    for module in (tiles, tile_choice):
        assert doctest.testmod(module).failed == 0, module.__name__


def _photos(rng, count, shape, sides_px, labels=None):
    """A BoxSample of `count` photos of `shape` (h, w), 10 boxes each with sides drawn from `sides_px`."""
    from components.detector.geometry import BoxSample

    side = rng.uniform(*sides_px, (count * 10, 1)) / np.asarray(shape, float)
    corner = rng.uniform(0.0, 0.7, (count * 10, 2))
    return BoxSample(np.hstack([corner, corner + side]), np.full(count, float(max(shape))), labels=labels,
                     boxes_per_image=np.full(count, 10), image_shapes=np.tile(shape, (count, 1)))


def test_tiles_are_chosen_for_the_small_class_of_large_photos_and_hold_the_large_boxes_whole():
    from components.detector.geometry import BoxSample
    from components.detector.tile_choice import BORDER_MARGIN, choose_tiling, tiles_per_photo

    rng = np.random.default_rng(3)
    # 2,400 x 1,800 photos: a small class of 10-30 px objects beside a large class of 60-100 px ones.
    small, large = _photos(rng, 40, (1800, 2400), (10, 30)), _photos(rng, 40, (1800, 2400), (60, 100))
    mixed = BoxSample(np.vstack([small.boxes, large.boxes]), np.full(80, 2400.0),
                      labels=np.repeat([1, 2], 400), class_names={1: "bolt", 2: "panel"},
                      boxes_per_image=np.full(80, 10), image_shapes=np.tile([1800, 2400], (80, 1)))
    tiling, why = choose_tiling(mixed, on_gpu=False)
    assert tiling is not None and tiling.tile == 512 and "bolt's shorter side" in why
    assert tiling.overlap >= 100 + 2 * BORDER_MARGIN - 1  # the panels' sides (99th percentile) whole in some tile
    assert f"takes {tiles_per_photo(tiling, 1800, 2400)} tiles" in why
    # Objects that stay above the smallest anchor in the whole photo need no tiles (150 px of
    # 2,400 is 32 px at 512), nor do photos no larger than the input.
    assert choose_tiling(_photos(rng, 40, (1800, 2400), (150, 250)), on_gpu=False)[0] is None
    none, why = choose_tiling(_photos(rng, 40, (400, 500), (3, 6)), on_gpu=False)
    assert none is None and "would not enlarge" in why
    # Without the photos' sizes there is nothing to decide from.
    assert choose_tiling(BoxSample(small.boxes, small.image_long_sides), on_gpu=False)[0] is None


def test_an_overlap_larger_than_half_a_tile_is_capped_and_says_so():
    from components.detector.geometry import BoxSample
    from components.detector.tile_choice import choose_tiling

    rng = np.random.default_rng(4)
    small, huge = _photos(rng, 30, (3000, 4000), (8, 20)), _photos(rng, 30, (3000, 4000), (400, 600))
    sample = BoxSample(np.vstack([small.boxes, huge.boxes]), np.full(60, 4000.0), labels=np.repeat([1, 2], 300),
                       boxes_per_image=np.full(60, 10), image_shapes=np.tile([3000, 4000], (60, 1)))
    tiling, why = choose_tiling(sample, on_gpu=True)
    assert tiling.tile == 1024 and tiling.overlap == 512 and "capped at half a tile" in why


def test_the_fitted_shape_of_large_photos_with_small_objects_is_tiled_and_fits_anchors_at_full_resolution(
        large_photo_shards):
    from components.detector.fitted_shape import fit_shape
    from components.detector.records import read_box_sample
    from components.detector.model import model_config_for

    sample = read_box_sample(str(large_photo_shards))
    base = model_config_for("tiny", 128, 4)
    whole = fit_shape(sample, base, "auto", on_gpu=False, allow_poor_anchors=True)
    tiled = fit_shape(sample, base, "auto", on_gpu=False, tile="auto")
    assert not whole.model.tiled and "tiling" not in whole.decisions
    assert tiled.model.tiled and tiled.model.tiling.tile == tiled.model.image_size
    assert tiled.decisions["tiling"].startswith("auto: tiles of") and "the tile" in tiled.decisions["image_size"]
    # At full resolution the 10-16 px objects stay 10-16 px in the model's input
    # (whole photos shrink them to about 5 px); the anchors are fitted to those sizes.
    assert 9 <= tiled.smallest_box_px <= 16 and tiled.smallest_box_px >= 1.5 * whole.smallest_box_px
    assert tiled.coverage >= 0.75
    # A pinned size keeps whole photos.
    assert not fit_shape(sample, base, 512, on_gpu=False, tile="auto", allow_poor_anchors=True).model.tiled


def test_a_given_tile_size_and_overlap_are_taken_as_given(large_photo_shards):
    from components.detector.fitted_shape import fit_shape
    from components.detector.records import read_box_sample
    from components.detector.model import model_config_for
    from components.detector.tile_choice import Tiling

    sample = read_box_sample(str(large_photo_shards))
    base = model_config_for("tiny", 128, 4)
    auto = fit_shape(sample, base, "auto", on_gpu=False, tile="auto").model.tiling
    given = fit_shape(sample, base, "auto", on_gpu=False, tile="256:40")
    assert given.model.tiling == Tiling(256, 40) and given.model.image_size == 256
    assert given.decisions["tiling"].startswith("256:40: given with --tile: tiles of 256px")
    # Without an overlap, auto's rule picks it from the boxes; a size equal to --image-size is no conflict.
    assert fit_shape(sample, base, "320", on_gpu=False, tile="320").model.tiling == Tiling(320, auto.overlap)
    with pytest.raises(ValueError, match="leave --image-size auto"):
        fit_shape(sample, base, 512, on_gpu=False, tile="256")


@pytest.mark.parametrize("value, problem", [("big", "auto, none or SIZE"), ("100", "multiple of 32"),
                                            ("32", "at least 64"), ("256:200", "0 to half the tile"),
                                            ("256:-8", "0 to half the tile"), ("256:x", "auto, none or SIZE")])
def test_a_bad_tile_option_is_one_line_saying_what_is_wrong(value, problem):
    import argparse

    from pipeline.cli_types import tile_arg

    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        tile_arg(value)
    assert tile_arg("512:0") == "512:0" and tile_arg("none") == "none"
