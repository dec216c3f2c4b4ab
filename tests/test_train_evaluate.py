import json
import math
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from beam.split import TRAIN
from components.detector.model import ModelConfig, build_detector
from components.detector.records import count_records, eval_examples
from components.evaluate.evaluator import GateFailed, evaluate_detector
from components.train.input_pipeline import InputConfig, train_dataset
from components.train.plan import MIN_TOTAL_STEPS, MachineFacts, choose_batch_size, plan_training
from components.train.trainer import TrainConfig, train_detector


def test_train_batches_have_static_images_and_pixel_boxes(demo_shards):
    from components.train.input_pipeline import finish_batch

    ds = train_dataset(str(demo_shards), InputConfig(image_size=64, batch_size=4, augment=True))
    (raw, draws), target = next(iter(ds))
    assert raw.shape == (4, 64, 64, 3) and draws.shape == (4, 3)
    assert float(np.max(raw)) > 1.0  # 0-255: finished in the train step
    images, target = finish_batch((raw, draws), target)
    assert images.shape == (4, 64, 64, 3)
    assert 0.0 <= float(np.min(images)) and float(np.max(images)) <= 1.0
    labels, boxes = target["labels"].numpy(), target["boxes"].numpy()
    real = labels >= 0
    assert real.any() and set(np.unique(labels[real])) <= {0.0, 1.0, 2.0}
    assert (boxes[real] >= 0).all() and (boxes[real] <= 64).all()
    assert (boxes[real][:, 2] > boxes[real][:, 0]).all() and (boxes[real][:, 3] > boxes[real][:, 1]).all()
    assert (labels[~real] == -1).all()


@pytest.mark.parametrize("augment", [True, False])
def test_train_batches_finished_in_the_step_or_on_the_host_are_the_per_image_pipeline_s(raccoon_shards, augment):
    """The faster pipeline (host: scale jitter, draws, box flips, images stacked dense and boxes
    through a ragged batch; train step on a GPU or under XLA: the pixels' flip and photometric
    jitter on the whole batch; or, on a CPU, those on the host image by image) gives the
    batches of the tutorial's pipeline with the same seeds: every step per image with
    TensorFlow's own image ops, then `padded_batch` (boxes padded with 0, labels
    with -1, to the batch's largest count). Boxes and labels exactly, pixels to float rounding.
    On real photos, seeded and deterministic, so both streams walk the same examples."""
    from components.train import input_pipeline as ip

    config = InputConfig(image_size=96, batch_size=8, deterministic=True, augment=augment, augment_strength=0.7)
    files = ip.shard_files(str(raccoon_shards), "train")
    stream = ip.read_records(files, True, shuffle_seed=config.seed).shuffle(config.shuffle_buffer, seed=config.seed)
    stream = stream.repeat().enumerate().map(lambda i, s: ip.per_image_element(s, i, config), deterministic=True)
    reference = ip._padded_batch(stream, config.batch_size, config.image_size, drop_remainder=True)
    counts, flips = set(), 0
    on_host = train_dataset(str(raccoon_shards), replace(config, finish_in_step=False))  # a CPU without XLA
    for batch, (host_images, host), (want_images, want) in zip(train_dataset(str(raccoon_shards), config).take(6),
                                                                on_host.take(6), reference.take(6)):
        assert batch[0][0].dtype == tf.uint8  # the host hands on a quarter of float32's bytes
        images, targets = ip.finish_batch(*batch)
        np.testing.assert_allclose(images.numpy(), want_images.numpy(), atol=1e-5)
        np.testing.assert_array_equal(host_images.numpy(), want_images.numpy())
        for key in ("boxes", "labels"):
            np.testing.assert_array_equal(host[key].numpy(), want[key].numpy())
        for key in ("boxes", "labels"):
            assert targets[key].dtype == want[key].dtype
            np.testing.assert_array_equal(targets[key].numpy(), want[key].numpy())
        counts.add(int(want["labels"].shape[1]))
        flips += int(np.sum(batch[0][1].numpy()[:, 0]))
    assert len(counts) > 1 or max(counts) > 1  # batches with padding to check
    assert (0 < flips < 48) if augment else flips == 0  # both kinds of image compared


def test_greyscale_images_decode_to_rgb(raccoon_shards):
    shapes = [ex["image"].shape[-1] for ex in eval_examples(str(raccoon_shards), TRAIN)]
    assert shapes and set(shapes) == {3}


def test_model_config_round_trips_and_builds():
    cfg = ModelConfig(num_classes=2, image_size=64, backbone_filters=(64, 32, 32, 32), head_conv_layers=1,
                      min_level=4, max_level=5, anchor_size=2.0)
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert build_detector(cfg).num_classes == 2


