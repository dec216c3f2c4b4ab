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
from dataclasses import asdict, dataclass, field

import numpy as np

from beam.contract.data_text import markdown_text
from components.export.file_formats import (DECODER_FILE, FLOAT_TOLERANCE, FORMATS, INT8_TOLERANCE, decoder_path,
                                            tolerance)

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
    class_differences: dict  # class name → the file's AP@[.5:.95] minus the trained model's
    ops: dict = field(default_factory=dict)  # operator → count, in the file (file_ops.py)
    decoder_ops: dict = field(default_factory=dict)  # the same for DECODER_FILE beside an INT8 file

    @property
    def worst_class(self) -> str:
        """The class that lost most, as `name -0.0123`, or ""."""
        if not self.class_differences:
            return ""
        name = min(self.class_differences, key=lambda n: (self.class_differences[n], n))
        return f"{name} {signed(self.class_differences[name])}"

    @property
    def line(self) -> str:
        return (f"{self.kind}: {'passed' if self.passed else 'FAILED'}: mAP {self.metrics['mAP']:.4f} "
                f"({signed(self.map_difference)} vs the trained model, tolerance {self.tolerance:g}), "
                f"{self.size_bytes / 1e6:.1f} MB, {self.seconds_per_image * 1000:.1f} ms/image")


def signed(value: float) -> str:
    """+0.0123; a difference that rounds to nothing is +0.0000, not -0.0000."""
    return f"{round(value, 4) + 0.0:+.4f}"


def _top(detections) -> dict[int, tuple[float, tuple]]:
    """Each image's highest-scoring detection: (score, box)."""
    best = {d.image_id: int(np.argmax(d.scores)) for d in detections if d.scores}
    return {d.image_id: (d.scores[best[d.image_id]], d.boxes[best[d.image_id]]) for d in detections
            if d.image_id in best}


def _class_differences(metrics: dict, base: dict) -> dict[str, float]:
    return {key.split("/", 1)[1]: round(metrics[key] - base[key], 6) for key in base
            if key.startswith("AP/") and base[key] >= 0 and metrics.get(key, -1) >= 0}


def rescore(model_dir: str, data_dir: str, files: dict[str, str], float_tolerance: float = FLOAT_TOLERANCE,
            int8_tolerance: float = INT8_TOLERANCE, output_dir: str | None = None,
            conversion_errors: dict[str, str] | None = None) -> tuple[dict, list[FormatScore]]:
    """The trained model's val metrics and each file's (`files`: kind → path), compared, each
    format held to its tolerance (INT8 or float); with `output_dir`, export_report.md and
    export_formats.json written there, with the formats whose conversion failed."""
    from components.detector.artifacts import load_trained
    from components.detector.coco_metrics import coco_box_metrics
    from components.detector.split_prediction import predict_split
    from components.export.file_detector import open_detector
    from components.export.file_ops import file_ops

    model, config = load_trained(model_dir)
    names = {v: k for k, v in config.label_map.items()}
    truths, reference = predict_split(model, data_dir, config.image_size)
    if not truths:
        raise ValueError(f"the val split in {data_dir} has no records to re-score the files on")
    base = coco_box_metrics(truths, reference, names)
    base_top, scores = _top(reference), []
    for kind, path in files.items():
        detector = open_detector(path)
        _, found = predict_split(None, data_dir, config.image_size, batch_size=1, detector=detector)
        seconds = detector.seconds / detector.calls  # the file's own calls, not the photos' decoding
        metrics = coco_box_metrics(truths, found, names)
        top = _top(found)
        shared = sorted(set(top) & set(base_top))
        score_diff = max((abs(top[i][0] - base_top[i][0]) for i in shared), default=0.0)
        box_diff = max((float(np.max(np.abs(np.subtract(top[i][1], base_top[i][1])))) for i in shared), default=0.0)
        difference, allowed = metrics["mAP"] - base["mAP"], tolerance(kind, float_tolerance, int8_tolerance)
        scores.append(FormatScore(kind, path, _size(path, kind), metrics, round(difference, 6), round(score_diff, 6),
                                  round(box_diff, 6), round(seconds, 6), allowed, difference >= -allowed,
                                  _class_differences(metrics, base), file_ops(path),
                                  file_ops(decoder_path(path)) if FORMATS[kind].int8 else {}))
    if output_dir:
        write_report(base, scores, output_dir, conversion_errors or {})
    return base, scores


