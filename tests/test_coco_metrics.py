import pytest

from components.detector.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics

NAMES = {1: "cat", 2: "dog"}
TRUTH = [ImageTruth(1, 100, 200, [(0.1, 0.1, 0.5, 0.4), (0.5, 0.5, 0.9, 0.9)], [1, 2]),
         ImageTruth(2, 100, 100, [(0.2, 0.2, 0.6, 0.6)], [1])]


def test_perfect_detections_score_one():
    dets = [ImageDetections(t.image_id, t.boxes, [0.9] * len(t.boxes), t.labels) for t in TRUTH]
    m = coco_box_metrics(TRUTH, dets, NAMES)
    assert m["mAP"] == pytest.approx(1.0) and m["AP50"] == pytest.approx(1.0)
    assert m["AP/cat"] == pytest.approx(1.0) and m["AP/dog"] == pytest.approx(1.0)


def test_wrong_class_and_shifted_boxes_score_lower():
    wrong = [ImageDetections(t.image_id, t.boxes, [0.9] * len(t.boxes), [3 - l for l in t.labels]) for t in TRUTH]
    assert coco_box_metrics(TRUTH, wrong, NAMES)["AP50"] == pytest.approx(0.0)
    # Shift every box by 20% of its height: IoU about 0.67, above 0.5 but below 0.75.
    shifted = [ImageDetections(t.image_id, [(b[0] + 0.2 * (b[2] - b[0]), b[1], b[2] + 0.2 * (b[2] - b[0]), b[3])
                                            for b in t.boxes], [0.9] * len(t.boxes), t.labels) for t in TRUTH]
    m = coco_box_metrics(TRUTH, shifted, NAMES)
    assert m["AP50"] == pytest.approx(1.0) and m["AP75"] == pytest.approx(0.0)


def test_no_detections_give_zero_not_nan():
    m = coco_box_metrics(TRUTH, [ImageDetections(t.image_id, [], [], []) for t in TRUTH], NAMES)
    assert m["mAP"] == 0.0 and m["AP/dog"] == 0.0


def test_dense_images_count_every_detection_the_model_returns():
    # 150 objects in one image: COCO's 100 detections would cap recall at 2/3; a model fitted to
    # dense images returns more (geometry.choose_max_detections) and the metrics and the
    # champion comparison's bootstrap count them all
    import numpy as np

    from components.evaluate.bootstrap import match_table, weighted_scores

    boxes = [(i / 15, j / 10, i / 15 + 0.05, j / 10 + 0.05) for i in range(15) for j in range(10)]
    truths = [ImageTruth(1, 600, 600, boxes, [1] * 150, [0] * 150)]
    scores = list(np.linspace(0.9, 0.5, 150))
    every = [ImageDetections(1, boxes, scores, [1] * 150)]
    first_100 = [ImageDetections(1, boxes[:100], scores[:100], [1] * 100)]
    assert coco_box_metrics(truths, every, {1: "cat"})["mAP"] == pytest.approx(1.0)
    assert coco_box_metrics(truths, every, {1: "cat"})["AR100"] == pytest.approx(1.0)
    assert coco_box_metrics(truths, first_100, {1: "cat"})["AR100"] == pytest.approx(100 / 150, abs=1e-3)
    assert weighted_scores(match_table(truths, every, {1: "cat"}), np.ones((1, 1))).map[0] == pytest.approx(1.0)
