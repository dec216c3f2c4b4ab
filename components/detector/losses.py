"""What the detector is trained with: the box loss and the weight-averaging optimizer.

Box loss. KerasHub's RetinaNet regresses anchor-relative deltas (`center_xywh`, variance 1:
dx = (x - x_a) / w_a, dw = log(w / w_a)) and, by default, scores them with a Huber loss of
delta 1. Those deltas are a few tenths at most, so Huber stays in its quadratic part and
a box that is off by a tenth of its size costs about 1/200 of what a missed class costs:
boxes land near objects but loosely (AP75 far below AP50). `AnchorGIoULoss` scores the
same deltas by 1 - GIoU of the two boxes they describe, as the strong from-scratch
recipes do (GIoU/CIoU losses in mmdetection's and Ultralytics' detectors).

Why no anchors are needed: both deltas are relative to the same anchor, and decoding
them against a unit anchor at the origin applies the same per-axis scale and shift to
both boxes, which leaves intersection over union and the enclosing-box term of GIoU
unchanged. So the loss fits Keras' per-output loss slot, with the label encoder's
targets as they are. Written here because neither Keras nor KerasHub has a GIoU loss
(Keras' `compute_ciou` is a metric over boxes, and CIoU's aspect term is not invariant
to that per-axis scale).

Example (a prediction equal to the target costs nothing; a shifted one costs more):
    >>> import numpy as np
    >>> target = np.array([[[0.1, -0.2, 0.3, 0.0]]], "float32")
    >>> loss = AnchorGIoULoss(reduction=None)
    >>> float(loss(target, target)[0, 0]) < 1e-6, float(loss(target, target + [0.5, 0, 0, 0])[0, 0]) > 0.3
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import keras
import tensorflow as tf
from keras import ops

from components.detector.box_losses import BOX_LOSSES

# Predicted log-size deltas are clipped to this before exp: a box more than e^8 (~3000)
# times its anchor is meaningless, and an overflow would turn the sum (0 x inf) into NaN.
MAX_LOG_SCALE = 8.0


def _unit_anchor_corners(deltas):
    """(x0, y0, x1, y1) of the boxes that `center_xywh` deltas describe around a unit anchor."""
    deltas = ops.cast(deltas, "float32")
    centre = deltas[..., :2]
    half = ops.exp(ops.clip(deltas[..., 2:], -MAX_LOG_SCALE, MAX_LOG_SCALE)) / 2.0
    return centre - half, centre + half


@keras.saving.register_keras_serializable(package="detpipe")
class AnchorGIoULoss(keras.losses.Loss):
    """1 - GIoU of the boxes that two sets of anchor-relative deltas describe, per anchor
    (the trainer weights it by positive anchors, as KerasHub does its box loss)."""

    def __init__(self, l1_weight: float = 1.0, reduction="sum", name="anchor_giou", **kwargs):
        super().__init__(reduction=reduction, name=name, **kwargs)
        self.l1_weight = l1_weight

    def get_config(self):
        return {**super().get_config(), "l1_weight": self.l1_weight}

    def call(self, y_true, y_pred):
        true_lo, true_hi = _unit_anchor_corners(y_true)
        pred_lo, pred_hi = _unit_anchor_corners(y_pred)
        true_area = ops.prod(true_hi - true_lo, axis=-1)
        pred_area = ops.prod(pred_hi - pred_lo, axis=-1)
        overlap = ops.prod(ops.maximum(ops.minimum(true_hi, pred_hi) - ops.maximum(true_lo, pred_lo), 0.0), axis=-1)
        union = true_area + pred_area - overlap
        enclosing = ops.prod(ops.maximum(true_hi, pred_hi) - ops.minimum(true_lo, pred_lo), axis=-1)
        eps = 1e-7
        iou = overlap / (union + eps)
        giou = iou - (enclosing - union) / (enclosing + eps)
        # GIoU alone has no gradient for a box inside another (shifting it changes neither
        # term) and almost none for one far larger; the L1 distance of the deltas always
        # pulls towards the target (as DETR and YOLOX pair them).
        l1 = ops.mean(ops.abs(ops.cast(y_true, "float32") - ops.cast(y_pred, "float32")), axis=-1)
        return 1.0 - giou + self.l1_weight * l1


@keras.saving.register_keras_serializable(package="detpipe")
class AveragedAdamW(keras.optimizers.AdamW):
    """AdamW that keeps an exponential moving average of the weights (`use_ema`) and puts
    it in place only when asked (`use_averages`).

    Keras' own optimizer swaps the average in at the end of every `fit` call, but one
    training run may be several `fit` calls (a run resumed mid-chunk finishes the chunk
    first, loop.py): the average must replace the weights once, when training is done."""

    def finalize_variable_values(self, var_list):
        """Called by `fit` at its end: nothing here (see the class)."""

    def use_averages(self, var_list) -> None:
        """Replace `var_list` (the model's trainable weights) by their moving averages."""
        if self.use_ema:
            self._overwrite_model_variables_with_average_value(var_list)


def use_weight_average(model: keras.Model) -> None:
    """Put the optimizer's moving average of the weights in place (with `use_ema`). Under
    mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer, which holds the
    AveragedAdamW as its `inner_optimizer` (the wrapper has no `use_averages`)."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    optimizer.use_averages(model.trainable_variables)


@contextmanager
def weight_average_in_place(model: keras.Model) -> Iterator[None]:
    """The moving average of the weights in place for the block (`use_weight_average`), and
    the trained weights back after it: a model scored in the middle of its training."""
    trained = [v.numpy() for v in model.trainable_variables]
    use_weight_average(model)
    try:
        yield
    finally:
        for variable, value in zip(model.trainable_variables, trained):
            variable.assign(value)


def finite_on_every_replica(model: keras.Model) -> None:
    """Under mixed_float16 with several replicas (GPUs, or machines), make the
    LossScaleOptimizer decide "apply or skip" on every replica's gradients together.

    Keras 3.15's LossScaleOptimizer checks the finiteness of the replica's own gradients and
    all-reduces them only inside the "apply" branch (the inner optimizer's update). A replica
    whose gradients overflow skips while another applies: across machines the one that applies
    waits for the all-reduce forever (the two-worker test hung in about one run of three),
    on one machine the first replica's check decides for all (another's inf is averaged into
    the weights). Here the check is all-reduced (finite only if finite everywhere), so every
    replica takes the same branch, with the same loss scale. Written here because Keras has
    no option for it."""
    optimizer = model.optimizer
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return
    local_check = optimizer.check_finite

    def check_finite(grads):
        finite = local_check(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        not_finite = tf.cast(tf.logical_not(finite), tf.float32)  # ReduceOp has no MIN: count the others
        return context.all_reduce(tf.distribute.ReduceOp.SUM, not_finite) < 0.5

    optimizer.check_finite = check_finite


GIOU_WEIGHT = 2.0  # as mmdetection's GIoU RetinaNet configs weigh it against the focal loss


def compile_detector(model: keras.Model, optimizer: keras.optimizers.Optimizer, box_loss: str = "giou") -> None:
    """Compile a KerasHub RetinaNet for training with `box_loss` (BOX_LOSSES) and the focal loss.
    Never with Keras' XLA (`jit_compile` stays off): the trainer compiles the step itself when
    the plan says so (components/train/xla.py says why)."""
    if box_loss not in BOX_LOSSES:
        raise ValueError(f"box loss must be one of {', '.join(BOX_LOSSES)}, got {box_loss!r}")
    if box_loss == "giou":
        model.compile(optimizer=optimizer, box_loss=AnchorGIoULoss(),
                      loss_weights={"bbox_regression": GIOU_WEIGHT, "cls_logits": 1.0}, jit_compile=False)
    else:
        model.compile(optimizer=optimizer, jit_compile=False)  # KerasHub's defaults: Huber (delta 1) and focal loss


def build_for_fit(model: keras.Model, element_spec) -> None:
    """Create now, from the input's shapes (a dataset's `element_spec`), what `fit` would
    otherwise create inside its first traced step: the compiled loss's trackers and the
    optimizer's slots. Keras defers that to the trace unless the model was compiled in a
    strategy's scope (one device is not), and TensorFlow traces a function that created
    variables a second time: the whole train step again, 9 of a tiny CPU run's 21 s."""
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=element_spec)  # private: no public call builds the compiled loss
