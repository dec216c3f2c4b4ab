"""The detector: a KerasHub RetinaNet built from a config, with no download.

Example:
    >>> cfg = ModelConfig(num_classes=3, image_size=64, backbone_filters=(64, 16, 16, 16))
    >>> model = build_detector(cfg)
    >>> model.num_classes
    3
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import keras
import keras_hub

from components.detector.geometry import FIXED_SIZE
from components.detector.nms import GreedyNonMaxSuppression
from components.detector.retinanet import (
    KERAS_HUB_FPN_FILTERS,
    NarrowRetinaNetBackbone,
    NarrowRetinaNetObjectDetector,
)
from components.detector.tile_choice import Tiling, model_tiling

# Pixel box format used between the input pipeline, the model and the evaluator.
BOX_FORMAT = "yxyx"


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild the same untrained detector."""

    num_classes: int
    image_size: int = FIXED_SIZE
    backbone_filters: tuple[int, ...] = (64, 64, 96, 128)
    backbone_blocks: tuple[int, ...] = (1, 1, 1, 1)
    head_conv_layers: int = 2
    fpn_filters: int = KERAS_HUB_FPN_FILTERS  # channels of every FPN level (retinanet.py)
    min_level: int = 3
    max_level: int = 5
    anchor_size: float = 4.0
    num_scales: int = 3
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)  # anchor height / width
    # Detections below this score are dropped before NMS; low for mAP.
    score_threshold: float = 0.05
    max_detections: int = 100
    # Large photos with small objects (tile_choice.py): the model sees photos in tiles of
    # `image_size` pixels at full resolution overlapping by `tile_overlap`, not whole and resized.
    tiled: bool = False
    tile_overlap: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def tiling(self) -> Tiling | None:
        return model_tiling(self.image_size, self.tiled, self.tile_overlap)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        data = dict(data)
        for key in ("backbone_filters", "backbone_blocks", "aspect_ratios"):
            if key in data:  # configs written before the anchor fit have no aspect_ratios
                data[key] = tuple(data[key])
        return cls(**data)


class PresetUnavailable(RuntimeError):
    """A KerasHub preset could not be found or downloaded."""


def backbone_from_preset(preset: str) -> keras_hub.models.RetinaNetBackbone:
    """The pretrained RetinaNet backbone (ResNet + FPN) of a KerasHub preset: a built-in
    name (see `RetinaNetBackbone.presets`), `kaggle://...`, `gs://...` or a local folder."""
    known = keras_hub.models.RetinaNetBackbone.presets
    if "://" not in preset and not preset.startswith(("/", ".")) and preset not in known:
        raise PresetUnavailable(f"unknown preset {preset!r}: use one of {', '.join(sorted(known))}, "
                                "a kaggle:// or gs:// handle, or a local preset folder")
    try:
        return keras_hub.models.RetinaNetBackbone.from_preset(preset)
    except (OSError, ValueError, ImportError) as err:  # no network, 403/404, not a RetinaNet preset
        raise PresetUnavailable(
            f"could not load preset {preset!r}: {err}. Without network access, copy the preset folder "
            "next to the data (or to gs://) and pass its path") from err


def build_detector(config: ModelConfig) -> keras_hub.models.RetinaNetObjectDetector:
    """A RetinaNet with a small ResNet (basic blocks) sized by `config`, or, when
    `config.extra["preset"]` names a KerasHub preset, that preset's pretrained backbone
    with new heads for `config.num_classes`."""
    preset = config.extra.get("preset")
    if preset:
        backbone = backbone_from_preset(preset)
        return _detector(backbone, config, backbone.min_level, backbone.max_level)
    num_stages = len(config.backbone_filters)
    encoder = keras_hub.models.ResNetBackbone(
        input_conv_filters=[config.backbone_filters[0]],
        input_conv_kernel_sizes=[7],
        stackwise_num_filters=list(config.backbone_filters),
        stackwise_num_blocks=list(config.backbone_blocks),
        stackwise_num_strides=[1] + [2] * (num_stages - 1),
        block_type="basic_block",
        image_shape=(config.image_size, config.image_size, 3),
    )
    backbone = NarrowRetinaNetBackbone(
        image_encoder=encoder,
        min_level=config.min_level,
        max_level=config.max_level,
        use_p5=False,
        fpn_filters=config.fpn_filters,
        image_shape=(config.image_size, config.image_size, 3),
    )
    return _detector(backbone, config, config.min_level, config.max_level)


def _detector(backbone, config: ModelConfig, min_level: int, max_level: int):
    anchors = keras_hub.layers.AnchorGenerator(
        BOX_FORMAT,
        min_level=min_level,
        max_level=max_level,
        num_scales=config.num_scales,
        aspect_ratios=list(config.aspect_ratios),
        anchor_size=config.anchor_size,
    )
    decoder = GreedyNonMaxSuppression(
        bounding_box_format=BOX_FORMAT,
        from_logits=True,
        confidence_threshold=config.score_threshold,
        max_detections=config.max_detections,
    )
    model = NarrowRetinaNetObjectDetector(
        backbone=backbone,
        num_classes=config.num_classes,
        bounding_box_format=BOX_FORMAT,
        anchor_generator=anchors,
        pre_logits_num_conv_layers=config.head_conv_layers,
        prediction_decoder=decoder,
        classification_head_prior_probability=CLASS_PRIOR,
    )
    _initialise_heads(model)
    return model


