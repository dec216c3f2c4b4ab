"""Training on tiles of large photos: a window of the model's size of the photo at full
resolution, only that part of a JPEG decoded, boxes in the tile's pixels, tiles of several
photos in each batch (components/train/input_pipeline.py, `InputConfig.tiled`)."""

import re
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from beam.contract.decoding import decode_crop, decode_rgb
from components.detector.records import parse_boxes, shard_files
from components.train import augment
from components.train import input_pipeline as ip


def _records(shards, count=4):
    return list(tf.data.TFRecordDataset(shard_files(str(shards), "train")).take(count))


def test_a_tile_is_the_photo_s_pixels_at_full_resolution_and_its_boxes_follow(large_photo_shards):
    config = ip.InputConfig(image_size=256, batch_size=4, tiled=True, augment=False)
    seen_boxes = 0
    for i, serialized in enumerate(_records(large_photo_shards)):
        seed = tf.constant([3, i], tf.int64)
        image, boxes, labels = ip._tile_window(serialized, config, seed)
        example = parse_boxes(serialized, encoded=True)
        photo = decode_rgb(example["encoded"]).numpy()
        shape = tf.constant(photo.shape[:2], tf.float32)
        window = augment.jitter_window(shape, 0.0, seed, 256, base=256 / shape)
        (y, x), (h, w) = window.corner.numpy().astype(int), window.extent.numpy().astype(int)
        assert (h, w) == (256, 256) and image.dtype == tf.uint8 and image.shape == (256, 256, 3)
        # libjpeg's cropped decode is the whole decode's pixels, but for its chroma upsampling at the
        # crop's last column and row (it repeats the edge rather than reading past it).
        difference = np.abs(image.numpy().astype(int) - photo[y:y + 256, x:x + 256])
        assert difference[:-1, :-1].max() <= 2 and (difference > 2).mean() < 0.01
        # Boxes in the tile's pixels are the photo's, moved: full resolution, no scaling.
        want = example["boxes"].numpy() * np.tile(photo.shape[:2], 2) - [y, x, y, x]
        inside = (want[:, 0] >= 0) & (want[:, 1] >= 0) & (want[:, 2] <= 256) & (want[:, 3] <= 256)
        real = labels.numpy() > 0
        assert labels.numpy()[-1] == 0  # the padding row every tile keeps
        np.testing.assert_allclose(np.sort(boxes.numpy()[real] * 256, axis=0), np.sort(want[inside], axis=0),
                                   atol=1e-3)
        seen_boxes += int(real.sum())
    assert seen_boxes > 0


def test_a_box_a_tile_cuts_to_a_fragment_is_an_ignored_region_that_the_loss_skips():
    from components.detector.model import ModelConfig, build_detector

    # A 200 x 200 photo's window of its top-left 100 x 100: a box wholly inside, one with 60% of
    # its area inside, one with 30% (a fragment), one outside.
    boxes = tf.constant([[10, 10, 30, 30], [75, 70, 95, 120], [10, 70, 60, 170], [150, 150, 180, 180]],
                        tf.float32) / 200.0
    labels = tf.constant([1, 2, 3, 1], tf.int64)
    moved, kept = augment.window_boxes(boxes, labels, tf.constant([0.0, 0.0]), tf.constant([0.5, 0.5]),
                                       cut_label=augment.IGNORED)
    assert kept.numpy().tolist() == [1, 2, augment.IGNORED, 0]
    np.testing.assert_allclose(moved.numpy()[2] * 100, [10, 70, 60, 100], atol=1e-4)  # the fragment, clipped
    # Whole photos (no cut_label) drop the fragment, as before.
    assert augment.window_boxes(boxes, labels, tf.constant([0.0, 0.0]), tf.constant([0.5, 0.5]))[1].numpy(
        ).tolist() == [1, 2, 0, 0]
    # The fragment's 0-based label is KerasHub's ignore class: the anchors it matches are taught
    # neither object nor background, the ones a dropped box matched become background.
    targets = ip._targets(moved, kept, 128)
    model = build_detector(ModelConfig(num_classes=3, image_size=128, backbone_filters=(64, 16, 16, 16)))
    encoder = model.label_encoder
    assert float(targets["labels"][2]) == encoder.ignore_class
    images = tf.zeros([1, 128, 128, 3])

    def anchor_classes(labels):
        y = keras_box_format(model, targets["boxes"][None], 128)
        return encoder(images=images, gt_boxes=y, gt_classes=labels[None])[1].numpy()[0]

    with_fragment = anchor_classes(targets["labels"])
    dropped = anchor_classes(tf.where(targets["labels"] == encoder.ignore_class, -1.0, targets["labels"]))
    became_ignored = (with_fragment == encoder.ignore_class) & (dropped == encoder.background_class)
    assert became_ignored.sum() > 0
    assert ((with_fragment == dropped) | became_ignored).all()


