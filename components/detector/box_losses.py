"""The box losses a run can use (losses.py), with what each is: plain data, so the CLI's
choices and the plan's lines need no TensorFlow."""

BOX_LOSSES = {
    "giou": "1 - GIoU of the predicted and true boxes, weight 2 beside the focal loss (localises tightly)",
    "huber": "Huber (delta 1) on the anchor-relative deltas, KerasHub's default (boxes placed loosely)",
}
