"""A trained detector as the TensorFlow functions its files are converted from.

One load of the model gives three functions at its fixed input size (file_formats.py says what
goes in and out): `detections` (image → boxes, scores, classes, num_detections: the model and its
own decoding with non-maximum suppression), `raw` (image → the network's raw outputs) and
`decode` (raw outputs → detections). The TFLite converter reads them from a SavedModel written by
Keras' own export (`write_saved_model`): from a concrete function of a Keras model its MLIR
import fails on the variables (TF 2.16); tf2onnx takes the function itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from components.export.file_formats import INPUT_NAME, OUTPUT_NAMES


@dataclass
class DetectorGraph:
    model: object  # the keras RetinaNet
    image_size: int
    label_map: dict[str, int]

    def image_spec(self):
        import tensorflow as tf

        return tf.TensorSpec([1, self.image_size, self.image_size, 3], tf.float32, name=INPUT_NAME)

    def raw_specs(self) -> list:
        """The raw outputs of one image, as `decode` takes them."""
        import tensorflow as tf

        shapes = {name: tensor.shape for name, tensor in self.raw(tf.zeros(self.image_spec().shape)).items()}
        return [tf.TensorSpec(shapes[name], tf.float32, name=name) for name in sorted(shapes)]

    def raw(self, image) -> dict:
        return dict(self.model(image, training=False))

    def decode(self, bbox_regression, cls_logits) -> dict:
        import tensorflow as tf

        image = tf.zeros(self.image_spec().shape)  # the anchors depend on its shape only
        out = self.model.decode_predictions({"bbox_regression": bbox_regression, "cls_logits": cls_logits}, image)
        return dict(zip(OUTPUT_NAMES, (out["boxes"], out["confidence"], out["labels"], out["num_detections"])))

    def detections(self, image) -> dict:
        raw = self.raw(image)
        return self.decode(raw["bbox_regression"], raw["cls_logits"])

    def endpoints(self) -> dict[str, tuple[Callable, list]]:
        return {"serving_default": (self.detections, [self.image_spec()]), "raw": (self.raw, [self.image_spec()]),
                "decode": (self.decode, self.raw_specs())}

    def write_saved_model(self, folder: str) -> None:
        """Every endpoint in one SavedModel, for the TFLite converter (`signature_keys`)."""
        import keras

        archive = keras.export.ExportArchive()
        archive.track(self.model)
        for name, (function, signature) in self.endpoints().items():
            archive.add_endpoint(name, function, input_signature=signature)
        archive.write_out(folder, verbose=False)


def load_graph(model_dir: str) -> DetectorGraph:
    """The trained model in `model_dir`; a tiled one is refused (NotImplementedError): its answer
    for a photo is assembled from tiles outside the model, which a single-image file cannot do."""
    from components.detector.artifacts import load_trained

    # float32 whatever the training's policy: TFLite's builtin ops have no float16 kernels for
    # this graph (a mixed_float16 model's conversion fails op by op), and the weights are float32
    # anyway; the re-scoring measures what that changes against the model as trained.
    model, config = load_trained(model_dir, float32=True)
    if config.tiling is not None:
        raise NotImplementedError(f"{model_dir} is a tiled model: a converted file answers one image at the model "
                                  "size, not a photo assembled from tiles; export a SavedModel for it")
    _nearest_as_resize(model)
    return DetectorGraph(model, config.image_size, config.label_map)


def _nearest_as_resize(model) -> None:
    """Keras' `UpSampling2D` (the feature pyramid's 2x top-down step) builds nearest upsampling
    from `repeat`, for XLA, which the converters write as TILE: an op an Edge TPU does not have,
    so its compiler would leave everything after it on the CPU. A nearest resize by the same
    whole factors computes the same values (RESIZE_NEAREST_NEIGHBOR, which it has); Keras offers
    no switch for it, so each such layer of this loaded copy computes it that way."""
    import types

    import keras
    import tensorflow as tf

    def call(self, inputs):
        height, width = inputs.shape[1], inputs.shape[2]  # static: a file takes one fixed size
        return tf.image.resize(inputs, [height * self.size[0], width * self.size[1]], method="nearest")

    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.UpSampling2D) and layer.interpolation == "nearest" \
                and layer.data_format == "channels_last":
            layer.call = types.MethodType(call, layer)