def keras_box_format(model, boxes, size):
    import keras

    return keras.utils.bounding_boxes.convert_format(boxes, source=model.bounding_box_format,
                                                     target=model.label_encoder.bounding_box_format,
                                                     height=size, width=size)


def test_a_png_photo_is_cropped_as_a_jpeg_is(large_photo_shards):
    serialized = _records(large_photo_shards, 1)[0]
    photo = decode_rgb(parse_boxes(serialized, encoded=True)["encoded"])
    png = tf.io.encode_png(photo)
    region, extra = decode_crop(png, lambda shape: (tf.constant([5.0, 7.0]), tf.constant([40.0, 30.0]), shape))
    np.testing.assert_array_equal(region.numpy(), photo.numpy()[5:45, 7:37])
    np.testing.assert_array_equal(extra.numpy(), photo.shape[:2])


def test_tiled_batches_hold_several_photos_windows_at_the_model_size(large_photo_shards):
    config = ip.InputConfig(image_size=192, batch_size=4, tiled=True, windows_per_photo=3, augment_strength=0.5,
                            deterministic=True)
    for (images, draws), targets in ip.train_dataset(str(large_photo_shards), config).take(3):
        assert images.shape == (4, 192, 192, 3) and images.dtype == tf.uint8
        labels, boxes = targets["labels"].numpy(), targets["boxes"].numpy()
        real = labels >= 0
        # full resolution: the objects stay 10-16 px (x the jitter of 1 +- 0.2), a cut one smaller
        sides = np.minimum(boxes[real][:, 2] - boxes[real][:, 0], boxes[real][:, 3] - boxes[real][:, 1])
        assert (sides <= 16 * 1.25 + 1).all() and (boxes[real] >= 0).all() and (boxes[real] <= 192).all()
        # four different photos' windows, not one photo's three copies side by side
        assert len({images.numpy()[i].tobytes() for i in range(4)}) == 4
    # The same windows whether finished in the step or on the host.
    on_host = ip.train_dataset(str(large_photo_shards), replace(config, finish_in_step=False))
    step = ip.train_dataset(str(large_photo_shards), config)
    for (batch, targets), (host_images, host_targets) in zip(step.take(2), on_host.take(2)):
        np.testing.assert_allclose(ip.finish_batch(batch, targets)[0].numpy(), host_images.numpy(), atol=1e-5)


@pytest.mark.slow  # predicts hundreds of tiles: `make test` runs it, `make test-fast` not
def test_a_tiled_model_is_evaluated_on_whole_photos_in_their_own_pixels_and_its_export_answers_the_same(
        large_photo_shards, tmp_path):
    """Evaluation predicts each val photo whole from its tiles (boxes in the photo's own
    pixels, what TiledDetector gives for the photo), and the exported SavedModel answers a
    whole photo's bytes from its tiles as evaluation does."""
    from components.detector.model import ModelConfig, build_detector
    from components.detector.records import eval_examples
    from components.detector.tile_choice import Tiling
    from components.detector.tiles import TiledDetector
    from components.detector.split_prediction import predict_split
    from components.evaluate.evaluator import val_images
    from components.export.saved_model import ServingConfig, export_saved_model

    config = ModelConfig(num_classes=3, image_size=128, backbone_filters=(64, 16, 16, 16), score_threshold=0.0,
                         max_detections=12, tiled=True, tile_overlap=32)
    assert config.tiling == Tiling(128, 32) and ModelConfig.from_dict(config.to_dict()) == config
    model = build_detector(config)
    truths, detections = predict_split(model, str(large_photo_shards), 128, batch_size=8, tiling=config.tiling)
    photos = list(eval_examples(str(large_photo_shards), "val"))
    assert len(truths) == len(detections) == len(photos) > 0
    detector = TiledDetector(model, config.tiling, batch_size=8)
    for truth, found, photo in zip(truths, detections, photos):
        height, width = photo["image"].shape[:2]
        assert (truth.height, truth.width) == (height, width) and len(found.boxes) == 12
        want = detector(photo["image"])
        np.testing.assert_allclose(np.asarray(found.boxes) * [height, width, height, width], want["boxes"],
                                   atol=1e-3)
        assert found.labels == [int(c) + 1 for c in want["labels"]]

    images, _ = val_images(str(large_photo_shards))
    out = tmp_path / "saved"
    export_saved_model(model, {"circle": 1, "square": 2, "triangle": 3}, 128, str(out), max_detections=12,
                       tiling=config.tiling)
    assert ServingConfig.read(str(out)).tile_overlap == 32
    served = tf.saved_model.load(str(out)).signatures["detect"](
        image_bytes=tf.constant(images[:2]), score_threshold=tf.constant(0.0))
    for i, want in enumerate(detections[:2]):
        count = int(served["num_detections"][i])
        assert count == len(want.boxes) == 12
        np.testing.assert_allclose(served["detection_scores"][i][:count].numpy(), want.scores, atol=1e-5)
        np.testing.assert_allclose(served["detection_boxes"][i][:count].numpy(), np.asarray(want.boxes), atol=1e-4)
        assert served["detection_classes"][i][:count].numpy().tolist() == want.labels


