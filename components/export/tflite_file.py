"""A trained detector as TensorFlow Lite files, converted by TensorFlow's own converter.

Every file is told to use TFLite's builtin ops only, so it runs on a phone's interpreter without
the Flex delegate (a graph that needed Flex ops would fail to convert, not ship). `tflite` keeps
float32 weights; `tflite-fp16` stores them as float16 (half the size; the interpreter computes
in float32 on a CPU, in float16 on a GPU delegate). `tflite-int8` is full-integer: weights and
activations INT8, the value ranges calibrated on train images (calibration.py), with float32 in
and out (a quantize and a dequantize op at the edges). TensorFlow 2.16's converter crashes (a
segmentation fault) calibrating this graph with the decoder and non-maximum suppression inside,
so the INT8 file holds the network alone and DECODER_FILE (float, builtin ops) beside it turns
its raw outputs into detections.
"""

from __future__ import annotations

from typing import Callable, Iterator

from components.export.file_formats import FORMATS, decoder_path


def _converter(saved_model: str, signature: str):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model, signature_keys=[signature])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


def _write(converter, path: str) -> None:
    blob = converter.convert()
    with open(path, "wb") as handle:
        handle.write(blob)


def convert_tflite(saved_model: str, kind: str, path: str,
                   calibration: Callable[[], Iterator[list]] | None = None) -> None:
    """Write the `kind` file from a SavedModel of file_graph.py (`tflite-int8`: with
    DECODER_FILE beside it). `calibration`: the INT8 file's representative dataset."""
    import tensorflow as tf

    if FORMATS[kind].int8:
        if calibration is None:
            raise ValueError("an INT8 file needs calibration images")
        converter = _converter(saved_model, "raw")
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = calibration
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.float32
        _write(_converter(saved_model, "decode"), decoder_path(path))
        _write(converter, path)
        return
    converter = _converter(saved_model, "serving_default")
    if kind == "tflite-fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    _write(converter, path)