def test_auto_batch_size_is_capped_by_the_data():
    assert choose_batch_size("auto", 5)[0] == 5
    assert choose_batch_size(64, 10) == (10, "given on the command line (capped at the dataset size)")



def test_a_size_or_batch_is_typed_when_the_config_is_made():
    """A pipeline parameter arrives as text ("auto" or "320"): TrainConfig holds a number or
    "auto" from then on, and refuses anything else at once."""
    config = TrainConfig("data", "out", batch_size="16", image_size="320")
    assert (config.batch_size, config.image_size) == (16, 320)
    assert TrainConfig("data", "out").image_size == "auto"
    for bad in ({"batch_size": 0}, {"batch_size": "sixteen"}, {"image_size": "-1"}, {"image_size": True}):
        with pytest.raises(ValueError, match="must be 'auto' or a whole number"):
            TrainConfig("data", "out", **bad)


def test_auto_batch_keeps_enough_steps_for_a_small_dataset():
    """raccoon's 157 images x 30 epochs at 16 would be 270 steps: auto lowers the batch so the
    run makes at least MIN_TOTAL_STEPS; a given batch, a large dataset and a warm start keep theirs."""
    cpu = MachineFacts(auto_batch=(16, "auto on a CPU"))
    small = plan_training(TrainConfig("d", "o", epochs=30), cpu, num_train=157)
    assert small.batch_size == 4 and small.total_steps >= MIN_TOTAL_STEPS
    assert "lowered to 4 so that 30 epochs of 157 images make 1170 steps" in small.decisions["batch_size"]
    assert plan_training(TrainConfig("d", "o", epochs=30, batch_size=16), cpu, num_train=157).batch_size == 16
    assert plan_training(TrainConfig("d", "o", epochs=8), cpu, num_train=2080).batch_size == 16
    assert plan_training(TrainConfig("d", "o", epochs=30), cpu, num_train=157, fine_tune=True).batch_size == 16
    gpu = MachineFacts(auto_batch=(256, "auto: trial steps"), gpu_majors=(8,))
    assert plan_training(TrainConfig("d", "o", epochs=10), gpu, num_train=20000).batch_size == 128
    two = plan_training(TrainConfig("d", "o", epochs=2), MachineFacts(workers=2, auto_batch=(16, "cpu")),
                        num_train=157)
    assert (two.batch_size, two.machine_batch) == (4, 2)


def test_gpu_batch_search_stops_at_what_the_step_floor_keeps(demo_shards, monkeypatch):
    """On a GPU, `--batch-size auto` trial steps go no higher than the from-scratch run's step
    floor lets it keep (one epoch of a small split: 4 images, 2 per GPU), and up to 512 per GPU
    for a long run; the plan then keeps what the search found."""
    import components.train.trainer as trainer

    limits, xla = [], []

    def search(config, model, replicas, boxes, limit, compiled):  # what the trial steps would find: the limit
        limits.append(limit)
        xla.append(compiled)
        return limit * replicas, "trials"

    monkeypatch.setattr(trainer, "measure_auto_batch", search)
    num_train = count_records(str(demo_shards), TRAIN)
    assert num_train < MIN_TOTAL_STEPS * 8  # one epoch at 8 would be under the floor
    gpu = MachineFacts(gpu_majors=(8,), local_replicas=2)
    machine_batches = []
    for epochs in (1, 10**5):
        facts = trainer.gather_facts(TrainConfig(str(demo_shards), "o", epochs=epochs), gpu)
        machine_batches.append(plan_training(facts.config, facts.machine, facts.num_train).machine_batch)
    assert limits == [2, 512] and machine_batches[0] == 4  # the long run: the split's size (46) caps the plan
    assert xla == [False, False]  # two GPUs (MirroredStrategy): the trials compile as training will, without XLA
    assert trainer.gather_facts(TrainConfig(str(demo_shards), "o", epochs=1, batch_size=8), gpu).machine.auto_batch is None
    assert len(limits) == 2  # a given batch runs no search


def test_train_writes_model_history_and_report(trained_model, demo_shards):
    config = json.loads((trained_model / "train_config.json").read_text())
    num_train = count_records(str(demo_shards), TRAIN)
    assert config["result"]["steps"] == 7 * (num_train // 8) and config["result"]["batch_size"] == 8  # 7 epochs
    assert config["label_map"] == {"circle": 1, "square": 2, "triangle": 3}
    assert config["result"]["num_train"] == num_train
    history = json.loads((trained_model / "history.json").read_text())
    assert all(math.isfinite(v) for v in history["loss"])
    report = (trained_model / "train_report.md").read_text()
    assert "learning_rate" in report and "per 64 images" in report
    assert "| weight_average | momentum" in report and "| box_loss | giou:" in report
    assert "![training loss and held-out mAP](loss_curve.png)" in report and "waiting for input" in report
    from PIL import Image

    assert Image.open(trained_model / "loss_curve.png").size == (640, 320)
    assert 0.0 <= config["result"]["input_wait_share"] <= 1.0


def test_tensorboard_logs_hold_loss_parts_learning_rate_and_input_wait(trained_model):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained_model / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"train/loss", "train/cls_logits_loss", "train/bbox_regression_loss", "train/learning_rate",
            "speed/images_per_second", "speed/input_wait_ms", "speed/compute_ms"} <= tags
    steps = [e.step for e in events.Tensors("train/loss")]
    assert steps and steps[0] == 1