def _size(path: str, kind: str) -> int:
    """The bytes a runtime loads: the INT8 file and its decoder together."""
    return os.path.getsize(path) + (os.path.getsize(decoder_path(path)) if FORMATS[kind].int8 else 0)


def files_line(scores: list[FormatScore], conversion_errors: dict[str, str]) -> str:
    """One line on the converted files: `tflite passed, tflite-int8 FAILED (mAP -0.0612)`; "" for none."""
    parts = [s.kind + (" passed" if s.passed else f" FAILED (mAP {signed(s.map_difference)})") for s in scores]
    parts += [f"{kind} FAILED (conversion)" for kind in sorted(conversion_errors)]
    return ", ".join(parts)


def read_formats(export_dir: str) -> tuple[dict, list[FormatScore], dict[str, str]] | None:
    """export_formats.json in `export_dir`: (the trained model's metrics, each file's score, the
    conversion errors); None where no file was converted."""
    path = os.path.join(export_dir, FORMATS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        written = json.load(handle)
    return (written["trained_model"], [FormatScore(**s) for s in written["formats"]],
            written.get("conversion_errors", {}))


def passed_files(export_dir: str) -> dict[str, str]:
    """The converted files that passed (kind → file name); {} where none were converted."""
    written = read_formats(export_dir)
    return {s.kind: os.path.basename(s.file) for s in written[1] if s.passed} if written else {}


def write_report(base: dict, scores: list[FormatScore], output_dir: str, conversion_errors: dict[str, str]) -> None:
    with open(os.path.join(output_dir, FORMATS_FILE), "w") as handle:
        json.dump({"trained_model": base, "formats": [asdict(s) for s in scores],
                   "conversion_errors": conversion_errors}, handle, indent=2, sort_keys=True)
    scored = (f"The trained model (what the SavedModel serves): mAP@[.5:.95] {base['mAP']:.4f}, AP50 "
              f"{base['AP50']:.4f}, AP75 {base['AP75']:.4f}." if base else "No file was converted: nothing re-scored.")
    lines = ["# Export: every file re-scored on the val split", "", scored, "",
             "| format | verdict | mAP | ΔmAP | AP50 | AP75 | worst class ΔAP | top score Δ | top box Δ | size | ms/image |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {s.kind} | {'pass' if s.passed else 'FAILED'} (tolerance {s.tolerance:g}) | {s.metrics['mAP']:.4f} | "
              f"{signed(s.map_difference)} | {s.metrics['AP50']:.4f} | {s.metrics['AP75']:.4f} | {markdown_text(s.worst_class or '-')} | "
              f"{s.top_score_difference:.2g} | {s.top_box_difference:.2g} | {s.size_bytes / 1e6:.2f} MB | "
              f"{s.seconds_per_image * 1000:.1f} |" for s in scores]
    lines += [f"| {kind} | FAILED: conversion: {why} |" + " |" * 9 for kind, why in sorted(conversion_errors.items())]
    lines += ["", "Latency: one image a call through the file's runtime (the TFLite interpreter, ONNX Runtime) on "
              "this machine's CPU. A top Δ compares each image's highest-scoring detection with the trained model's."]
    classes = sorted({name for s in scores for name in s.class_differences})
    if classes:
        lines += ["", "## AP@[.5:.95] per class: the file's minus the trained model's", "",
                  "| format | " + " | ".join(map(markdown_text, classes)) + " |", "|---|" + "---|" * len(classes)]
        lines += [f"| {s.kind} | " + " | ".join(signed(s.class_differences[n]) if n in s.class_differences
                                               else "-" for n in classes) + " |" for s in scores]
    if scores:
        lines += ["", "## Operators each file needs", "",
                  "Counted in the file (every subgraph). The TFLite files use builtin ops only: no Flex delegate.", ""]
        for s in scores:
            lines.append(f"- `{os.path.basename(s.file)}`: " + ", ".join(f"{op} {n}" for op, n in s.ops.items()))
            if s.decoder_ops:
                lines.append(f"- `{DECODER_FILE}`: " + ", ".join(f"{op} {n}" for op, n in s.decoder_ops.items()))
    with open(os.path.join(output_dir, REPORT_FILE), "w") as handle:
        handle.write("\n".join(lines) + "\n")
