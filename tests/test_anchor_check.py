"""Boxes that no anchor can match are reported before training."""

import numpy as np

from components.train.anchor_check import anchor_coverage, anchor_shapes, best_centred_iou
from components.train.model import build_model_for


def test_best_centred_iou():
    anchors = np.array([[32.0, 32.0], [16.0, 64.0]])
    boxes = np.array([[32.0, 32.0], [16.0, 16.0], [16.0, 60.0]])
    np.testing.assert_allclose(best_centred_iou(boxes, anchors), [1.0, 0.25, 60 / 64], atol=1e-6)


def test_demo_boxes_match_and_small_ones_are_reported(demo_shards):
    model = build_model_for("tiny", 128, 3)
    shapes = anchor_shapes(model, 128)
    assert shapes.min() >= 20  # levels 4-6 with anchor size 2: 32 px and up, three aspect ratios
    coverage = anchor_coverage(model, str(demo_shards), 128)
    assert coverage.boxes > 0 and coverage.share < 0.1
    assert "larger --image-size" not in coverage.describe(128)
    small = anchor_coverage(build_model_for("tiny", 32, 3), str(demo_shards), 32)  # everything shrinks 4x
    assert small.share > 0.5 and "use a larger --image-size" in small.describe(32)


def test_train_report_names_the_anchor_coverage(trained_model):
    report = (trained_model / "train_report.md").read_text()
    assert "| anchors |" in report and "sampled training boxes" in report