@pytest.mark.slow
def test_training_on_large_photos_with_small_objects_tiles_them_and_evaluates_whole_photos(large_photo_shards,
                                                                                           tmp_path):
    """Every default (--tile auto, --image-size auto) on 700-1000 px photos of 10-16 px objects:
    the trainer picks tiles, trains on windows at full resolution (a median photo's tiles per
    photo and epoch), says why in its report, and the model it writes is evaluated on whole
    photos, boxes in their own pixels."""
    from components.detector.artifacts import TrainConfigFile
    from components.detector.records import count_records
    from components.evaluate.evaluator import evaluate_detector
    from components.train.trainer import TrainConfig, train_detector

    out = tmp_path / "model"
    result = train_detector(TrainConfig(data_dir=str(large_photo_shards), output_dir=str(out), epochs=1,
                                        batch_size=2, max_steps=3))
    written = TrainConfigFile.read(out)
    assert written.tiling is not None and written.tiling.tile == written.image_size
    report = (out / "train_report.md").read_text()
    assert "tiles of" in report and "at full resolution" in report
    windows = int(re.search(r"a median photo takes (\d+) tiles", report).group(1))
    assert windows > 1 and f"{result.num_train * windows // 2} steps each" in report  # an epoch: every window
    evaluated = evaluate_detector(str(out), str(large_photo_shards), str(tmp_path / "eval"))
    assert evaluated.num_images == count_records(str(large_photo_shards), "val") > 0
    for truth, found in zip(evaluated.truths, evaluated.detections):
        assert truth.height >= 700 and all(0.0 <= v <= 1.0 for box in found.boxes for v in box)
    # The cost shown: each val photo's tiles counted, the prediction pass timed, in the evaluation report.
    from components.detector.tile_choice import tiles_per_photo
    from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics

    cost = EvalMetrics.read(tmp_path / "eval" / METRICS_FILE).prediction
    assert cost.tiled and cost.photos == evaluated.num_images and cost.seconds > 0
    assert cost.inputs == sum(tiles_per_photo(written.tiling, t.height, t.width) for t in evaluated.truths)
    assert cost.line() in (tmp_path / "eval" / "eval_report.md").read_text()
    # A converted file answers one image at the model size, not a photo from its tiles: every
    # format is FAILED with why (a NotImplementedError), none written, and the report says so.
    from components.export.converted import export_files
    from components.export.file_formats import FORMATS

    scores, errors = export_files(str(out), list(FORMATS), str(tmp_path / "files"), str(large_photo_shards))
    assert scores == [] and set(errors) == set(FORMATS)
    assert all(why.startswith("not built: ") and "is a tiled model" in why for why in errors.values())
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["export_formats.json", "export_report.md"]
    assert "| onnx | FAILED: conversion: not built:" in (tmp_path / "files" / "export_report.md").read_text()


def test_the_shuffle_buffer_holds_fewer_records_when_they_are_large(large_photo_shards, monkeypatch):
    from components.detector.records import mean_record_bytes

    size = mean_record_bytes(str(large_photo_shards), "train")
    assert size > 10_000 and ip.shuffle_buffer_for(str(large_photo_shards)) == 1024  # 1024 x ~100 KB: within
    monkeypatch.setattr(ip, "SHUFFLE_BUFFER_BYTES", int(size * 100) + 1)
    assert ip.shuffle_buffer_for(str(large_photo_shards)) == 100
    monkeypatch.setattr(ip, "SHUFFLE_BUFFER_BYTES", int(size))
    assert ip.shuffle_buffer_for(str(large_photo_shards)) == 16
