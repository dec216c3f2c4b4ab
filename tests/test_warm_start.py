"""Warm starts: training continues a trained model (the champion's, or --init-from) when it
can, says why or why not, gives a new class fresh head rows, and resumes from its own
checkpoint, not from the model it started from."""

import shutil
from dataclasses import replace

import numpy as np
import pytest

from beam.contract.label_map import read_dataset_label_map
from beam.contract.train_keys import TRAIN_KEYS_FILE, read_train_keys, write_train_keys
from components.detector.artifacts import WARM_START_FILES, TrainConfigFile
from components.detector.fitted_shape import fit_shape
from components.detector.records import read_box_sample
from components.detector.geometry import BoxSample
from components.detector.model import ModelConfig, build_detector, model_config_for
from components.register.register import register_run
from components.model_registry.registry import Registry, RegistryError
from components.model_registry.warm_source import warm_source
from components.train.config import TrainConfig
from components.train.plan import MachineFacts, plan_training
from components.train.warm_start import WarmStart, apply_warm_weights, choose_warm_start, warm_weights
from tests.test_registry import _decision, _run_files


def _choice(trained_model, data_dir, **config):
    label_map = read_dataset_label_map(str(data_dir))
    sample = read_box_sample(str(data_dir), label_map=label_map)
    fresh = fit_shape(sample, model_config_for("tiny", 128, 3), config.get("image_size", "auto"), on_gpu=False,
                      allow_poor_anchors=True)
    run = TrainConfig(str(data_dir), "out", init_from=str(trained_model), init_name="v1 (the champion)", **config)
    return choose_warm_start(run, label_map, sample, fresh)


def test_what_can_be_continued_and_why_not(trained_model, demo_shards):
    """The rules on a real trained model's files: the same data continues it with its shape;
    another model size, a pinned size it was not trained at, no shared class or a shape that
    no longer covers the boxes each start from scratch, with the reason."""
    champion = TrainConfigFile.read(trained_model)
    choice, shape = _choice(trained_model, demo_shards)
    assert choice.used and choice.name == "v1 (the champion)" and choice.new_classes == ()
    assert shape.model.image_size == champion.image_size and "kept from v1" in shape.decisions["image_size"]
    assert shape.model.max_detections == champion.max_detections == 100
    assert shape.decisions["max_detections"] == "100: kept from v1 (the champion)"
    assert choice.line().startswith("from v1 (the champion): the same tiny architecture")

    other, _ = _choice(trained_model, demo_shards, model_size="small")
    assert not other.used and "it is a tiny model and this run trains small" in other.reason
    pinned, _ = _choice(trained_model, demo_shards, image_size=champion.image_size + 32)
    assert not pinned.used and f"--image-size pins {champion.image_size + 32}" in pinned.reason

    sample = read_box_sample(str(demo_shards))
    tiny_boxes = BoxSample(sample.boxes * 0.15, sample.image_long_sides)  # objects 7x smaller than trained on
    base = model_config_for("tiny", 128, 3)
    fresh = fit_shape(tiny_boxes, base, "auto", on_gpu=False, allow_poor_anchors=True)
    run = TrainConfig(str(demo_shards), "out", init_from=str(trained_model), init_name="v1")
    shrunk, kept = choose_warm_start(run, read_dataset_label_map(str(demo_shards)), tiny_boxes, fresh)
    assert not shrunk.used and "covers" in shrunk.reason and "fitted afresh" in shrunk.reason and kept is fresh

    strangers, _ = choose_warm_start(run, {"zebra": 1}, sample, fresh)
    assert not strangers.used and "no class in common" in strangers.reason
    never, _ = choose_warm_start(TrainConfig("d", "o", init_note="warm_start is never"), {"a": 1})
    assert not never.used and never.line() == "from scratch: warm_start is never"
    with pytest.raises(FileNotFoundError, match="--init-from takes the output folder"):
        choose_warm_start(TrainConfig("d", "o", init_from=str(demo_shards)), {"a": 1})


