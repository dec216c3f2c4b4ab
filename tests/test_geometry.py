"""The model's shape fitted to the boxes: the size rule, the anchor fit, the refusal."""

from dataclasses import replace

import numpy as np
import pytest

from components.detector.fitted_shape import PoorAnchors, fit_shape
from components.detector.geometry import (FAIL_COVERAGE, FIXED_SPEC, MIN_AUTO_SIZE, MIN_CLASS_BOXES, SIZE_STEP,
                                          TARGET_COVERAGE, AnchorSpec, BoxSample, CostModel, anchor_half_sizes,
                                          best_anchor_iou, choose_image_size, coverage, fit_anchors, fit_aspect_ratios)
from components.detector.model import ModelConfig, build_detector, model_config_for


def boxes_of(heights, widths, seed=0) -> np.ndarray:
    """Normalised yxyx boxes of the given sizes (fractions of the image) at random places."""
    rng = np.random.default_rng(seed)
    heights, widths = np.asarray(heights, float), np.asarray(widths, float)
    y0, x0 = rng.uniform(0, 1 - heights), rng.uniform(0, 1 - widths)
    return np.stack([y0, x0, y0 + heights, x0 + widths], 1)


def square_sample(sides, image_side=400, n_images=100, seed=0) -> BoxSample:
    return BoxSample(boxes_of(sides, sides, seed), np.full(n_images, float(image_side)))


@pytest.mark.parametrize("spec,size", [(FIXED_SPEC, 128), (AnchorSpec(2, 4, 1.5, 2, (0.3, 1.0)), 352),
                                       (AnchorSpec(3, 7, 3.0, 1, (0.84, 1.18)), 200)])
def test_anchor_shapes_and_grid_are_kerashubs(spec, size):
    import keras_hub

    generator = keras_hub.layers.AnchorGenerator("yxyx", min_level=spec.min_level, max_level=spec.max_level,
                                                 num_scales=spec.num_scales, aspect_ratios=list(spec.aspect_ratios),
                                                 anchor_size=spec.anchor_size)
    anchors = generator(np.zeros([1, size, size, 3], np.float32))
    for level in range(spec.min_level, spec.max_level + 1):
        boxes = np.asarray(anchors[f"P{level}"])
        mine = anchor_half_sizes(spec, level)
        np.testing.assert_array_equal(np.unique(boxes[:, 2:] - boxes[:, :2], axis=0),
                                      np.unique(2 * mine, axis=0))
    # the grid coverage equals a brute-force best IoU over every KerasHub anchor
    every = np.concatenate([np.asarray(a) for a in anchors.values()])
    truth = boxes_of(np.linspace(0.03, 0.6, 40), np.linspace(0.6, 0.03, 40), seed=1) * size
    y0, x0 = np.maximum(truth[:, None, 0], every[None, :, 0]), np.maximum(truth[:, None, 1], every[None, :, 1])
    y1, x1 = np.minimum(truth[:, None, 2], every[None, :, 2]), np.minimum(truth[:, None, 3], every[None, :, 3])
    inter = np.clip(y1 - y0, 0, None) * np.clip(x1 - x0, 0, None)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    brute = (inter / (area(truth)[:, None] + area(every)[None, :] - inter)).max(1)
    np.testing.assert_allclose(best_anchor_iou(truth, spec, size), brute, atol=1e-5)


def test_size_rule_small_boxes_are_enlarged_up_to_what_the_images_hold():
    rng = np.random.default_rng(0)
    small = rng.uniform(10, 22, 500) / 350  # 10-22 px objects in ~350 px photos
    size, reason = choose_image_size(square_sample(small, image_side=350), on_gpu=False)
    assert size == 320 and "median long side 350px" in reason  # the images hold 350: rounded down to x32
    # the same objects in 2000 px photos: the device budget caps it
    big_images = square_sample(rng.uniform(10, 22, 500) / 2000, image_side=2000)
    assert choose_image_size(big_images, on_gpu=False)[0] == 512
    gpu_size, gpu_reason = choose_image_size(big_images, on_gpu=True)
    assert gpu_size == 1024 and "GPU budget" in gpu_reason


