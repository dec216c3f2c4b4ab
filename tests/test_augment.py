"""Box-aware augmentation: boxes follow the pixels through scale jitter and flips, boxes a
crop cuts away are dropped, and the same seed gives the same result."""

import numpy as np
import tensorflow as tf

from components.train import augment


def _image_with_box(height=60, width=90, box=(10, 20, 40, 70)):
    image = np.zeros((height, width, 3), np.uint8)
    y0, x0, y1, x1 = box
    image[y0:y1, x0:x1] = 255
    boxes = tf.constant([[y0 / height, x0 / width, y1 / height, x1 / width]], tf.float32)
    return tf.constant(image), boxes


def _white_share(image, box, level=127):
    """Share of white pixels inside `box` (normalised yxyx), one pixel in from its edges."""
    h, w = image.shape[:2]
    y0, x0, y1, x1 = (np.asarray(box) * [h, w, h, w]).round().astype(int)
    region = image[y0 + 1:y1 - 1, x0 + 1:x1 - 1]
    return float((region > level).all(axis=-1).mean()) if region.size else 0.0


def test_kept_boxes_cover_their_object_after_scale_jitter_and_flip():
    image, boxes = _image_with_box()
    labels = tf.constant([1], tf.int64)
    kept = 0
    for i in range(60):
        seed = tf.constant([7, i], tf.int64)
        out, out_boxes, out_labels = augment.scale_jitter(image, boxes, labels, 1.0, seed, 64)
        draws = augment.draw(0.0, True, seed + 3, seed)  # flipped or not, no photometric jitter
        out, out_boxes = augment.finish_one(out, draws) * 255.0, augment.flip_boxes(out_boxes, draws)
        assert out.shape == (64, 64, 3)
        box = out_boxes.numpy()[0]
        assert ((0.0 <= box) & (box <= 1.0)).all()
        if out_labels.numpy()[0] == 1:
            kept += 1
            assert _white_share(out.numpy(), box) > 0.95, (i, box)
            # and the box is tight: the object does not spill over its edges
            h, w = out.shape[:2]
            y0, x0, y1, x1 = (box * [h, w, h, w]).round().astype(int)
            white = (out.numpy() > 127).all(axis=-1)
            assert white.sum() <= (y1 - y0 + 2) * (x1 - x0 + 2), i
    assert kept > 40


def test_without_jitter_the_window_is_a_plain_resize():
    image, boxes = _image_with_box()
    labels = tf.constant([1], tf.int64)
    out, out_boxes, out_labels = augment.scale_jitter(image, boxes, labels, 0.0, tf.constant([1, 2], tf.int64), 32)
    expected = tf.image.resize(image, [32, 32]).numpy()
    assert out.dtype == tf.uint8  # rounded: a quarter of float32's bytes through the input pipeline
    np.testing.assert_allclose(out.numpy(), expected, atol=0.5 + 1e-3)
    np.testing.assert_allclose(out_boxes.numpy(), boxes.numpy(), atol=1e-6)
    assert out_labels.numpy()[0] == 1


def test_boxes_cut_away_by_the_window_are_dropped():
    boxes = tf.constant([[0.0, 0.0, 0.2, 0.2],    # 25% left inside the window: dropped
                         [0.0, 0.0, 0.4, 0.4],    # 56% left: kept, clipped
                         [0.5, 0.5, 0.7, 0.7],    # inside: kept
                         [0.95, 0.95, 1.0, 1.0]])  # outside: dropped
    labels = tf.constant([1, 2, 3, 4], tf.int64)
    clipped, kept = augment.window_boxes(boxes, labels, start=tf.constant([0.1, 0.1]), window=tf.constant([0.8, 0.8]))
    assert kept.numpy().tolist() == [0, 2, 3, 0]
    np.testing.assert_allclose(clipped.numpy()[1], [0.0, 0.0, 0.375, 0.375], atol=1e-6)
    np.testing.assert_allclose(clipped.numpy()[2], [0.5, 0.5, 0.75, 0.75], atol=1e-6)


def test_same_seed_same_augmentation_and_strength_zero_photometric_is_identity():
    image, boxes = _image_with_box()
    labels = tf.constant([1], tf.int64)
    seed = tf.constant([3, 4], tf.int64)
    a = augment.scale_jitter(image, boxes, labels, 0.7, seed, 48)
    b = augment.scale_jitter(image, boxes, labels, 0.7, seed, 48)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    floats = tf.cast(image, tf.float32)
    unchanged = augment.finish_one(floats, augment.draw(0.0, False, seed, seed)).numpy()
    np.testing.assert_allclose(unchanged, floats.numpy() / 255.0, atol=1e-6)
    jittered = augment.finish_one(floats, augment.draw(1.0, True, seed, seed)).numpy()
    assert jittered.min() >= 0.0 and jittered.max() <= 1.0 and np.abs(jittered - unchanged).max() > 0.05


def test_finish_is_tensorflow_s_own_random_flip_brightness_and_contrast_with_the_same_seeds():
    """The host's `draw`s and the train step's `finish` of a whole batch (on a GPU or under XLA),
    or `finish_one` image by image (on the host, on a CPU), give what TensorFlow's own
    `stateless_random_flip_left_right`, `stateless_random_brightness` and
    `stateless_random_contrast` give with the same seeds: the same augmentation, the same
    random numbers. Without draws it is `/ 255`. Boxes flip with the pixels."""
    rng = np.random.default_rng(0)
    images = tf.constant(rng.integers(0, 256, (6, 24, 32, 3)).astype(np.float32))
    boxes = tf.constant([[0.1, 0.2, 0.5, 0.4]], tf.float32)
    for strength in (1.0, 0.25, 0.0):
        seeds = [(tf.constant([5, i], tf.int64), tf.constant([9, i], tf.int64)) for i in range(6)]
        draws = tf.stack([augment.draw(strength, True, f, p) for f, p in seeds])
        whole = augment.finish(images, draws).numpy()
        one_by_one = [augment.finish_one(images[i], draws[i]).numpy() for i in range(6)]
        for i, (flip_seed, photometric_seed) in enumerate(seeds):
            want = tf.image.stateless_random_flip_left_right(images[i] / 255.0, flip_seed)
            flipped = bool(np.any(want.numpy() != images[i].numpy() / 255.0))
            if strength > 0:
                brightness, contrast = tf.random.experimental.stateless_split(photometric_seed, 2)
                want = tf.image.stateless_random_brightness(want, 0.3 * strength, brightness)
                want = tf.image.stateless_random_contrast(want, 1 - 0.4 * strength, 1 + 0.4 * strength, contrast)
            want = tf.clip_by_value(want, 0.0, 1.0).numpy()
            np.testing.assert_allclose(whole[i], want, atol=1e-5)
            np.testing.assert_allclose(one_by_one[i], want, atol=1e-5)
            mirrored = [[0.1, 0.6, 0.5, 0.8]] if flipped else boxes.numpy()
            np.testing.assert_allclose(augment.flip_boxes(boxes, draws[i]).numpy(), mirrored, atol=1e-6)
        assert 0 < draws.numpy()[:, augment.FLIP].sum() < 6
    none = tf.constant([augment.NO_DRAWS] * 6)
    np.testing.assert_allclose(augment.finish(images, none).numpy(), images.numpy() / 255.0, atol=1e-6)
    np.testing.assert_allclose(augment.finish_one(images[0], none[0]).numpy(), images.numpy()[0] / 255.0, atol=1e-6)
