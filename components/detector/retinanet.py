"""KerasHub's RetinaNet with the FPN's width as a setting.

Written here because KerasHub 0.31's `RetinaNetBackbone` builds its `FeaturePyramid` with
the default 256 filters and takes no argument to change it, while `FeaturePyramid` itself
does. On a small input that width is most of the model's compute: at 128 px, the P3
level's 3x3 256->256 output conv alone costs more multiply-adds than the whole `tiny`
ResNet, and with no head convs the prediction layers read the FPN at that width too.
Everything else (which levels, P6/P7 from P5, the functional graph) is KerasHub's own
construction, repeated with one more argument; `get_config` adds it so `model.keras`
files load back (the classes are registered with Keras under "detpipe").

The detector's heads need the same width: KerasHub's `PredictionHead` builds its prediction
layer for 256 input channels even when it has no conv layers of its own and reads the FPN
directly. `NarrowRetinaNetObjectDetector` builds its heads as `FpnWidthPredictionHead`, which
takes that width from its input.

Example:
    >>> import keras_hub
    >>> encoder = keras_hub.models.ResNetBackbone(
    ...     input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 16, 16, 16],
    ...     stackwise_num_blocks=[1, 1, 1, 1], stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
    ...     image_shape=(64, 64, 3))
    >>> backbone = NarrowRetinaNetBackbone(encoder, min_level=3, max_level=5, use_p5=False, fpn_filters=32,
    ...                                    image_shape=(64, 64, 3))
    >>> {level: tuple(t.shape) for level, t in sorted(backbone.pyramid_outputs.items())}
    {'P3': (None, 8, 8, 32), 'P4': (None, 4, 4, 32), 'P5': (None, 2, 2, 32)}
"""

from __future__ import annotations

import contextlib

import keras
import keras_hub
from keras_hub.src.models.feature_pyramid_backbone import FeaturePyramidBackbone
from keras_hub.src.models.retinanet import retinanet_object_detector
from keras_hub.src.models.retinanet.feature_pyramid import FeaturePyramid
from keras_hub.src.models.retinanet.prediction_head import PredictionHead
from keras_hub.src.utils.keras_utils import standardize_data_format

# KerasHub's width: what a config written before `fpn_filters` existed was built with.
KERAS_HUB_FPN_FILTERS = 256


@keras.saving.register_keras_serializable(package="detpipe")
class NarrowRetinaNetBackbone(keras_hub.models.RetinaNetBackbone):
    """`RetinaNetBackbone` whose FPN has `fpn_filters` channels at every level."""

    def __init__(self, image_encoder, min_level, max_level, use_p5, fpn_filters=KERAS_HUB_FPN_FILTERS,
                 use_fpn_batch_norm=False, image_shape=(None, None, 3), data_format=None, dtype=None, **kwargs):
        if min_level > max_level:
            raise ValueError(f"min_level {min_level} is above max_level {max_level}")
        data_format = standardize_data_format(data_format)
        encoder_top = max(int(level[1:]) for level in image_encoder.pyramid_outputs)
        backbone_max_level = min(encoder_top, max_level)
        if backbone_max_level < 5 <= max_level:
            raise ValueError(f"the image encoder's pyramid stops at P{encoder_top}; levels up to "
                             f"P{max_level} need it to reach P5")
        feature_extractor = keras.Model(
            inputs=image_encoder.inputs,
            outputs={f"P{level}": image_encoder.pyramid_outputs[f"P{level}"]
                     for level in range(min_level, backbone_max_level + 1)},
            name="backbone")
        feature_pyramid = FeaturePyramid(min_level=min_level, max_level=max_level, num_filters=fpn_filters,
                                         use_p5=use_p5, use_batch_norm=use_fpn_batch_norm, name="fpn",
                                         dtype=dtype, data_format=data_format)
        image_input = keras.layers.Input(image_shape, name="inputs")
        outputs = feature_pyramid(feature_extractor(image_input))
        # RetinaNetBackbone.__init__ would build a second, 256-wide FPN: skip to its base class.
        FeaturePyramidBackbone.__init__(self, inputs=image_input, outputs=outputs, dtype=dtype, **kwargs)
        self.min_level = min_level
        self.max_level = max_level
        self.use_p5 = use_p5
        self.fpn_filters = fpn_filters
        self.use_fpn_batch_norm = use_fpn_batch_norm
        self.image_encoder = image_encoder
        self.feature_pyramid = feature_pyramid
        self.image_shape = image_shape
        self.pyramid_outputs = outputs

    def get_config(self):
        return {**super().get_config(), "fpn_filters": self.fpn_filters}


@keras.saving.register_keras_serializable(package="detpipe")
class FpnWidthPredictionHead(PredictionHead):
    """KerasHub's head, except that with no conv layers its prediction layer reads as many
    channels as its input has (KerasHub's assumes 256)."""

    def build(self, input_shape):
        if self.num_conv_layers == 0:
            self.num_filters = int(input_shape[-1])
        super().build(input_shape)


@contextlib.contextmanager
def _heads_built_as(head_class):
    # RetinaNetObjectDetector.__init__ creates its two heads by the module-level name and
    # takes no head class or width; swapping the name for the constructor's duration is the
    # one way in short of repeating its 100-line constructor.
    original = retinanet_object_detector.PredictionHead
    retinanet_object_detector.PredictionHead = head_class
    try:
        yield
    finally:
        retinanet_object_detector.PredictionHead = original


@keras.saving.register_keras_serializable(package="detpipe")
class NarrowRetinaNetObjectDetector(keras_hub.models.RetinaNetObjectDetector):
    """`RetinaNetObjectDetector` whose heads fit the width of the backbone's FPN."""

    def __init__(self, *args, **kwargs):
        with _heads_built_as(FpnWidthPredictionHead):
            super().__init__(*args, **kwargs)
