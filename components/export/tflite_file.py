"""A trained detector as a TensorFlow Lite file, and that file as a detector the evaluator can score.

The file takes one image, `[1, S, S, 3]` float32 in [0, 1] at the model's input size S (what
`records.to_model_image` makes of a decoded photo: resized, divided by 255), and returns the
model's own decoding with non-maximum suppression inside the file: `boxes` `[1, N, 4]` (ymin,
xmin, ymax, xmax in pixels of the S x S input), `scores` `[1, N]`, `classes` `[1, N]` (0-based
label-map order) and `num_detections` `[1]`; rows past `num_detections` are padding. It is
converted with TensorFlow's own converter, told to use TFLite's builtin ops only, so the file
runs on a phone's interpreter without the Flex delegate (a graph that needed Flex ops would
fail to convert, not ship).

Kinds (TFLITE_KINDS): `tflite` keeps float32 weights; `tflite-fp16` stores them as float16 (half
the size; the interpreter computes in float32 on a CPU, in float16 on a GPU delegate). A full
INT8 file is not built: TensorFlow 2.16's converter crashes (a segmentation fault) calibrating
this graph with the decoder and NMS inside, so INT8 needs them outside the file; see the issue's
note. A tiled model (tile_choice.py) is refused: its answer for a photo is assembled from
tiles outside the model, which a single-image file cannot do by itself.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

TFLITE_KINDS = {"tflite": "float32 weights", "tflite-fp16": "float16 weights"}
FILE_NAMES = {"tflite": "model.tflite", "tflite-fp16": "model-fp16.tflite"}
INPUT_NAME = "image"


def convert_tflite(model_dir: str, files: dict[str, str]) -> dict[str, int]:
    """Write the TFLite files of the trained model in `model_dir` (`files`: kind → path), all
    from one load of the model and one SavedModel of it; each file's size in bytes."""
    import keras
    import tensorflow as tf

    from components.detector.artifacts import load_trained

    unknown = sorted(set(files) - set(TFLITE_KINDS))
    if unknown:
        raise ValueError(f"kind must be one of {', '.join(TFLITE_KINDS)}, got {', '.join(map(repr, unknown))}")
    model, config = load_trained(model_dir)
    if config.tiling is not None:
        raise NotImplementedError(f"{model_dir} is a tiled model: a TFLite file answers one image at the model "
                                  "size, not a photo assembled from tiles; export a SavedModel for it")
    size = config.image_size
    spec = tf.TensorSpec([1, size, size, 3], tf.float32, name=INPUT_NAME)

    def detections(image):
        out = model.decode_predictions(model(image, training=False), image)
        return {"boxes": out["boxes"], "scores": out["confidence"], "classes": out["labels"],
                "num_detections": out["num_detections"]}

    sizes = {}
    with tempfile.TemporaryDirectory(prefix="detpipe-tflite-") as folder:
        # The converter reads a SavedModel: from a concrete function of a Keras model its MLIR
        # import fails on the variables (TF 2.16), from Keras' own export it does not.
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serving_default", detections, input_signature=[spec])
        archive.write_out(folder, verbose=False)
        for kind, path in files.items():
            converter = tf.lite.TFLiteConverter.from_saved_model(folder)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            if kind == "tflite-fp16":
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
                converter.target_spec.supported_types = [tf.float16]
            blob = converter.convert()
            with open(path, "wb") as handle:
                handle.write(blob)
            sizes[kind] = len(blob)
    return sizes


class TfliteDetector:
    """A TFLite file answering as `detect.BatchDetector` does: images `[N, S, S, 3]` in [0, 1] →
    numpy `boxes`, `confidence`, `labels`, `num_detections`, one row per image (the file takes
    one image a call, as it would on a phone)."""

    def __init__(self, path: str):
        import tensorflow as tf

        self.interpreter = tf.lite.Interpreter(model_path=path)
        self.run = self.interpreter.get_signature_runner()
        self.image_size = int(self.run.get_input_details()[INPUT_NAME]["shape"][1])
        self.calls, self.seconds = 0, 0.0  # the interpreter's calls so far, and their time

    def _call(self, image: np.ndarray) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        out = self.run(**{INPUT_NAME: np.asarray(image, np.float32)[np.newaxis]})
        self.calls, self.seconds = self.calls + 1, self.seconds + time.perf_counter() - started
        return out

    def __call__(self, images) -> dict[str, np.ndarray]:
        rows = [self._call(image) for image in np.asarray(images)]
        if not rows:
            return {"boxes": np.zeros((0, 0, 4), np.float32), "confidence": np.zeros((0, 0), np.float32),
                    "labels": np.zeros((0, 0), np.int32), "num_detections": np.zeros((0,), np.int32)}
        return {"boxes": np.concatenate([r["boxes"] for r in rows]),
                "confidence": np.concatenate([r["scores"] for r in rows]),
                "labels": np.concatenate([r["classes"] for r in rows]),
                "num_detections": np.concatenate([r["num_detections"] for r in rows])}
