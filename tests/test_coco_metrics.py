import pytest

from components.evaluate.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics

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
