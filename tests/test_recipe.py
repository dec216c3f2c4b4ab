"""The training recipe: the box loss, the weight average and the heads' initialisation
(components/detector/losses.py, model.py)."""

import numpy as np
import pytest

from components.detector.losses import AnchorGIoULoss, AveragedAdamW, build_for_fit, compile_detector
from components.detector.model import CLASS_PRIOR, ModelConfig, build_detector


def giou_in_pixels(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """GIoU of (N, 4) xyxy boxes, written out directly."""
    inter = (np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
             * np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None))
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    union = area(a) + area(b) - inter
    hull = ((np.maximum(a[:, 2], b[:, 2]) - np.minimum(a[:, 0], b[:, 0]))
            * (np.maximum(a[:, 3], b[:, 3]) - np.minimum(a[:, 1], b[:, 1])))
    return inter / union - (hull - union) / hull


def encode(boxes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """xyxy boxes as KerasHub's center_xywh deltas of their anchors (variance 1)."""
    centre = lambda x: (x[:, :2] + x[:, 2:]) / 2  # noqa: E731
    size = lambda x: x[:, 2:] - x[:, :2]  # noqa: E731
    return np.concatenate([(centre(boxes) - centre(anchors)) / size(anchors), np.log(size(boxes) / size(anchors))], 1)


def test_the_loss_on_anchor_deltas_is_the_giou_of_the_boxes_in_pixels_plus_the_l1_of_the_deltas():
    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 200, (64, 2))
    anchors = np.concatenate([corner, corner + rng.uniform(8, 90, (64, 2))], 1)  # any anchor, wide or tall
    truth = anchors + rng.normal(0, 6, (64, 4))
    pred = anchors + rng.normal(0, 6, (64, 4))
    truth[:, 2:] = np.maximum(truth[:, 2:], truth[:, :2] + 2)
    pred[:, 2:] = np.maximum(pred[:, 2:], pred[:, :2] + 2)
    t, p = encode(truth, anchors).astype("float32"), encode(pred, anchors).astype("float32")
    loss = np.asarray(AnchorGIoULoss(reduction=None)(t[None], p[None]))[0]
    expected = 1 - giou_in_pixels(truth, pred) + np.abs(t - p).mean(axis=1)
    np.testing.assert_allclose(loss, expected, rtol=1e-4, atol=1e-5)
    # zero at the target; finite for absurd predictions (the deltas of unmatched anchors)
    assert float(np.abs(np.asarray(AnchorGIoULoss(reduction=None)(t[None], t[None]))).max()) < 1e-5
    wild = np.asarray(AnchorGIoULoss(reduction=None)(t[None], np.full_like(t, 500.0)[None]))
    assert np.isfinite(wild).all()


def test_fresh_heads_start_small_with_the_class_prior():
    model = build_detector(ModelConfig(num_classes=3, image_size=64, backbone_filters=(64, 16, 16, 16)))
    box, cls = model.box_head.prediction_layer, model.classification_head.prediction_layer
    assert np.all(np.asarray(box.bias) == 0)
    np.testing.assert_allclose(np.asarray(cls.bias), np.log(CLASS_PRIOR / (1 - CLASS_PRIOR)), rtol=1e-5)
    assert 0.005 < float(np.std(np.asarray(box.kernel))) < 0.02


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
def test_box_regression_learns_with_the_giou_loss():
    """The regression: with KerasHub's initialisation the GIoU loss sat at 1.4 for a whole run."""
    import keras
    import tensorflow as tf

    model = build_detector(ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 16, 16, 16),
                                       min_level=3, max_level=5, anchor_size=2.0, aspect_ratios=(1.0,)))
    compile_detector(model, keras.optimizers.Adam(3e-3), "giou")
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (8, 64, 64, 3)).astype("float32")
    corner = rng.uniform(4, 30, (8, 1, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(14, 28, (8, 1, 2))], -1).astype("float32")
    for i in range(8):  # a bright square where each box is
        y0, x0, y1, x1 = boxes[i, 0].astype(int)
        images[i, y0:y1, x0:x1] = 1.0
    labels = np.zeros((8, 1), "float32")
    data = tf.data.Dataset.from_tensors((images, {"boxes": boxes, "labels": labels})).repeat()
    build_for_fit(model, data.element_spec)  # as the trainer does: the step is traced once
    history = model.fit(data, steps_per_epoch=40, epochs=2, verbose=0).history["bbox_regression_loss"]
    assert history[-1] < 0.8 * history[0] and history[-1] < 1.0


