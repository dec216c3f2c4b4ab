"""Synthetic but realistic evaluation inputs: ground truth of several classes and sizes,
and predictions that find most boxes with jitter, confuse some labels and add low-score
clutter. Seeded, so every test and benchmark sees the same sets."""

import contextlib
import io

import numpy as np

from components.detector.coco_metrics import ImageDetections, ImageTruth, to_coco

NAMES = {1: "circle", 2: "square", 3: "triangle"}


def scene(seed: int, images: int = 60, noise: float = 0.02, miss: float = 0.2):
    """Realistic predictions: most boxes found with jitter, some wrong labels, low-score clutter,
    a few difficult boxes, some images without objects."""
    rng = np.random.default_rng(seed)
    truths, found = [], []
    for i in range(1, images + 1):
        boxes, labels, hard = [], [], []
        for _ in range(rng.integers(0, 5)):
            y, x = rng.uniform(0, 0.7, 2)
            h, w = rng.uniform(0.05, 0.3, 2)
            boxes.append((y, x, y + h, x + w))
            labels.append(int(rng.integers(1, 4)))
            hard.append(int(rng.random() < 0.05))
        truths.append(ImageTruth(i, 300, 400, boxes, labels, hard))
        det_boxes, scores, det_labels = [], [], []
        for box, label in zip(boxes, labels):
            if rng.random() > miss:
                det_boxes.append(tuple(np.clip(np.array(box) + rng.normal(0, noise, 4), 0, 1)))
                scores.append(float(rng.uniform(0.3, 1)))
                det_labels.append(label if rng.random() < 0.9 else int(rng.integers(1, 4)))
        for _ in range(rng.integers(0, 20)):
            y, x = rng.uniform(0, 0.7, 2)
            det_boxes.append((y, x, y + 0.1, x + 0.1))
            scores.append(float(rng.uniform(0, 0.6)))
            det_labels.append(int(rng.integers(1, 4)))
        found.append(ImageDetections(i, det_boxes, scores, det_labels))
    return truths, found


def pycocotools_evaluation(truths, detections, names):
    """The reference: pycocotools' COCOeval, evaluated, accumulated and summarised (quietly)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt, results = to_coco(truths, detections, names)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt
        coco.createIndex()
        evaluator = COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.evaluate(), evaluator.accumulate(), evaluator.summarize()
    return evaluator