def test_evaluate_writes_finite_metrics_and_gates(trained_model, demo_shards, tmp_path):
    result = evaluate_detector(str(trained_model), str(demo_shards), str(tmp_path), min_map=0.0)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["num_images"] == count_records(str(demo_shards), "val") == result.num_images
    assert all(math.isfinite(v) for v in saved["metrics"].values())
    assert "AP/circle" in saved["metrics"] and saved["metrics"]["AP50/circle"] >= saved["metrics"]["AP/circle"]
    # How many val images the detection cap decided, at the exported threshold, recounted here.
    threshold = saved["threshold"]["score"]
    at_cap = sum(1 for d in result.detections if sum(s >= threshold for s in d.scores) >= 100)
    assert saved["cap"] == {"max_detections": 100, "images_at_cap": at_cap}
    report = (tmp_path / "eval_report.md").read_text()
    assert "| class | AP@[.5:.95] | AP50 |" in report and "| circle |" in report
    assert "The metrics count up to 100 detections per image (COCO's)." in report
    # The worst images are named by their file ids, as the shards hold them.
    assert all(t.name.startswith("demo-") for t in result.truths)
    worst = report.split("In order: ", 1)[1].split("\n", 1)[0]
    assert worst.startswith("demo-") and " missed, " in worst
    for picture in ("pr_curves.png", "f1_threshold.png", "confusion.png", "ap_by_size.png", "gallery.png"):
        assert f"]({picture})" in report and (tmp_path / picture).stat().st_size > 1000
    with pytest.raises(GateFailed, match="minimum 1.1"):
        evaluate_detector(str(trained_model), str(demo_shards), str(tmp_path / "gate"), min_map=1.1)
    assert json.loads((tmp_path / "gate" / "metrics.json").read_text())["gate"]["passed"] is False


def test_train_on_missing_data_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="label_map.json"):
        train_detector(TrainConfig(data_dir=str(tmp_path), output_dir=str(tmp_path / "m")))


def test_every_accepted_colour_mode_decodes_to_rgb(tmp_path):
    """CMYK JPEG, palette/alpha/greyscale PNG: the data step accepts them, the trainer's
    parser turns each into 3-channel RGB."""
    import io

    from PIL import Image

    from beam.example_codec import encode_example
    from beam.record_checks import CheckOptions, check_record
    from beam.source_records import SourceBox, SourceRecord
    from components.detector.records import parse_example

    for mode, fmt in (("CMYK", "JPEG"), ("P", "PNG"), ("RGBA", "PNG"), ("L", "PNG"), ("LA", "PNG")):
        buf = io.BytesIO()
        Image.new(mode, (20, 10), color=(10, 200, 30, 0) if mode == "CMYK" else None).save(buf, format=fmt)
        data = buf.getvalue()
        record = SourceRecord("x", "x.img", 20, 10, (SourceBox("a", 1, 1, 5, 5),), "test")
        checked = check_record(record, data, CheckOptions())
        assert checked.color_mode == mode, (mode, checked)
        example = encode_example(checked, data, {"a": 1}).SerializeToString()
        image = parse_example(example)["image"]
        assert image.shape == (10, 20, 3), mode


def test_count_records_uses_the_manifest_and_falls_back_to_reading(demo_shards, tmp_path):
    import json
    import shutil

    from beam.split import VAL

    manifest = json.loads((demo_shards / "manifest.json").read_text())
    expected = manifest["written"][TRAIN]
    assert count_records(str(demo_shards), TRAIN) == expected
    assert count_records(str(demo_shards), VAL) == manifest["written"][VAL]
    bare = tmp_path / "bare"  # shards of another converter: no manifest
    bare.mkdir()
    train_shards = sorted(demo_shards.glob("train-*.tfrecord"))
    for shard in train_shards:
        shutil.copy(shard, bare / shard.name)
    assert count_records(str(bare), TRAIN) == expected
    # The manifest is what is read when present: a manifest saying one more per shard is believed.
    for shard in manifest["shards"]:
        shard["records"] += 1
    (bare / "manifest.json").write_text(json.dumps(manifest))
    assert count_records(str(bare), TRAIN) == expected + len(train_shards)


