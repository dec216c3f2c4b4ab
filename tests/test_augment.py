"""Box-aware augmentation: boxes follow the pixels through crops and flips, boxes a crop
cuts away are dropped, and the same seed gives the same result."""

import numpy as np
import tensorflow as tf

from components.train import augment


def _image_with_box(height=60, width=90, box=(10, 20, 40, 70)):
    image = np.zeros((height, width, 3), np.uint8)
    y0, x0, y1, x1 = box
    image[y0:y1, x0:x1] = 255
    boxes = tf.constant([[y0 / height, x0 / width, y1 / height, x1 / width]], tf.float32)
    return tf.constant(image), boxes


def _white_share(image, box):
    h, w = image.shape[:2]
    y0, x0, y1, x1 = (np.asarray(box) * [h, w, h, w]).round().astype(int)
    region = image[y0:y1, x0:x1]
    return float((region > 127).all(axis=-1).mean()) if region.size else 0.0


def test_kept_boxes_cover_their_object_after_crop_and_flip():
    image, boxes = _image_with_box()
    labels = tf.constant([1], tf.int64)
    kept = dropped = 0
    for i in range(60):
        seed = tf.constant([7, i], tf.int64)
        out, out_boxes, out_labels = augment.random_crop(image, boxes, labels, 1.0, seed)
        out, out_boxes = augment.random_flip(out, out_boxes, seed + 3)
        box = out_boxes.numpy()[0]
        assert ((0.0 <= box) & (box <= 1.0)).all()
        if out_labels.numpy()[0] == 1:
            kept += 1
            assert _white_share(out.numpy(), box) > 0.9, (i, box)
        else:
            dropped += 1
    assert kept > 0


def test_a_box_mostly_cut_away_is_dropped():
    image, boxes = _image_with_box(box=(0, 0, 10, 10))  # top-left corner
    labels = tf.constant([2], tf.int64)
    outcomes = set()
    for i in range(80):
        seed = tf.constant([1, i], tf.int64)
        out, out_boxes, out_labels = augment.random_crop(image, boxes, labels, 1.0, seed)
        box = out_boxes.numpy()[0]
        share = (box[2] - box[0]) * (box[3] - box[1]) * out.shape[0] * out.shape[1] / 100.0
        outcomes.add(int(out_labels.numpy()[0]))
        if out_labels.numpy()[0] == 2:
            assert share >= augment.MIN_VISIBLE - 0.02, (i, share)
        else:
            assert share < augment.MIN_VISIBLE + 0.02, (i, share)
    assert outcomes == {0, 2}


def test_same_seed_same_augmentation_and_strength_zero_is_identity():
    image, boxes = _image_with_box()
    labels = tf.constant([1], tf.int64)
    seed = tf.constant([3, 4], tf.int64)
    a = augment.random_crop(image, boxes, labels, 0.7, seed)
    b = augment.random_crop(image, boxes, labels, 0.7, seed)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    same = augment.random_crop(image, boxes, labels, 0.0, seed)
    np.testing.assert_array_equal(same[0].numpy(), image.numpy())
    floats = tf.cast(image, tf.float32) / 255.0
    np.testing.assert_array_equal(augment.photometric(floats, 0.0, seed).numpy(), floats.numpy())
    jittered = augment.photometric(floats, 1.0, seed).numpy()
    assert jittered.min() >= 0.0 and jittered.max() <= 1.0