def test_size_rule_small_boxes_map_to_the_smallest_anchor():
    # 10th percentile of the shorter side 0.045 of the image: 16 / 0.045 = 356 px, up to 384
    sides = np.r_[np.full(20, 0.045), np.full(80, 0.2)]
    size, reason = choose_image_size(square_sample(sides, image_side=1000), on_gpu=False)
    assert size == 384 and size % SIZE_STEP == 0 and "rounded up" in reason
    # large objects: the floor, not less
    assert choose_image_size(square_sample(np.full(50, 0.5)), on_gpu=True)[0] == MIN_AUTO_SIZE
    # tiny images: never above what they hold
    assert choose_image_size(square_sample(np.full(50, 0.5), image_side=64), on_gpu=False)[0] == 64


def test_aspect_ratios_come_from_the_boxes():
    rng = np.random.default_rng(0)
    wide = np.stack([np.full(300, 10.0), rng.uniform(38, 42, 300)], 1)  # h/w about 1/4
    (ratio,) = fit_aspect_ratios(wide, 1)
    assert 0.23 < ratio < 0.27
    mixed = np.r_[wide, wide[:, ::-1]]
    low, high = fit_aspect_ratios(mixed, 2)
    assert low < 0.3 and high > 3.5


def test_anchor_fit_covers_only_wide_boxes():
    rng = np.random.default_rng(1)
    w = rng.uniform(0.25, 0.6, 400)  # 4:1 boxes, 32-77 px wide at 128 px
    boxes = boxes_of(w / 4, w, seed=2) * 128
    assert coverage(boxes, FIXED_SPEC, 128) < 0.5  # the fixed ratios (0.5, 1, 2) miss 4:1
    fit = fit_anchors(boxes, 128, CostModel())
    assert fit.coverage >= FAIL_COVERAGE and fit.spec.min_level == 3  # P3: P2 would cost 4x for the last few
    assert min(fit.spec.aspect_ratios) < 0.3


def test_anchor_fit_drops_p3_for_large_objects_and_keeps_fine_levels_for_small_ones():
    rng = np.random.default_rng(3)
    large = boxes_of(rng.uniform(0.6, 0.9, 300), rng.uniform(0.6, 0.9, 300)) * 128  # 77-115 px
    fit = fit_anchors(large, 128, CostModel())
    assert fit.spec.min_level >= 4 and fit.coverage >= TARGET_COVERAGE
    # boxes of 27 px span 1.7 cells of P4: P3 is kept for localisation, though P4 would cover them
    mid = boxes_of(np.full(300, 27 / 128), np.full(300, 27 / 128)) * 128
    assert fit_anchors(mid, 128, CostModel()).spec.min_level == 3
    small = boxes_of(rng.uniform(0.03, 0.06, 300), rng.uniform(0.03, 0.06, 300)) * 320  # 10-19 px
    fit_small = fit_anchors(small, 320, CostModel())
    # P3 (not P2 at 4x the compute) while every class stays above the refusal line
    assert fit_small.spec.min_level == 3 and fit_small.weakest >= FAIL_COVERAGE
    # the cheapest levels that reach the target: no cheaper candidate is skipped
    costs = CostModel()
    assert costs.levels(128, fit.spec) < costs.levels(128, AnchorSpec(3, 5))