def test_deterministic_input_repeats_exactly_and_the_cache_changes_nothing(demo_shards, tmp_path):
    def first_batches(**kwargs):
        config = InputConfig(image_size=64, batch_size=4, deterministic=True, seed=2, **kwargs)
        return [(x.numpy(), draws.numpy(), y["boxes"].numpy(), y["labels"].numpy())
                for (x, draws), y in train_dataset(str(demo_shards), config).take(3)]

    plain = first_batches()
    for other in (first_batches(), first_batches(cache="memory"), first_batches(cache=str(tmp_path / "cache"))):
        for a, b in zip(plain, other):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    assert list(tmp_path.glob("cache*"))  # the file cache was written
    # A resumed pipeline (skip) continues the same sequence: batch 3 of a fresh start.
    resumed = first_batches(skip_steps=2)[0]
    for x, y in zip(plain[2], resumed):
        np.testing.assert_array_equal(x, y)


def test_the_greedy_nms_keeps_kerashubs_detections_of_a_trained_model_class_by_class(trained_model, demo_shards):
    """nms.GreedyNonMaxSuppression suppresses per class: its detections are those of KerasHub's
    layer run on each class's scores alone, merged by score (among the strong ones: the two
    algorithms differ only among low scores near the threshold)."""
    import keras_hub

    from components.detector.artifacts import load_trained
    from components.detector.nms import GreedyNonMaxSuppression
    from components.detector.records import to_model_image

    model, config = load_trained(str(trained_model))
    assert isinstance(model.prediction_decoder, GreedyNonMaxSuppression)  # built with it, saved and loaded back
    size = config.image_size
    images = np.stack([to_model_image(example["image"], size).numpy()
                       for example in eval_examples(str(demo_shards)).take(32)])
    raw = model(images, training=False)
    ours = {k: v.numpy() for k, v in model.decode_predictions(raw, images).items()}
    settings = {k: v for k, v in model.prediction_decoder.get_config().items()
                if k in ("bounding_box_format", "from_logits", "iou_threshold", "confidence_threshold", "max_detections")}
    model.prediction_decoder = keras_hub.layers.NonMaxSuppression(**settings)
    logits = raw["cls_logits"]
    per_class = []
    for c in range(logits.shape[-1]):  # KerasHub's layer on one class's scores: its labels are all 0
        out = model.decode_predictions({**raw, "cls_logits": logits[..., c:c + 1]}, images)
        per_class.append(({k: v.numpy() for k, v in out.items()}, c))

    def strong(found, i, label=None):
        return {(int(label if label is not None else found["labels"][i][d]), round(float(found["confidence"][i][d]), 5),
                 tuple(np.round(found["boxes"][i][d], 3)))
                for d in range(int(found["num_detections"][i])) if found["confidence"][i][d] >= 0.1}

    assert (ours["confidence"] >= 0.1).sum() >= 10  # something to compare
    two_classes = 0
    for i in range(len(images)):
        merged = sorted(set().union(*(strong(found, i, c) for found, c in per_class)), key=lambda d: -d[1])
        theirs = set(merged[:settings["max_detections"]])  # the best, up to the layer's limit
        assert strong(ours, i) == theirs, i
        two_classes += len({label for label, _, _ in theirs}) > 1
    assert two_classes  # images where more than one class was found


def test_a_large_jpeg_decodes_at_the_scale_the_model_needs_and_a_png_whole(raccoon):
    """`decode_at_least` decodes a JPEG at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) when
    its shorter side keeps the size asked for, never below it; what the model's resize then
    makes is close to the resize of the whole decode; a PNG always decodes whole."""
    import io

    import tensorflow as tf
    from PIL import Image

    from components.detector.records import decode_at_least, decode_rgb, to_model_image

    photo = sorted((raccoon / "images").glob("*.jpg"))[0]
    picture = Image.open(photo).convert("RGB").resize((1000, 700))
    encoded = {}
    for fmt in ("JPEG", "PNG"):
        out = io.BytesIO()
        picture.save(out, format=fmt)
        encoded[fmt] = tf.constant(out.getvalue())
    for side, scale in ((87, 8), (88, 4), (175, 4), (176, 2), (350, 2), (351, 1)):
        image = decode_at_least(encoded["JPEG"], side)
        assert image.shape == (math.ceil(700 / scale), math.ceil(1000 / scale), 3), (side, scale)
        assert min(image.shape[:2]) >= side
        assert decode_at_least(encoded["PNG"], side).shape == (700, 1000, 3)
    whole = to_model_image(decode_rgb(encoded["JPEG"]), 128).numpy()
    scaled = to_model_image(decode_at_least(encoded["JPEG"], 128), 128).numpy()
    assert np.abs(whole - scaled).mean() < 0.03