# The focal loss's prior: every anchor starts out scoring about this for every class.
CLASS_PRIOR = 0.01


# The RetinaNet paper's initialisation of the heads' last layers: small outputs at the start.
HEAD_INIT_STDDEV = 0.01


def _initialise_heads(model: keras_hub.models.RetinaNetObjectDetector) -> None:
    """The heads' last layers as the RetinaNet paper initialises them.

    KerasHub 0.31 gives the *box* head the prior bias (-4.6) and the classification head
    zeros (retinanet_object_detector.py passes `use_prior_probability=True` to the box
    head). So every anchor starts at a class probability of 0.5, which makes the first
    steps' focal loss huge, and every box starts at e^-4.6 of its anchor's size, 4.6
    anchor widths away, where an IoU loss has almost no gradient. Their kernels are drawn
    with KerasHub's standard deviation of 0.05, so at the start each box is e^(a few) times
    off in size, again where an IoU loss barely pulls (measured: the GIoU loss stayed at
    1.4 for a whole run). The paper's initialisation: kernels N(0, 0.01), zero box deltas,
    class logits at log(p / (1 - p))."""
    prior = -math.log((1 - CLASS_PRIOR) / CLASS_PRIOR)
    for head in (model.box_head, model.classification_head):
        kernel = head.prediction_layer.kernel
        kernel.assign(keras.random.normal(kernel.shape, stddev=HEAD_INIT_STDDEV, dtype=kernel.dtype))
    box_bias = model.box_head.prediction_layer.bias
    class_bias = model.classification_head.prediction_layer.bias
    box_bias.assign(keras.ops.zeros(box_bias.shape, box_bias.dtype))
    class_bias.assign(keras.ops.full(class_bias.shape, prior, class_bias.dtype))


def count_params(model: keras.Model) -> int:
    return int(sum(keras.ops.size(w) for w in model.weights))


# Named model sizes: (backbone filters, blocks per stage, head conv layers, FPN width).
# `tiny` has no conv layers in its heads beyond the prediction layer (KerasHub's are 256
# wide, and one such layer per head costs as much as the FPN level itself; with none, P3
# fits in the compute P4-P5 with one took) and a 64-wide FPN (KerasHub's 256-wide one was
# two thirds of its compute at 128 px). Demo, 8 epochs, P3-P5: mAP 0.837 with the 256-wide
# FPN, 0.853 with 128, 0.856 with 64 in 0.66x the CPU time (docs/training.md's table).
MODEL_SIZES = {
    "tiny": ((64, 64, 96, 128), (1, 1, 1, 1), 0, 64),
    "small": ((64, 96, 128, 192), (1, 1, 1, 1), 2, KERAS_HUB_FPN_FILTERS),
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2), 4, KERAS_HUB_FPN_FILTERS),
}


def model_config_for(model_size: str, image_size: int, num_classes: int, preset: str | None = None) -> ModelConfig:
    """The detector config of a named size with the fixed shape (levels 4-6, anchor size 2,
    ratios 0.5/1/2); training replaces the size, levels and anchors with those fitted to the
    boxes (fitted_shape.py). With a preset, its pretrained backbone decides the levels (3-7
    for KerasHub's RetinaNets) and the heads are KerasHub's standard ones."""
    if preset:
        return ModelConfig(num_classes=num_classes, image_size=image_size, head_conv_layers=4, min_level=3,
                           max_level=7, anchor_size=4.0, extra={"preset": preset})
    if model_size not in MODEL_SIZES:
        raise ValueError(f"--model-size must be one of {', '.join(MODEL_SIZES)}, got {model_size!r}")
    filters, blocks, head_layers, fpn_filters = MODEL_SIZES[model_size]
    return ModelConfig(num_classes=num_classes, image_size=image_size, backbone_filters=filters,
                       backbone_blocks=blocks, head_conv_layers=head_layers, fpn_filters=fpn_filters,
                       min_level=4, max_level=6, anchor_size=2.0)


def build_model_for(model_size: str, image_size: int, num_classes: int):
    return build_detector(model_config_for(model_size, image_size, num_classes))


def synthetic_batch(batch: int, image_size: int, boxes_per_image: int = 1):
    """Images and `boxes_per_image` centred boxes per image: what a trial step needs, no
    data read. The loss's anchor matching holds an anchors x boxes IoU matrix per image, so
    a trial for dense images needs as many boxes as the densest one has."""
    import tensorflow as tf

    quarter, three = image_size / 4, 3 * image_size / 4
    images = tf.random.stateless_uniform([batch, image_size, image_size, 3], [0, 1])
    boxes = tf.tile(tf.constant([[[quarter, quarter, three, three]]], tf.float32), [batch, boxes_per_image, 1])
    return images, {"boxes": boxes, "labels": tf.zeros([batch, boxes_per_image], tf.float32)}