def test_poor_anchors_refuse_with_one_line_and_the_override_trains_on():
    base = model_config_for("tiny", 128, 3)
    tiny_boxes = square_sample(np.full(200, 0.01), image_side=2000)  # 1 px at a pinned 128 px
    with pytest.raises(PoorAnchors) as err:
        fit_shape(tiny_boxes, base, 128, on_gpu=False)
    message = str(err.value)
    assert "\n" not in message and "--allow-poor-anchors" in message and "--image-size" in message
    allowed = fit_shape(tiny_boxes, base, 128, on_gpu=False, allow_poor_anchors=True)
    assert allowed.coverage < 0.9 and "WARNING" in allowed.decisions["anchor_coverage"]
    # auto enlarges the same boxes enough to pass
    auto = fit_shape(tiny_boxes, base, "auto", on_gpu=True)
    assert auto.model.image_size == 1024 and auto.coverage >= 0.9
    # only P2 reaches 5 px boxes, and no larger input is allowed: the plan says so
    assert auto.model.min_level == 2 and "1024px P2-P5" in auto.decisions["size_candidates"]


def test_fitted_model_config_round_trips_and_builds():
    base = model_config_for("tiny", 128, 2)
    shape = fit_shape(square_sample(np.full(100, 0.25), image_side=128), base, "auto", on_gpu=False)
    config = ModelConfig.from_dict(shape.model.to_dict())
    assert config == shape.model and isinstance(config.aspect_ratios, tuple)
    model = build_detector(config)
    assert model.anchor_generator.min_level == config.min_level
    assert list(model.anchor_generator.aspect_ratios) == list(config.aspect_ratios)
    old = {k: v for k, v in base.to_dict().items() if k not in ("num_scales", "aspect_ratios")}
    assert ModelConfig.from_dict(old).aspect_ratios == (0.5, 1.0, 2.0)  # configs from before the fit


def test_train_report_names_the_shape_and_its_coverage(trained_model):
    report = (trained_model / "train_report.md").read_text()
    for row in ("| image_size | auto:", "| pyramid_and_anchors |", "| anchor_coverage |",
                "| max_detections | 100 (COCO's): the densest of"):
        assert row in report
    assert "the fixed shape" in report and "estimated compute" in report


def test_small_objects_get_a_larger_input_and_fine_levels(small_object_shards):
    from components.detector.fitted_shape import shape_for_data

    shape = shape_for_data(str(small_object_shards), "tiny", 3, "auto", on_gpu=False)
    assert 256 <= shape.model.image_size <= 400 and shape.model.image_size % SIZE_STEP == 0
    assert shape.model.min_level == 3 and shape.coverage >= FAIL_COVERAGE
    assert shape.coverage_fixed < 0.2 and shape.relative_compute > 1  # the old 128 px shape missed them


