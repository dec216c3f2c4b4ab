"""Evaluation pictures: the confusion counts, the choice of the worst images, and that every
picture is written and linked."""

import io

import numpy as np
from PIL import Image

from components.detector.coco_metrics import ImageDetections, ImageTruth
from components.evaluate.pictures import CONFUSION_DATA_FILE, confusion, draw_evaluation, read_confusion, worst_images
from tests.scenes import NAMES, scene

TRUTH = [ImageTruth(1, 100, 100, [(0.1, 0.1, 0.4, 0.4), (0.5, 0.5, 0.9, 0.9), (0.0, 0.6, 0.2, 0.8)], [1, 2, 3],
                    [0, 0, 1]),
         ImageTruth(2, 100, 100, [(0.2, 0.2, 0.6, 0.6)], [2])]
FOUND = [ImageDetections(1, [(0.1, 0.1, 0.4, 0.4), (0.5, 0.5, 0.9, 0.9), (0.0, 0.6, 0.2, 0.8), (0.7, 0.0, 0.9, 0.2)],
                         [0.9, 0.8, 0.9, 0.7], [1, 3, 3, 2]),
         ImageDetections(2, [(0.2, 0.2, 0.6, 0.6)], [0.1], [2])]


def test_confusion_counts_with_background_row_and_column():
    matrix, errors = confusion(TRUTH, FOUND, NAMES, threshold=0.5)
    expected = np.zeros((4, 4), dtype=int)
    expected[0, 0] = 1  # circle found
    expected[1, 2] = 1  # square called a triangle
    expected[3, 1] = 1  # a square where there is nothing
    expected[1, 3] = 1  # image 2's square: its only detection is below the threshold
    # image 1's triangle box is difficult: the detection on it counts nowhere
    assert (matrix == expected).all()
    assert [(e.image_id, e.missed, e.false) for e in errors] == [(1, 0, 2), (2, 1, 0)]
    assert [e.image_id for e in worst_images(errors, 1)] == [1]


def test_every_picture_is_written(tmp_path):
    truths, found = scene(21, images=12)
    images = []
    for t in truths:
        buffer = io.BytesIO()
        Image.new("RGB", (t.width, t.height), "gray").save(buffer, "JPEG")
        images.append(buffer.getvalue())
    metrics = {"AP_small": -1.0, "AP_medium": 0.4, "AP_large": 0.6}
    for t in truths:  # as evaluation reads them: each image's file id from its record
        t.name = f"IMG_{t.image_id:04d}.jpg"
    files, captions = draw_evaluation(tmp_path, truths, found, NAMES, metrics, 0.5, images, gallery_size=4)
    assert len(files) == 5
    for name in files.values():
        with Image.open(tmp_path / name) as picture:
            assert picture.format == "PNG" and picture.size[0] > 200
    # The gallery names each image by its file id, worst first.
    _, errors = confusion(truths, found, NAMES, 0.5)
    worst = worst_images(errors, 4)
    assert captions == [f"IMG_{e.image_id:04d}.jpg: {e.missed} missed, {e.false} false" for e in worst]
    (tmp_path / "x").mkdir()
    assert "Worst val images" not in draw_evaluation(tmp_path / "x", truths, found, NAMES, metrics, 0.5, None)[0]
    # The counts behind confusion.png, as the pipeline hands them to Vertex AI's console (a
    # system.ClassificationMetrics: kfp's own class takes them).
    from kfp.dsl import ClassificationMetrics

    labels, matrix = read_confusion(tmp_path / CONFUSION_DATA_FILE)
    assert labels == [NAMES[c] for c in sorted(NAMES)] + ["background"]
    assert matrix == confusion(truths, found, NAMES, 0.5)[0].tolist()
    drawn = ClassificationMetrics()
    drawn.log_confusion_matrix(labels, matrix)
    assert [row["row"] for row in drawn.metadata["confusionMatrix"]["rows"]] == matrix
