"""Every converted file re-scored on the val split by the evaluator, beside the trained model.

A conversion can lose accuracy silently (a box output that differs, an operator that rounds), so
each file answers the same val images through the same preprocessing and the same COCO
evaluation (evaluator.predict_split with the file as its detector) as the trained model, which is
what the SavedModel serves. A file whose mAP@[.5:.95] falls more than its tolerance below the
model's is marked failed, with its numbers (export_report.md, export_formats.json).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np

# How far below the trained model's mAP@[.5:.95] a float file may score on the same val images
# and still pass (a setting of `detpipe export`: --max-map-loss).
FLOAT_TOLERANCE = 0.02
REPORT_FILE = "export_report.md"
FORMATS_FILE = "export_formats.json"


@dataclass(frozen=True)
class FormatScore:
    kind: str
    file: str
    size_bytes: int
    metrics: dict  # mAP, AP50, AP75 and per class, as the evaluator writes them
    map_difference: float  # the file's mAP minus the trained model's
    top_score_difference: float  # the largest |difference| of an image's top score
    top_box_difference: float  # the largest |difference| of an image's top box (normalised)
    seconds_per_image: float  # at batch 1 on this machine
    tolerance: float
    passed: bool

    @property
    def line(self) -> str:
        return (f"{self.kind}: {'passed' if self.passed else 'FAILED'}: mAP {self.metrics['mAP']:.4f} "
                f"({self.map_difference:+.4f} vs the trained model, tolerance {self.tolerance:g}), "
                f"{self.size_bytes / 1e6:.1f} MB, {self.seconds_per_image * 1000:.1f} ms/image")


def _top(detections) -> dict[int, tuple[float, tuple]]:
    """Each image's highest-scoring detection: (score, box)."""
    best = {d.image_id: int(np.argmax(d.scores)) for d in detections if d.scores}
    return {d.image_id: (d.scores[best[d.image_id]], d.boxes[best[d.image_id]]) for d in detections
            if d.image_id in best}


def rescore(model_dir: str, data_dir: str, files: dict[str, str], tolerance: float = FLOAT_TOLERANCE,
            output_dir: str | None = None) -> tuple[dict, list[FormatScore]]:
    """The trained model's val metrics and each file's (`files`: kind → path), compared; with
    `output_dir`, export_report.md and export_formats.json written there."""
    from components.detector.artifacts import load_trained
    from components.evaluate.coco_metrics import coco_box_metrics
    from components.evaluate.evaluator import predict_split
    from components.export.tflite_file import TfliteDetector

    model, config = load_trained(model_dir)
    names = {v: k for k, v in config.label_map.items()}
    truths, reference = predict_split(model, data_dir, config.image_size)
    if not truths:
        raise ValueError(f"the val split in {data_dir} has no records to re-score the files on")
    base = coco_box_metrics(truths, reference, names)
    base_top, scores = _top(reference), []
    for kind, path in files.items():
        detector = TfliteDetector(path)
        _, found = predict_split(None, data_dir, config.image_size, batch_size=1, detector=detector)
        seconds = detector.seconds / detector.calls  # the file's own calls, not the photos' decoding
        metrics = coco_box_metrics(truths, found, names)
        top = _top(found)
        shared = sorted(set(top) & set(base_top))
        score_diff = max((abs(top[i][0] - base_top[i][0]) for i in shared), default=0.0)
        box_diff = max((float(np.max(np.abs(np.subtract(top[i][1], base_top[i][1])))) for i in shared), default=0.0)
        difference = metrics["mAP"] - base["mAP"]
        scores.append(FormatScore(kind, path, os.path.getsize(path), metrics, round(difference, 6),
                                  round(score_diff, 6), round(box_diff, 6), round(seconds, 6), tolerance,
                                  difference >= -tolerance))
    if output_dir:
        write_report(base, scores, output_dir)
    return base, scores


def write_report(base: dict, scores: list[FormatScore], output_dir: str) -> None:
    with open(os.path.join(output_dir, FORMATS_FILE), "w") as handle:
        json.dump({"trained_model": base, "formats": [asdict(s) for s in scores]}, handle, indent=2, sort_keys=True)
    lines = ["# Export: every file re-scored on the val split", "",
             f"The trained model (what the SavedModel serves): mAP@[.5:.95] {base['mAP']:.4f}, AP50 "
             f"{base['AP50']:.4f}, AP75 {base['AP75']:.4f}.", "",
             "| format | verdict | mAP | ΔmAP | AP50 | AP75 | top score Δ | top box Δ | size | ms/image |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {s.kind} | {'pass' if s.passed else 'FAILED'} (tolerance {s.tolerance:g}) | {s.metrics['mAP']:.4f} | "
              f"{s.map_difference:+.4f} | {s.metrics['AP50']:.4f} | {s.metrics['AP75']:.4f} | "
              f"{s.top_score_difference:.2g} | {s.top_box_difference:.2g} | {s.size_bytes / 1e6:.2f} MB | "
              f"{s.seconds_per_image * 1000:.1f} |" for s in scores]
    lines += ["", "Latency: one image a call through the TFLite interpreter on this machine's CPU. "
              "A top Δ compares each image's highest-scoring detection with the trained model's."]
    with open(os.path.join(output_dir, REPORT_FILE), "w") as handle:
        handle.write("\n".join(lines) + "\n")
