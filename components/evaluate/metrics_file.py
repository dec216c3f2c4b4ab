"""`metrics.json`: what evaluation measured, as export, register, the run report and the
local run's summary read it. One definition for the writer (`evaluator.py`) and every
reader, so a renamed field fails `EvalMetrics.from_dict` at once.

>>> m = EvalMetrics({"mAP": 0.4, "AP50": 0.8, "AP75": 0.3, "AP/cat": 0.4, "AP50/cat": 0.8}, 43, Gate(0.0, True),
...                 ThresholdChoice(0.55, 0.8, 0.9, 0.7), 1.5, DetectionCap(100, 2), PredictionCost(43, 43, 1.0, 128, False))
>>> EvalMetrics.from_dict(m.to_dict()) == m, m.per_class, m.per_class_ap50, list(m.summary)
(True, {'cat': 0.4}, {'cat': 0.8}, ['mAP', 'AP50', 'AP75'])
>>> m.cap.warning(m.num_images)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from components.evaluate.threshold import ConfidenceCurve, ThresholdChoice

METRICS_FILE = "metrics.json"
_PER_CLASS = "AP/"  # per-class AP@[.5:.95] keys in `metrics`: "AP/<class name>"
_PER_CLASS_AP50 = "AP50/"  # per-class AP at IoU 0.5: "AP50/<class name>"


@dataclass(frozen=True)
class DetectionCap:
    """How often the model's detection limit, not its scores, decided what an image shows."""
    max_detections: int
    images_at_cap: int  # val images with max_detections detections at or above the exported threshold

    def warning(self, num_images: int) -> str | None:
        """A line for people when the cap is reached on most images (None otherwise)."""
        if num_images and self.images_at_cap > num_images / 2:
            return (f"{self.images_at_cap} of {num_images} val images have {self.max_detections} detections (the cap) "
                    "at the exported score threshold: the cap, not the model, decides what they show (a model "
                    "that has not learned much, or images denser than the cap)")
        return None


@dataclass(frozen=True)
class PredictionCost:
    """What predicting the val photos cost on the evaluating machine: the model's inputs (a
    tiled model's tiles; else one per photo) and the wall seconds of the prediction pass.

    >>> PredictionCost(photos=10, inputs=250, seconds=5.0, input_size=512, tiled=True).line()
    '10 val photos as 250 tiles of 512 px (25.0 per photo) in 5.0 s: 2.00 photos/s, 50.0 tiles/s on this machine'
    """
    photos: int
    inputs: int
    seconds: float
    input_size: int
    tiled: bool

    @property
    def photos_per_second(self) -> float:
        return self.photos / self.seconds if self.seconds > 0 else float("nan")

    def line(self) -> str:
        rate = f"{self.photos_per_second:.2f} photos/s"
        if not self.tiled:
            return f"{self.photos} val photos at {self.input_size} px in {self.seconds:.1f} s: {rate} on this machine"
        return (f"{self.photos} val photos as {self.inputs} tiles of {self.input_size} px "
                f"({self.inputs / max(self.photos, 1):.1f} per photo) in {self.seconds:.1f} s: {rate}, "
                f"{self.inputs / self.seconds if self.seconds > 0 else float('nan'):.1f} tiles/s on this machine")


@dataclass(frozen=True)
class Gate:
    min_map: float
    passed: bool


@dataclass(frozen=True)
class EvalMetrics:
    metrics: dict[str, float]  # COCO summary (mAP, AP50, AP75, AP_small, ..., AR100) and "AP/<class>"
    num_images: int  # val images evaluated
    gate: Gate
    threshold: ThresholdChoice  # the F1-best score threshold at IoU 0.5: the exported model's default
    seconds: float
    cap: DetectionCap | None = None  # None in files written before it was measured
    prediction: PredictionCost | None = None  # likewise
    curve: ConfidenceCurve | None = None  # likewise: precision/recall/F1 at Vertex AI's score thresholds

    @property
    def summary(self) -> dict[str, float]:
        return {k: v for k, v in self.metrics.items() if "/" not in k}

    @property
    def per_class(self) -> dict[str, float]:
        return {k[len(_PER_CLASS):]: v for k, v in self.metrics.items() if k.startswith(_PER_CLASS)}

    @property
    def per_class_ap50(self) -> dict[str, float]:
        return {k[len(_PER_CLASS_AP50):]: v for k, v in self.metrics.items() if k.startswith(_PER_CLASS_AP50)}

    def to_dict(self) -> dict:
        return {"metrics": dict(self.metrics), "num_images": self.num_images,
                "gate": {"min_map": self.gate.min_map, "passed": self.gate.passed},
                "threshold": self.threshold.to_dict(), "seconds": self.seconds,
                "cap": asdict(self.cap) if self.cap else None,
                "prediction": asdict(self.prediction) if self.prediction else None,
                "curve": self.curve.to_dict() if self.curve else None}

    @classmethod
    def from_dict(cls, data: dict) -> "EvalMetrics":
        """The dict `to_dict` wrote; a missing field raises KeyError naming it."""
        cap, prediction, curve = data.get("cap"), data.get("prediction"), data.get("curve")  # optional: added later
        return cls(metrics=dict(data["metrics"]), num_images=data["num_images"], gate=Gate(**data["gate"]),
                   threshold=ThresholdChoice(**data["threshold"]), seconds=data["seconds"],
                   cap=DetectionCap(**cap) if cap else None,
                   prediction=PredictionCost(**prediction) if prediction else None,
                   curve=ConfidenceCurve.from_dict(curve) if curve else None)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> "EvalMetrics":
        return cls.from_dict(json.loads(Path(path).read_text()))


def chosen_threshold(metrics_file: str) -> tuple[float, str]:
    """The score threshold evaluation chose (its metrics.json) and where it came from, as
    `export_trained` takes them."""
    return EvalMetrics.read(metrics_file).threshold.score, "evaluation (max F1 at IoU 0.5)"
