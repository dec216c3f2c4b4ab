"""A converted file as a detector the evaluator can score (`evaluator.predict_split(detector=)`)
and `predict` can ask: images `[N, S, S, 3]` in [0, 1] → numpy `boxes`, `confidence`, `labels`,
`num_detections`, one row per image, as `detect.BatchDetector` answers. The file takes one image
a call, as it would on a phone; `calls` and `seconds` time the file's own calls."""

from __future__ import annotations

import os
import time

import numpy as np

from components.export.file_formats import FORMATS, INPUT_NAME, OUTPUT_NAMES, RAW_OUTPUT_NAMES, decoder_path

RENAMED = dict(zip(OUTPUT_NAMES, ("boxes", "confidence", "labels", "num_detections")))


class FileDetector:
    image_size: int

    def __init__(self):
        self.calls, self.seconds = 0, 0.0

    def run(self, image: np.ndarray) -> dict[str, np.ndarray]:
        """One `[1, S, S, 3]` image → the file's OUTPUT_NAMES."""
        raise NotImplementedError

    def __call__(self, images) -> dict[str, np.ndarray]:
        rows = []
        for image in np.asarray(images, np.float32):
            started = time.perf_counter()
            rows.append(self.run(image[np.newaxis]))
            self.calls, self.seconds = self.calls + 1, self.seconds + time.perf_counter() - started
        if not rows:
            return {"boxes": np.zeros((0, 0, 4), np.float32), "confidence": np.zeros((0, 0), np.float32),
                    "labels": np.zeros((0, 0), np.int32), "num_detections": np.zeros((0,), np.int32)}
        return {RENAMED[name]: np.concatenate([row[name] for row in rows]) for name in OUTPUT_NAMES}


class TfliteDetector(FileDetector):
    """A TFLite file of `export`; an INT8 one (raw outputs) with DECODER_FILE beside it."""

    def __init__(self, path: str):
        import tensorflow as tf

        super().__init__()
        self.runner = tf.lite.Interpreter(model_path=path).get_signature_runner()
        self.image_size = int(self.runner.get_input_details()[INPUT_NAME]["shape"][1])
        self.decoder = None
        if set(self.runner.get_output_details()) == set(RAW_OUTPUT_NAMES):
            decoder = decoder_path(path)
            if not os.path.isfile(decoder):
                raise FileNotFoundError(f"{decoder} is missing: {path} answers with raw outputs, and `detpipe "
                                        "export` writes the decoder beside it")
            self.decoder = tf.lite.Interpreter(model_path=decoder).get_signature_runner()

    def run(self, image: np.ndarray) -> dict[str, np.ndarray]:
        out = self.runner(**{INPUT_NAME: image})
        return self.decoder(**out) if self.decoder else out


class OnnxDetector(FileDetector):
    def __init__(self, path: str):
        import onnxruntime

        super().__init__()
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.image_size = int(self.session.get_inputs()[0].shape[1])
        self.names = [output.name for output in self.session.get_outputs()]

    def run(self, image: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(None, {INPUT_NAME: image})))


def open_detector(path: str) -> FileDetector:
    """The detector of a `.tflite` or `.onnx` file."""
    return OnnxDetector(path) if path.endswith(FORMATS["onnx"].suffix) else TfliteDetector(path)