def test_the_weight_average_replaces_the_weights_only_when_asked():
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=AveragedAdamW(0.1, use_ema=True, ema_momentum=0.9), loss="mse")
    data = tf.data.Dataset.from_tensors((np.ones((4, 2), "float32"), np.full((4, 1), 3.0, "float32"))).repeat()
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
    trained = [w.copy() for w in model.get_weights()]
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)  # a second fit (a resumed run) trains on the raw weights
    raw = [w.copy() for w in model.get_weights()]
    assert not all(np.allclose(a, b) for a, b in zip(trained, raw))
    model.optimizer.use_averages(model.trainable_variables)
    averaged = model.get_weights()
    expected = [np.asarray(v) for v in model.optimizer._model_variables_moving_average]
    for got, want, before in zip(averaged, expected, raw):
        np.testing.assert_allclose(got, want)
        assert not np.allclose(got, before)


def test_a_model_scored_between_chunks_trains_on_as_if_it_had_never_been_scored():
    """`weight_average_in_place` (a tuning trial scoring a rung mid-training, trials.py): the
    average is in place inside the block, the trained weights are back after it, and training
    goes on to the weights and averages of a run that was never scored."""
    import keras
    import tensorflow as tf

    from components.detector.losses import weight_average_in_place

    data = tf.data.Dataset.from_tensors((np.ones((4, 2), "float32"), np.full((4, 1), 3.0, "float32"))).repeat()

    def train(score_between: bool) -> list[np.ndarray]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=AveragedAdamW(0.1, use_ema=True, ema_momentum=0.9), loss="mse")
        model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
        if score_between:
            trained = [w.copy() for w in model.get_weights()]
            with weight_average_in_place(model):
                inside = model.get_weights()
            for got, want, raw in zip(inside, model.optimizer._model_variables_moving_average, trained):
                np.testing.assert_allclose(got, np.asarray(want))
                assert not np.allclose(got, raw)
            for got, raw in zip(model.get_weights(), trained):
                np.testing.assert_array_equal(got, raw)
        model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
        return model.get_weights() + [np.asarray(v) for v in model.optimizer._model_variables_moving_average]

    for scored, never in zip(train(True), train(False)):
        np.testing.assert_array_equal(scored, never)


@pytest.mark.parametrize("box_loss", ["giou", "huber"])
def test_both_box_losses_compile(box_loss):
    import keras

    model = build_detector(ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 16, 16, 16)))
    compile_detector(model, keras.optimizers.Adam(1e-3), box_loss)
    with pytest.raises(ValueError, match="box loss"):
        compile_detector(model, keras.optimizers.Adam(1e-3), "l2")


def test_a_narrow_fpn_is_built_saved_and_loaded_at_its_width(tmp_path):
    """KerasHub fixes the FPN at 256 channels and builds the heads' prediction layers for 256
    inputs; detpipe's tiny model has a 64-wide FPN that the heads read directly."""
    import keras

    from components.detector.artifacts import MODEL_FILE
    from components.detector.model import model_config_for

    config = model_config_for("tiny", 64, num_classes=2)
    assert config.fpn_filters == 64 and config.head_conv_layers == 0
    model = build_detector(config)
    assert {tuple(t.shape)[-1] for t in model.backbone.pyramid_outputs.values()} == {64}
    assert model.box_head.prediction_layer.kernel.shape[2] == 64
    assert model.classification_head.prediction_layer.kernel.shape[2] == 64
    images = np.random.default_rng(0).uniform(0, 1, (2, 64, 64, 3)).astype("float32")
    before = model(images)["cls_logits"]
    model.save(tmp_path / MODEL_FILE)
    loaded = keras.saving.load_model(tmp_path / MODEL_FILE, compile=False)
    np.testing.assert_allclose(loaded(images)["cls_logits"], before, atol=1e-5)
    assert loaded.backbone.fpn_filters == 64
    # KerasHub's width still builds (configs written before fpn_filters existed), with head convs too
    wide = build_detector(ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 16, 16, 16),
                                      head_conv_layers=1, fpn_filters=32))
    assert wide.box_head.prediction_layer.kernel.shape[2] == 256
    assert ModelConfig.from_dict({"num_classes": 2}).fpn_filters == 256


def test_the_cost_model_counts_the_fpn_width():
    from components.detector.geometry import AnchorSpec, CostModel

    spec = AnchorSpec(min_level=3, max_level=5, anchor_size=2.0, num_scales=3, aspect_ratios=(0.5, 1.0, 2.0))
    kerashub = CostModel(head_conv_layers=1, fpn_filters=256)
    # KerasHub's width: the FPN conv and a 256-wide head conv per head, as before the setting
    per_position = 9 * 256**2 * 3 + 9 * 256 * 9 * (4 + 4)
    assert kerashub.levels(128, spec) == sum((128 // 2**lv) ** 2 * per_position for lv in (3, 4, 5))
    narrow = CostModel(head_conv_layers=0, fpn_filters=64)
    # a 4x narrower FPN: its 3x3 conv costs 16x less, the prediction layers reading it 4x less
    assert narrow.levels(128, spec) < CostModel(head_conv_layers=0, fpn_filters=256).levels(128, spec) / 8
