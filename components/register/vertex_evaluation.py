"""The evaluation in the Vertex AI Model Registry: what the Evaluate tab of a model version
shows, where a team compares versions before it promotes or rolls back.

Vertex AI takes a detection evaluation through `ModelService.ImportModelEvaluation` with the
image object detection metrics schema (GCPC's ModelImportEvaluationOp has no detection type,
so the register step calls the API itself), in that schema's own field names: the mAP, one
`boundingBoxMetrics` entry per IoU threshold (0.5 with the confidence curve evaluation computed
at the schema's score thresholds, and 0.75), the count of truth boxes; then one slice per class
(`BatchImportModelEvaluationSlices`, dimension `annotationSpec`).
"""

from __future__ import annotations

from components.evaluate.metrics_file import EvalMetrics

METRICS_SCHEMA = "gs://google-cloud-aiplatform/schema/modelevaluation/image_object_detection_metrics_1.0.0.yaml"
SLICE_DIMENSION = "annotationSpec"  # a slice per class, as Vertex AI's own detection models slice


def detection_metrics(metrics: EvalMetrics) -> dict:
    """The schema's ImageObjectDetectionEvaluationMetrics of a whole evaluation."""
    at_50 = {"iouThreshold": 0.5, "meanAveragePrecision": metrics.metrics["AP50"]}
    if metrics.curve is not None:
        at_50["confidenceMetrics"] = [{"confidenceThreshold": p.threshold, "precision": p.precision,
                                       "recall": p.recall, "f1Score": p.f1} for p in metrics.curve.points]
    found = {"boundingBoxMeanAveragePrecision": metrics.metrics["mAP"],
             "boundingBoxMetrics": [at_50, {"iouThreshold": 0.75, "meanAveragePrecision": metrics.metrics["AP75"]}]}
    if metrics.curve is not None:
        found["evaluatedBoundingBoxCount"] = metrics.curve.boxes
    return found


def class_metrics(metrics: EvalMetrics) -> dict[str, dict]:
    """The same schema per class: its AP@[.5:.95] and its AP at IoU 0.5."""
    at_50 = metrics.per_class_ap50
    return {name: {"boundingBoxMeanAveragePrecision": ap,
                   "boundingBoxMetrics": [{"iouThreshold": 0.5, "meanAveragePrecision": at_50[name]}]}
            for name, ap in metrics.per_class.items() if name in at_50}


def _value(data: dict):
    from google.protobuf import json_format, struct_pb2

    return json_format.ParseDict(data, struct_pb2.Value())


def evaluation_message(metrics: EvalMetrics, display_name: str):
    """The ModelEvaluation (aiplatform_v1) ImportModelEvaluation takes."""
    from google.cloud.aiplatform_v1.types import ModelEvaluation

    return ModelEvaluation(display_name=display_name, metrics_schema_uri=METRICS_SCHEMA,
                           metrics=_value(detection_metrics(metrics)))


def slice_messages(metrics: EvalMetrics) -> list:
    """One ModelEvaluationSlice (aiplatform_v1) a class."""
    from google.cloud.aiplatform_v1.types import ModelEvaluationSlice

    return [ModelEvaluationSlice(slice_=ModelEvaluationSlice.Slice(dimension=SLICE_DIMENSION, value=name),
                                 metrics_schema_uri=METRICS_SCHEMA, metrics=_value(found))
            for name, found in class_metrics(metrics).items()]


def import_evaluation(model_version: str, metrics: EvalMetrics, display_name: str, client) -> str:
    """Import the evaluation for `model_version` (projects/P/locations/L/models/ID@VERSION) and
    its per-class slices; returns the evaluation's resource name."""
    evaluation = client.import_model_evaluation(parent=model_version,
                                                model_evaluation=evaluation_message(metrics, display_name))
    slices = slice_messages(metrics)
    if slices:
        client.batch_import_model_evaluation_slices(parent=evaluation.name, model_evaluation_slices=slices)
    return evaluation.name


def read_evaluation(model_version: str, client) -> dict | None:
    """The newest imported evaluation of a version, as the schema's fields (None: none)."""
    from google.protobuf import json_format

    found = list(client.list_model_evaluations(parent=model_version))
    if not found:
        return None
    newest = max(found, key=lambda e: e.create_time.timestamp() if e.create_time else 0)
    return json_format.MessageToDict(newest._pb.metrics)


def evaluation_line(found: dict) -> str:
    """`registry show`'s line for a Vertex AI version's evaluation.

    >>> evaluation_line({"boundingBoxMeanAveragePrecision": 0.41, "boundingBoxMetrics": [
    ...     {"iouThreshold": 0.5, "meanAveragePrecision": 0.8}], "evaluatedBoundingBoxCount": 57})
    'Vertex AI evaluation: mAP 0.4100, AP@0.5 0.8000, 57 boxes'
    """
    parts = [f"mAP {found.get('boundingBoxMeanAveragePrecision', float('nan')):.4f}"]
    parts += [f"AP@{m['iouThreshold']:g} {m['meanAveragePrecision']:.4f}" for m in found.get("boundingBoxMetrics", [])]
    if "evaluatedBoundingBoxCount" in found:
        parts.append(f"{int(found['evaluatedBoundingBoxCount'])} boxes")
    return "Vertex AI evaluation: " + ", ".join(parts)
