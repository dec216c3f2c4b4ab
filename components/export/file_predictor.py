"""Predictions from a converted file of `detpipe export` (TFLite or ONNX), answering as the SavedModel's Predictor
does (predictor.py): the same checks of each image, the same preprocessing (the whole photo
decoded and resized to the file's input size, as `saved_model._whole_photos` does), and the same
prediction dict (boxes normalised on the photo, 1-based classes, their names, the threshold of the
request or the export's). What `detpipe predict --model FILE` uses, so a person can check a
file on their own photos.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from beam.contract.label_map import read_label_map
from components.export.export_files import DEFAULT_SCORE_THRESHOLD, LABEL_MAP_FILE, SERVING_CONFIG_FILE
from components.export.file_detector import FileDetector, open_detector
from components.export.predictor import BadImage
from components.export.saved_model import ServingConfig, class_names


@dataclass
class FilePredictor:
    detector: FileDetector
    class_names: list[str]  # index: 1-based class id ("" at 0)
    score_threshold: float
    max_detections: int | None = None

    @classmethod
    def load(cls, path: str) -> "FilePredictor":
        """The file and, beside it, label_map.json (class names) and serving_config.json (the
        default threshold, when the SavedModel was exported there too)."""
        folder = os.path.dirname(os.path.abspath(path))
        labels = os.path.join(folder, LABEL_MAP_FILE)
        if not os.path.isfile(labels):
            raise FileNotFoundError(f"{labels} is missing: `detpipe export` writes it beside the file")
        names = class_names(read_label_map(labels))
        threshold, limit = DEFAULT_SCORE_THRESHOLD, None  # a files-only export: the SavedModel's default
        if os.path.isfile(os.path.join(folder, SERVING_CONFIG_FILE)):
            served = ServingConfig.read(folder)
            threshold, limit = served.score_threshold, served.max_detections
        return cls(open_detector(path), names, float(threshold), limit)

    def predict_each(self, images: list[bytes], score_threshold: float | None = None) -> list[dict | BadImage]:
        """One prediction dict per image (bytes already passed through `model_image_bytes`),
        or a `BadImage` for one TensorFlow cannot decode."""
        import tensorflow as tf

        from beam.contract.decoding import decode_at_least
        from components.detector.records import to_model_image

        threshold = self.score_threshold if score_threshold is None else score_threshold
        size = self.detector.image_size
        answers: list[dict | BadImage] = []
        for data in images:
            try:
                image = to_model_image(decode_at_least(tf.constant(data), size), size).numpy()
            except tf.errors.InvalidArgumentError as err:
                answers.append(BadImage(f"the model cannot decode the image ({str(err).splitlines()[0][:200]})"))
                continue
            out = self.detector(image[np.newaxis])
            n = int(out["num_detections"][0])
            scores = out["confidence"][0][:n]
            order = np.argsort(-scores, kind="stable")
            keep = [i for i in order if scores[i] >= np.float32(threshold)][:self.max_detections]
            boxes = np.clip(out["boxes"][0][keep].astype(float) / size, 0.0, 1.0)
            classes = [int(c) + 1 for c in out["labels"][0][keep]]
            answers.append({
                "detection_boxes": np.round(boxes, 6).tolist(),
                "detection_scores": np.round(scores[keep].astype(float), 6).tolist(),
                "detection_classes": classes,
                "detection_class_names": [self.class_names[c] if c < len(self.class_names) else "" for c in classes],
                "num_detections": len(keep),
            })
        return answers