def test_the_champion_is_continued_only_when_little_of_the_train_split_is_new(trained_model, demo_shards, tmp_path):
    """The trained model keeps its data's train_keys.txt; a warm start from the champion
    compares it with this run's: the same images continue it (0% new), a quarter new still
    does, more than that trains from scratch with the share in the reason. A model a person
    names is continued either way, and without keys (older models) nothing changes."""
    keys = read_train_keys(str(demo_shards))
    assert read_train_keys(str(trained_model)) == keys and len(keys) > 40  # the demo split's train images
    same, _ = _choice(trained_model, demo_shards, init_champion=True)
    assert same.used and same.new_images == 0.0 and same.reason.endswith("; 0% of the train images are new to it")

    champion = tmp_path / "champion"
    shutil.copytree(trained_model, champion, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    ordered, quarter = sorted(keys), len(keys) // 4
    write_train_keys(str(champion), ordered[quarter:] + ["not-in-this-split"])  # a quarter new, or just under
    some, _ = _choice(champion, demo_shards, init_champion=True)
    assert some.used and some.new_images == quarter / len(keys) <= 0.25
    assert f"{quarter / len(keys):.0%} of the train images are new to it" in some.reason
    write_train_keys(str(champion), ordered[quarter + 1:])  # one more: over a quarter
    more, shape = _choice(champion, demo_shards, init_champion=True)
    share = (quarter + 1) / len(keys)
    assert not more.used and more.new_images == share > 0.25 and "kept from" not in shape.decisions["image_size"]
    assert more.line() == (f"from scratch: {share:.0%} of the train images are new to v1 (the champion) (more than "
                           "25%): a warm start from it learns less of them than a training from scratch")
    named, _ = _choice(champion, demo_shards)  # --init-from, or a pinned version: as asked
    assert named.used and f"{share:.0%} of the train images are new to it" in named.reason
    (champion / TRAIN_KEYS_FILE).unlink()
    unknown, _ = _choice(champion, demo_shards, init_champion=True)
    assert unknown.used and unknown.new_images is None and "new to it" not in unknown.reason


def test_a_warm_start_on_denser_images_raises_the_detection_limit(trained_model, demo_shards):
    """The limit is the decoder's NMS output count (no weights): a champion trained with 100
    continued on images of up to 160 boxes returns up to 250, as a fresh fit would; the
    weights still load into the model built with it."""
    label_map = read_dataset_label_map(str(demo_shards))
    sample = read_box_sample(str(demo_shards), label_map=label_map)
    dense = replace(sample, boxes_per_image=np.full_like(sample.boxes_per_image, 160))  # as counted on shelves
    fresh = fit_shape(dense, model_config_for("tiny", 128, 3), "auto", on_gpu=False, allow_poor_anchors=True)
    run = TrainConfig(str(demo_shards), "out", init_from=str(trained_model), init_name="v1")
    choice, shape = choose_warm_start(run, label_map, dense, fresh)
    assert choice.used and fresh.model.max_detections == 250
    assert shape.model.max_detections == 250
    assert shape.model.image_size == TrainConfigFile.read(trained_model).image_size
    assert shape.decisions["max_detections"].startswith("250: raised from v1's 100: the densest of ")
    model = build_detector(shape.model)
    apply_warm_weights(model, warm_weights(choice), choice, label_map)
    assert model.prediction_decoder.max_detections == 250


def test_fine_tuning_plan_has_its_reasons():
    config = TrainConfig("d", "o", epochs=8, batch_size=16)
    scratch = plan_training(config, MachineFacts(), num_train=320)
    tuned = plan_training(config, MachineFacts(), num_train=320, fine_tune=True)
    assert (scratch.total_steps, tuned.total_steps) == (160, 60)
    assert tuned.peak_lr == pytest.approx(scratch.peak_lr * 0.15) and tuned.warmup_steps < scratch.warmup_steps
    assert "x 0.15 (fine-tuning" in tuned.decisions["learning_rate"]
    assert "average over about the last 10 of 60 steps" in tuned.decisions["weight_average"]
    assert tuned.decisions["epochs"].startswith("3: 40% of --epochs 8") and "fine-tuning" in tuned.decisions[
        "learning_rate"]
    pinned = plan_training(replace(config, fine_tune_epochs=1), MachineFacts(), num_train=320, fine_tune=True)
    assert pinned.total_steps == 20 and "--fine-tune-epochs" in pinned.decisions["epochs"]
    gentler = replace(config, fine_tune_lr_share=0.05)
    assert plan_training(gentler, MachineFacts(), num_train=320).peak_lr == scratch.peak_lr  # from scratch: unused
    tuned_gently = plan_training(gentler, MachineFacts(), num_train=320, fine_tune=True)
    assert tuned_gently.peak_lr == pytest.approx(scratch.peak_lr * 0.05)
    assert "x 0.05 (fine-tuning given with --fine-tune-lr-share" in tuned_gently.decisions["learning_rate"]


def test_the_fine_tune_epochs_help_says_what_the_plan_does():
    """`--fine-tune-epochs`' help (train --help, run --help, the Vertex console) states the share
    of --epochs a warm start trains; the plan is what decides it: the two must agree."""
    import re

    from components.train.plan import fine_tune_epochs
    from pipeline.params import BY_NAME

    help_text = BY_NAME["fine_tune_epochs"].help
    share = int(re.search(r"0: (\d+)% of epochs, rounded, at least 1", help_text).group(1)) / 100
    for epochs in (1, 2, 5, 8, 10, 13, 30, 100):
        planned, _ = fine_tune_epochs(TrainConfig("data", "out", epochs=epochs))
        assert planned == max(1, int(epochs * share + 0.5)), (epochs, help_text)


def test_known_classes_keep_their_head_rows_by_name_and_a_new_class_starts_fresh():
    source_config = ModelConfig(num_classes=3, image_size=64, backbone_filters=(64, 16, 16, 16), fpn_filters=16,
                                head_conv_layers=0)
    source = build_detector(source_config)
    for variable in source.weights:  # distinct values everywhere, so a wrong copy shows
        variable.assign(np.random.default_rng(len(variable.path)).normal(size=variable.shape).astype("float32"))
    target = build_detector(replace(source_config, num_classes=4))
    fresh_head = target.classification_head.prediction_layer.kernel.numpy()
    source_map = {"circle": 1, "square": 2, "triangle": 3}
    target_map = {"triangle": 1, "circle": 2, "diamond": 3, "square": 4}  # other ids, one new class
    choice = WarmStart(True, "test", source="x", name="v1", label_map=source_map, new_classes=("diamond",))
    apply_warm_weights(target, [w.numpy() for w in source.weights], choice, target_map)

    old = source.classification_head.prediction_layer.kernel.numpy()
    new = target.classification_head.prediction_layer.kernel.numpy()
    anchors = new.shape[-1] // 4
    assert anchors == old.shape[-1] // 3
    for a in range(anchors):
        for name, new_id in target_map.items():
            column = new[..., a * 4 + new_id - 1]
            if name == "diamond":
                np.testing.assert_array_equal(column, fresh_head[..., a * 4 + new_id - 1])
            else:
                np.testing.assert_array_equal(column, old[..., a * 3 + source_map[name] - 1])
    np.testing.assert_array_equal(target.box_head.prediction_layer.kernel.numpy(),
                                  source.box_head.prediction_layer.kernel.numpy())
    with pytest.raises(RuntimeError, match="not the same architecture"):
        apply_warm_weights(build_detector(replace(source_config, fpn_filters=8, num_classes=4)),
                           [w.numpy() for w in source.weights], choice, target_map)


def test_the_registry_hands_out_a_versions_weights(tmp_path, trained_model):
    """What register_run keeps is what a warm start fetches; old versions without weights
    and the never/no-champion cases start from scratch with the reason."""
    registry = Registry.open(str(tmp_path / "reg"))
    files = _run_files(tmp_path)
    register_run(registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"),
                 _decision(True, None), {"sha256": "a"}, "run-1")  # as recorded before weights were kept
    (files / "saved_model" / "saved_model.pb").write_bytes(b"another model")
    register_run(registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"),
                 _decision(False, "v1"), {"sha256": "b"}, "run-2", train_dir=str(trained_model))
    for name in WARM_START_FILES:
        assert (tmp_path / "reg" / "detpipe" / "versions" / "v2" / name).read_bytes() == \
            (trained_model / name).read_bytes()

    assert warm_source("never", registry, "v1", str(tmp_path / "a")).note == "warm_start is never"
    assert "no champion" in warm_source("auto", registry, "", str(tmp_path / "b")).note
    old = warm_source("auto", registry, "v1", str(tmp_path / "c"))
    assert old.folder is None and "has no trained weights" in old.note
    pinned = warm_source("v2", registry, "v1", str(tmp_path / "d"))
    assert pinned.folder and pinned.name == "v2" == pinned.version
    assert read_train_keys(pinned.folder) == read_train_keys(str(trained_model))  # kept with the version
    assert TrainConfigFile.read(pinned.folder).label_map == TrainConfigFile.read(trained_model).label_map
    with pytest.raises(RegistryError, match="no version v9"):
        warm_source("v9", registry, "v1", str(tmp_path / "e"))
    with pytest.raises(RegistryError, match="cannot be continued"):
        warm_source("v1", registry, "v1", str(tmp_path / "f"))
    with pytest.raises(ValueError, match="auto, never or a registry version"):
        warm_source("latest", registry, "v1", str(tmp_path / "g"))


@pytest.fixture(scope="module")
def with_new_class(demo_dir, trained_model, tmp_path_factory):
    """The demo images plus 24 with a fourth shape (diamond) the trained model never saw,
    built with its label map (as the data step does against a champion)."""
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from pipeline.demo_data import CLASSES, write_demo_dataset

    raw = tmp_path_factory.mktemp("with_diamonds")
    shutil.copytree(demo_dir / "images", raw / "images")
    shutil.copytree(demo_dir / "annotations", raw / "annotations")
    write_demo_dataset(raw, num_train=24, num_val=0, seed=3, classes=(*CLASSES, "diamond"), first_index=1000)
    out = tmp_path_factory.mktemp("with_diamonds_shards")
    result = build_dataset(ConvertOptions(images=str(raw / "images"), annotations=str(raw / "annotations"),
                                          output=str(out), val_fraction=0.25,
                                          base_label_map=TrainConfigFile.read(trained_model).label_map))
    assert result.ok, result.anomalies
    return out


@pytest.mark.slow
def test_a_warm_start_with_a_new_class_keeps_the_known_classes(with_new_class, trained_model, tmp_path):
    """Fine-tuned from the trained model with a new class: the known classes' AP is not
    worse than the model it started from (the bootstrap interval of the difference on the
    shared classes does not lie below 0), the new class is learned from fresh rows, and
    running the same command again resumes from its own checkpoint."""
    from components.evaluate.champion import compare_and_decide
    from components.evaluate.evaluator import evaluate_detector
    from components.model_registry.decision import PromotionRule
    from components.train.trainer import train_detector

    out = tmp_path / "warm"
    config = TrainConfig(str(with_new_class), str(out), epochs=7, fine_tune_epochs=2, batch_size=8,
                         init_from=str(trained_model), init_name="v1 (the champion)")
    result = train_detector(config)
    assert result.warm_start["used"] and result.warm_start["new_classes"] == ["diamond"]
    assert result.decisions["warm_start"].startswith("from v1 (the champion)")
    assert "1 new (diamond) start fresh" in result.decisions["warm_start"]
    written = TrainConfigFile.read(out)
    assert written.warm_start == result.warm_start and written.label_map["diamond"] == 4
    assert written.model["image_size"] == TrainConfigFile.read(trained_model).image_size
    assert "warm_start" in (out / "train_report.md").read_text()

    challenger = evaluate_detector(str(out), str(with_new_class), str(tmp_path / "eval_warm"))
    champion = evaluate_detector(str(trained_model), str(with_new_class), str(tmp_path / "eval_champion"))
    record = compare_and_decide(challenger.truths, challenger.detections, challenger.label_map,
                                challenger.metrics["mAP"], PromotionRule("not_worse", 0.0, 0.0),
                                {"version": "v1", "label_map": TrainConfigFile.read(trained_model).label_map,
                                 "detections": champion.detections})
    assert record.classes["challenger_only"] == ["diamond"]
    assert record.delta["mAP"]["high"] >= 0, record.delta  # not worse on the known classes
    assert record.blessed, record.reason

    again = train_detector(config)  # the same command: its own checkpoint, not the champion again
    assert "resumed from this run's own checkpoint" in again.decisions["warm_start"]
    assert again.weights_sha256 == result.weights_sha256


def test_the_examples_in_the_definitions_run():
    import doctest

    from components.detector import fitted_shape
    from components.model_registry import vertex_batch, vertex_endpoint
    from components.train import plan, warm_start

    for module in (warm_start, plan, vertex_batch, vertex_endpoint, fitted_shape):
        assert doctest.testmod(module).failed == 0, module.__name__
