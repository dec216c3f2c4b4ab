"""The turns and the mosaic move, turn, cut and drop each box as they do its pixels; a run's
clean end trains on exactly the elements it would without mosaic (real photos)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.train import augment, mosaic
from components.train.augment_settings import MOSAIC_IMAGES
from components.train.input_pipeline import InputConfig, train_dataset

SIZE = 64


def _painted(box: tuple[float, float, float, float], colour: int, size: int = SIZE) -> np.ndarray:
    """A black image with one box (normalised yxyx) painted in channel `colour`, whole pixels."""
    image = np.zeros([size, size, 3], np.uint8)
    y0, x0, y1, x1 = (round(v * size) for v in box)
    image[y0:y1, x0:x1, colour] = 255
    return image


def _painted_box(image: np.ndarray, colour: int) -> tuple[float, float, float, float] | None:
    """The normalised yxyx extent of the pixels lit in channel `colour`, or None."""
    ys, xs = np.nonzero(image[..., colour] > 127)
    if not len(ys):
        return None
    size = image.shape[0]
    return ys.min() / size, xs.min() / size, (ys.max() + 1) / size, (xs.max() + 1) / size


@pytest.mark.parametrize("orientations", ["flips", "any"])
def test_orient_turns_each_box_with_its_pixels(orientations):
    box = (0.125, 0.25, 0.5, 0.875)  # off-centre and oblong: every one of the 8 symmetries moves it differently
    image = tf.constant(_painted(box, 0))
    seen = set()
    for seed in range(40):
        turned, boxes = augment.orient(image, tf.constant([box]), orientations, tf.constant([seed, 7]))
        got = tuple(boxes.numpy()[0].tolist())
        np.testing.assert_allclose(got, _painted_box(turned.numpy(), 0), atol=1e-6)
        seen.add(tuple(round(v, 3) for v in got))
    assert len(seen) == (2 if orientations == "flips" else 8)  # upside down or not; all of a square's symmetries


def test_upright_leaves_image_and_boxes():
    image = tf.constant(_painted((0.1, 0.2, 0.3, 0.4), 1))
    turned, boxes = augment.orient(image, tf.constant([[0.1, 0.2, 0.3, 0.4]]), "upright", tf.constant([1, 2]))
    assert np.array_equal(turned.numpy(), image.numpy())
    np.testing.assert_array_equal(boxes.numpy(), np.float32([[0.1, 0.2, 0.3, 0.4]]))


def test_flip_pixels_matches_the_flipped_boxes():
    box = (0.25, 0.125, 0.75, 0.5)
    image = tf.constant(_painted(box, 2))
    draws = tf.constant([1.0, 0.1, 1.2])
    flipped, left = augment.flip_pixels(image, draws)
    np.testing.assert_allclose(augment.flip_boxes(tf.constant([box]), draws).numpy()[0],
                               _painted_box(flipped.numpy(), 2), atol=1e-6)
    assert left.numpy().tolist() == pytest.approx([0.0, 0.1, 1.2])  # the flip is done; the rest stays drawn


def test_mosaic_moves_cuts_and_drops_boxes_with_their_pixels():
    # Four images, one box each, each in a colour channel of its own (image 3 shares red with 0, far from it).
    boxes = [(0.1, 0.1, 0.6, 0.5), (0.3, 0.4, 0.9, 0.95), (0.05, 0.55, 0.45, 0.9), (0.5, 0.5, 0.95, 0.95)]
    colours = [0, 1, 2, 0]
    images = tf.constant(np.stack([_painted(b, c) for b, c in zip(boxes, colours)]))
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant(boxes, tf.float32), [1, 1, 1, 1])
    labels = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3, 1], tf.int64), [1, 1, 1, 1])
    on_canvas = mosaic.canvas_boxes(ragged).numpy()
    kept = dropped = 0
    for seed in range(30):
        key = tf.constant([seed, 3], tf.int64)
        out, out_boxes, out_labels = (t.numpy() for t in mosaic.mosaic_four(images, ragged, labels, key, SIZE))
        assert out.shape == (MOSAIC_IMAGES, SIZE, SIZE, 3) and out_boxes.shape == (MOSAIC_IMAGES, 4, 4)
        windows = tf.random.experimental.stateless_split(key, MOSAIC_IMAGES)
        for k in range(MOSAIC_IMAGES):
            window = mosaic.mosaic_window(SIZE, windows[k])
            origin, span = np.tile(window.origin.numpy(), 2), np.tile(window.span.numpy(), 2)
            for i in (1, 2):  # the boxes with a colour channel to themselves
                whole = (on_canvas[i] - origin) / span * SIZE  # the box in output pixels, uncut
                area = (whole[2] - whole[0]) * (whole[3] - whole[1])
                visible = int((out[k][..., colours[i]] > 127).sum())
                if out_labels[k, i] > 0:
                    kept += 1
                    assert out_labels[k, i] == i + 1
                    # the box is where its pixels are (a pixel or two of resize rounding), cut to the window
                    np.testing.assert_allclose(out_boxes[k, i], _painted_box(out[k], colours[i]), atol=2.5 / SIZE)
                    assert visible >= augment.MIN_VISIBLE * area - 2 * (whole[2] - whole[0] + whole[3] - whole[1])
                else:
                    dropped += 1  # the window kept less than MIN_VISIBLE of it
                    assert visible <= augment.MIN_VISIBLE * area + 2 * (whole[2] - whole[0] + whole[3] - whole[1])
    assert kept > 20 and dropped > 5  # both happen: a mosaic's window keeps some boxes and cuts others away


def test_canvas_boxes_put_each_image_in_its_quadrant():
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant([[0.0, 0.0, 1.0, 1.0]] * 4), [1, 1, 1, 1])
    assert mosaic.canvas_boxes(ragged).numpy().tolist() == [
        [0.0, 0.0, 0.5, 0.5], [0.0, 0.5, 0.5, 1.0], [0.5, 0.0, 1.0, 0.5], [0.5, 0.5, 1.0, 1.0]]


def _batches(shards, config: InputConfig, count: int) -> list:
    return list(train_dataset(str(shards), config).take(count).as_numpy_iterator())


def test_mosaic_stream_on_real_photos_then_its_clean_end(raccoon_shards):
    base = InputConfig(image_size=96, batch_size=4, finish_in_step=False, deterministic=True, seed=3,
                       orientations="any")
    plain = _batches(raccoon_shards, base, 3)
    mixed = _batches(raccoon_shards, InputConfig(**{**base.__dict__, "mosaic_until_step": 2}), 3)
    for finish_in_step in (False, True):  # what the model is built for: dense batches of the plain stream's shapes
        configs = [InputConfig(**{**base.__dict__, "finish_in_step": finish_in_step, "mosaic_until_step": until})
                   for until in (0, 2)]
        specs = [train_dataset(str(raccoon_shards), c).element_spec for c in configs]
        assert specs[1] == specs[0], specs
    for (images, targets), (m_images, m_targets) in zip(plain[:2], mixed[:2]):
        assert not np.allclose(images, m_images)  # steps 0 and 1: mosaics
        boxes, labels = m_targets["boxes"], m_targets["labels"]
        assert ((boxes >= 0) & (boxes <= 96)).all() and labels.max() >= 0 and labels.min() >= -1
        assert m_images.shape == images.shape and 0.0 <= m_images.min() and m_images.max() <= 1.0
    # step 2 on: the clean end, the very elements the run trains without mosaic
    (images, targets), (m_images, m_targets) = plain[2], mixed[2]
    np.testing.assert_allclose(m_images, images, atol=1e-5)
    keep = targets["labels"] >= 0
    np.testing.assert_allclose(np.sort(m_targets["boxes"][m_targets["labels"] >= 0], axis=0),
                               np.sort(targets["boxes"][keep], axis=0), atol=1e-4)


def test_training_stream_runs_without_the_autotuning_thread(raccoon_shards):
    # Its destructor waited up to a minute for that thread to wake (input_pipeline.train_dataset).
    for config in (InputConfig(batch_size=4), InputConfig(batch_size=4, workers=2)):
        assert train_dataset(str(raccoon_shards), config).options().autotune.enabled is False


def test_a_real_training_on_mosaics_turned_any_way(raccoon_shards, tmp_path, monkeypatch):
    from components.train import loop
    from components.train.augment_settings import LONG_RUN_EPOCHS, run_strength
    from components.train.trainer import TrainConfig, train_detector

    streams = []  # what the input pipeline is asked for: the plan's strength, grown for a long run
    real_stream = loop.train_dataset
    monkeypatch.setattr(loop, "train_dataset", lambda data, config: streams.append(config) or real_stream(data, config))
    result = train_detector(TrainConfig(data_dir=str(raccoon_shards), output_dir=str(tmp_path / "out"),
                                        epochs=LONG_RUN_EPOCHS, max_steps=6, batch_size="4", image_size="96",
                                        mosaic=True, orientations="any"))
    assert (tmp_path / "out" / "model.keras").exists() and np.isfinite(result.final_loss)
    assert "mosaic of 4 until step" in result.decisions["augmentation"]
    assert "turned: any" in result.decisions["augmentation"]
    grown = run_strength(TrainConfig.augment_strength, LONG_RUN_EPOCHS)[0]
    assert grown > TrainConfig.augment_strength and streams and {c.augment_strength for c in streams} == {grown}
    assert result.decisions["augmentation"].startswith(f"strength {grown:g}: ")
