"""A trained detector as an ONNX file, converted by tf2onnx (the converter that follows TensorFlow
2.x; pinned with onnx in pyproject.toml). The graph is file_graph.py's `detections`, non-maximum
suppression inside (ONNX's NonMaxSuppression), so ONNX Runtime, and TensorRT from the file, answer
with boxes, scores, classes and num_detections as the TFLite file does."""

from __future__ import annotations

from components.export.file_formats import ONNX_OPSET
from components.export.file_graph import DetectorGraph


def convert_onnx(graph: DetectorGraph, path: str) -> None:
    """Write the ONNX file of `graph`."""
    import tensorflow as tf
    import tf2onnx

    spec = graph.image_spec()
    function = tf.function(graph.detections, input_signature=[spec])
    tf2onnx.convert.from_function(function, input_signature=[spec], opset=ONNX_OPSET, output_path=path)
