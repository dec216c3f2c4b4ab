"""`val_detections.jsonl`: the labels and the detections of every val image, as evaluation
predicted them, so the label review (review.py, the DAG's `review` step) reads them instead of
predicting the split again. One definition for its writer (`evaluator.py`) and its readers.

One JSON object a line, one image each, in evaluation's order: its labels ("truth": the
`ImageTruth` fields) and its detections ("found": boxes, scores, labels). Boxes are normalised
(ymin, xmin, ymax, xmax), labels 1-based, as `coco_metrics` takes them; floats are rounded to
6 digits (a millionth of the side: well under a pixel), so the file is stable across runs.

>>> import tempfile, pathlib
>>> truth = ImageTruth(1, 480, 640, [(0.1, 0.2, 0.5, 0.6)], [1], [0], "a.jpg")
>>> found = ImageDetections(1, [(0.1, 0.2, 0.5, 0.6000001)], [0.9], [1])
>>> path = pathlib.Path(tempfile.mkdtemp()) / DETECTIONS_FILE
>>> _ = write_detections([truth], [found], path)
>>> read_detections(path) == ([truth], [ImageDetections(1, [(0.1, 0.2, 0.5, 0.6)], [0.9], [1])])
True
"""

from __future__ import annotations

import json
from pathlib import Path

from components.detector.coco_metrics import ImageDetections, ImageTruth

DETECTIONS_FILE = "val_detections.jsonl"


def _round(values) -> list[float]:
    return [round(float(v), 6) for v in values]


def write_detections(truths: list[ImageTruth], detections: list[ImageDetections], path: str | Path) -> Path:
    """Write every image's labels and detections to `path` (one line an image)."""
    if len(truths) != len(detections):
        raise ValueError(f"{len(truths)} images of labels but {len(detections)} of detections")
    lines = []
    for truth, found in zip(truths, detections):
        lines.append(json.dumps({
            "truth": {"image_id": truth.image_id, "height": truth.height, "width": truth.width,
                      "boxes": [_round(b) for b in truth.boxes], "labels": list(truth.labels),
                      "difficult": list(truth.difficult), "name": truth.name},
            "found": {"boxes": [_round(b) for b in found.boxes], "scores": _round(found.scores),
                      "labels": list(found.labels)}}, sort_keys=True))
    path = Path(path)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def read_detections(path: str | Path) -> tuple[list[ImageTruth], list[ImageDetections]]:
    """The labels and detections `write_detections` wrote, in its order."""
    truths, detections = [], []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
            truth, found = row["truth"], row["found"]
            truths.append(ImageTruth(truth["image_id"], truth["height"], truth["width"],
                                     [tuple(b) for b in truth["boxes"]], truth["labels"], truth["difficult"],
                                     truth["name"]))
            detections.append(ImageDetections(truth["image_id"], [tuple(b) for b in found["boxes"]],
                                              found["scores"], found["labels"]))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a line of {DETECTIONS_FILE} ({error})") from None
    return truths, detections