def test_train_refuses_poor_anchors_in_one_line_and_the_override_trains(small_object_shards, tmp_path, capsys):
    from pipeline.cli import main

    args = ["train", "--data", str(small_object_shards), "--image-size", "64", "--epochs", "1", "--batch-size",
            "4", "--max-steps", "1", "--no-export"]
    assert main([*args, "--output", str(tmp_path / "refused")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--allow-poor-anchors" in err[0] and "--image-size" in err[0]
    assert not (tmp_path / "refused" / "model.keras").exists()
    assert main([*args, "--output", str(tmp_path / "allowed"), "--allow-poor-anchors"]) == 0
    report = (tmp_path / "allowed" / "train_report.md").read_text()
    assert "WARNING (--allow-poor-anchors)" in report


def test_module_examples():
    import doctest

    from components.detector import geometry, memory_estimate

    for module in (geometry, memory_estimate):
        assert doctest.testmod(module).failed == 0, module.__name__


def two_class_sample(small_boxes: int) -> BoxSample:
    """500 large boxes (0.3 of the image) of one class beside `small_boxes` small ones (0.05) of another."""
    big = boxes_of(np.full(500, 0.3), np.full(500, 0.3), seed=1)
    small = boxes_of(np.full(small_boxes, 0.05), np.full(small_boxes, 0.05), seed=2)
    return BoxSample(np.concatenate([big, small]), np.full(100, 640.0), labels=np.array([1] * 500 + [2] * small_boxes),
                     class_names={1: "cell", 2: "platelet"})


def test_the_input_size_serves_a_small_class_beside_a_numerous_large_one():
    sample = two_class_sample(40)
    size, reason = choose_image_size(sample, on_gpu=False)
    assert size == 320  # 16 px / 0.05; the percentile over all boxes (0.3) would give 128
    assert "platelet" in reason and "cell 0.300" in reason
    # too few boxes for a stable percentile: the class is reported, not fitted to
    few = two_class_sample(MIN_CLASS_BOXES - 1)
    assert choose_image_size(few, on_gpu=False)[0] == MIN_AUTO_SIZE
    shape = fit_shape(few, model_config_for("tiny", 128, 3), "auto", on_gpu=False, allow_poor_anchors=True)
    assert "not fitted to" in shape.decisions["class_coverage"] and "platelet" in shape.decisions["class_coverage"]


def test_the_plan_shows_every_class_coverage_and_the_cost():
    shape = fit_shape(two_class_sample(40), model_config_for("tiny", 128, 3), "auto", on_gpu=False)
    assert shape.model.image_size == 320 and shape.model.min_level == 3
    line = shape.decisions["class_coverage"]
    assert "cell" in line and "platelet" in line and set(shape.class_coverage) == {"cell", "platelet"}
    assert min(shape.class_coverage.values()) >= 0.9
    assert "estimated compute" in shape.decisions["anchor_coverage"]


def test_a_class_the_anchors_miss_is_not_hidden_by_the_others():
    """Coverage is judged per class: 95% overall can hide a class that no anchor reaches."""
    rng = np.random.default_rng(4)
    big = boxes_of(rng.uniform(0.3, 0.5, 950), rng.uniform(0.3, 0.5, 950), seed=5) * 128
    thin = boxes_of(np.full(50, 0.5), np.full(50, 0.125), seed=6) * 128  # 4:1 tall boxes, 5% of all
    groups = {1: np.arange(950), 2: np.arange(950, 1000)}
    fit = fit_anchors(np.concatenate([big, thin]), 128, CostModel(), groups=groups)
    assert fit.class_coverage[2] >= 0.9 and fit.coverage >= TARGET_COVERAGE
    assert max(fit.spec.aspect_ratios) > 3  # the small class's own shape (height / width)
    blind = fit_anchors(np.concatenate([big, thin]), 128, CostModel())  # all boxes as one group
    assert blind.coverage >= TARGET_COVERAGE and coverage(thin, blind.spec, 128) < 0.1


def test_dense_images_raise_the_detection_limit(tmp_path):
    # 110-160 objects an image (shelves, crowds, cells): a limit of 100 could not show them all
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from components.detector.detect import detect
    from components.detector.fitted_shape import shape_for_data
    from pipeline.demo_data import write_demo_dataset

    summary = write_demo_dataset(tmp_path / "raw", num_train=6, num_val=2, seed=3, object_size=(10, 16),
                                 image_size=(300, 340), objects=(110, 160))
    assert summary.num_objects >= 8 * 100
    result = build_dataset(ConvertOptions(images=str(tmp_path / "raw" / "images"),
                                          annotations=str(tmp_path / "raw" / "annotations"),
                                          output=str(tmp_path / "shards"), val_fraction=0.25))
    assert result.ok, result.anomalies
    shape = shape_for_data(str(tmp_path / "shards"), "tiny", 3, "auto", on_gpu=False)
    densest = int(shape.decisions["max_detections"].split(" has ")[1].split()[0])
    assert densest > 100 and shape.model.max_detections >= 1.5 * densest
    assert shape.model.max_detections % 50 == 0 and str(shape.model.max_detections) in shape.decisions["max_detections"]
    # the detector built from the fitted config returns that many boxes for one image
    model = build_detector(replace(shape.model, score_threshold=0.0))
    size = shape.model.image_size
    out = detect(model, np.random.default_rng(0).uniform(0, 255, (1, size, size, 3)).astype(np.float32), 1)
    assert int(out["num_detections"][0]) > 100
