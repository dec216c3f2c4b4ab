"""With `--grow-input`, a given time budget that buys more than the capped epochs at the fitted
input size spends the rest on a larger input (components/train/afforded_size.py): the rule on raccoon's real boxes, where
it does not apply, a resumed run's kept size, and the refit at the curve's run's size."""

import doctest

import pytest

from components.detector.holdout import TuningSplit
from components.train import afforded_size
from components.train.afforded_size import AFFORD_MARGIN, budget_shape
from components.train.config import TrainConfig
from components.train.time_budget import RunLength


def test_the_examples_run():
    assert doctest.testmod(afforded_size).failed == 0


@pytest.fixture(scope="module")
def raccoon_fit(raccoon_shards):
    """Raccoon's train boxes and the shape `auto` fits to them (128 px: its boxes are large)."""
    from beam.contract.label_map import num_class_slots, read_dataset_label_map
    from components.detector.fitted_shape import shape_for_sample
    from components.detector.records import read_box_sample

    label_map = read_dataset_label_map(str(raccoon_shards))
    sample = read_box_sample(str(raccoon_shards), label_map=label_map)
    classes = num_class_slots(label_map)
    return sample, classes, shape_for_sample(sample, "tiny", classes, "auto", on_gpu=False)


CARVE = TuningSplit("unused", 0.2, 0, fit=125, held_out=32)  # raccoon's: a refit follows the curve's run


def _length(affordable: float) -> RunLength:
    return RunLength(100, "1500 s budget (given: 25m): ...", 1500.0, 70.0, affordable, 100)


def _shape(raccoon_shards, fit, affordable, **settings):
    sample, classes, fitted = fit
    config = TrainConfig(data_dir=str(raccoon_shards), output_dir="", **{"time_budget": "25m", "grow_input": True,
                                                                      **settings})
    return budget_shape(config, sample, classes, fitted, _length(affordable), CARVE, False, 1, False)


def test_a_budget_that_buys_more_than_the_cap_trains_a_larger_input(raccoon_shards, raccoon_fit):
    from components.detector.fitted_shape import anchor_spec, cost_model
    from components.detector.geometry import SIZE_STEP, size_cap

    sample, _, fitted = raccoon_fit
    assert fitted.model.image_size == 128
    shape, length = _shape(raccoon_shards, raccoon_fit, affordable=800)
    size = shape.model.image_size
    assert 128 < size <= size_cap(sample, on_gpu=False) and size % SIZE_STEP == 0 and length.image_size == size
    # The capped epochs and the refit (1 + 157/125 times the images) fit at the estimated rate, with the margin.
    cost = lambda s: cost_model(s.model).total(s.model.image_size, anchor_spec(s.model))  # noqa: E731
    speed = cost(fitted) / cost(shape)
    assert length.images_per_second == pytest.approx(70.0 * speed) and length.affordable == pytest.approx(800 * speed, abs=0.01)
    assert length.epochs == 100 and length.affordable >= 100 * (1 + 157 / 125) * AFFORD_MARGIN
    assert shape.decisions["image_size"].startswith(f"auto: {size}: the budget buys 800 epochs at the fitted 128px")
    assert "fitted to the boxes: auto: 128" in shape.decisions["image_size"]
    assert f"at the afforded {size}px: 100 epochs" in length.reason
    # The anchors are fitted at the larger size: the same boxes are reached.
    assert shape.coverage >= 0.95 and shape.model.min_level >= fitted.model.min_level
    # A larger budget affords at least as large an input; without the refit to pay for, a larger one.
    assert _shape(raccoon_shards, raccoon_fit, affordable=2000)[0].model.image_size >= size
    assert _shape(raccoon_shards, raccoon_fit, affordable=800, refit="off")[0].model.image_size > size


def test_where_the_rule_does_not_apply_the_fitted_shape_stays(raccoon_shards, raccoon_fit):
    _, _, fitted = raccoon_fit
    for settings in ({"grow_input": False},  # the default: off until measured to pay on two real sets
                     {"time_budget": "auto"},  # auto ends at its images or its curve: the same model on any machine
                     {"image_size": 128},  # a size a person gave
                     {}):  # a budget that pays for no more than the capped epochs and the refit
        affordable = 250 if not settings else 5000
        shape, length = _shape(raccoon_shards, raccoon_fit, affordable, **settings)
        assert shape is fitted and length == _length(affordable), settings
    sample, classes, _ = raccoon_fit
    config = TrainConfig(data_dir=str(raccoon_shards), output_dir="", time_budget="25m", grow_input=True)
    warm = budget_shape(config, sample, classes, fitted, _length(5000), CARVE, True, 1, False)
    assert warm[0] is fitted  # a warm start keeps its source's shape


def test_a_resumed_run_keeps_the_size_its_budget_afforded(raccoon_shards, raccoon_fit):
    from dataclasses import replace

    sample, classes, fitted = raccoon_fit
    config = TrainConfig(data_dir=str(raccoon_shards), output_dir="", time_budget="25m", grow_input=True)
    kept = replace(_length(800), image_size=192)  # run_length.json, as the first attempt wrote it
    shape, length = budget_shape(config, sample, classes, fitted, kept, CARVE, False, 1, False)
    assert shape.model.image_size == 192 and length is kept
    assert shape.decisions["image_size"].startswith("auto: 192: the size this run's budget afforded when it started")


def test_the_refit_trains_at_the_size_the_curves_run_was_afforded(monkeypatch, tmp_path):
    """The refit's config takes the curve's run's afforded size (with `auto` it would fit 128 px
    again); a run without one refits with the size as given."""
    from components.train import refit
    from components.train.trainer import TrainResult

    asked = []

    def trained(config):
        asked.append(config)
        (tmp_path / refit.REFIT_DIR).mkdir(exist_ok=True)
        (tmp_path / refit.REFIT_DIR / refit.MODEL_FILE).write_text("weights")
        return TrainResult(str(tmp_path / "model.keras"), 125, 8, 8, 1500, 33.0, None, 0.5, 300.0, held_out=32,
                           epochs=100, budget_seconds=1500.0, afforded_size=224 if len(asked) == 1 else 0)

    monkeypatch.setattr(refit, "train_detector", trained)
    monkeypatch.setattr(refit, "_recorded", lambda out, result, first: result)
    refit.train_and_refit(TrainConfig(data_dir="d", output_dir=str(tmp_path), time_budget="25m"))
    assert [c.image_size for c in asked] == ["auto", 224] and asked[1].epochs == 100
