"""`--batch-size auto`: the search finds the largest batch that fits, with real trial steps."""

import numpy as np
import pytest

from components.train.batch_search import BatchSearch, cpu_ram_bound, search_largest_batch, trial_step_fits


@pytest.mark.parametrize("largest,start,limit", [(37, 8, 512), (300, 64, 512), (5, 64, 512), (512, 32, 512),
                                                 (1, 16, 512), (20, 20, 20)])
def test_search_finds_the_largest_fitting_batch_within_a_few_percent(largest, start, limit):
    result = search_largest_batch(lambda b: b <= largest, start=start, limit=limit)
    assert result.batch <= largest and result.batch >= largest * 0.93
    assert result.trials[-1] == (result.batch, True)  # the verifying step
    assert len(result.trials) <= 16


def test_search_reports_zero_when_nothing_fits_and_halves_when_verification_fails():
    assert search_largest_batch(lambda b: False, start=8, limit=64).batch == 0
    calls = []

    def flaky(batch):  # 24 passes once, then fails (fragmentation): the verify step halves
        calls.append(batch)
        return batch <= 12 or (batch <= 24 and calls.count(batch) == 1)

    result = search_largest_batch(flaky, start=24, limit=24)
    assert result.batch == 12 and (24, False) in result.trials


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
def test_trial_steps_run_the_real_model_and_compare_peak_memory(monkeypatch):
    import keras

    from components.detector.model import build_model_for

    model = build_model_for("tiny", 64, 2)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4))
    seen = []
    peak = {"bytes": 0}

    real_fit = model.fit

    def fit(data, **kwargs):  # a fake memory meter: 10 MB per image
        batch = int(data.element_spec[0].shape[0])
        seen.append(batch)
        peak["bytes"] = 10_000_000 * batch
        return real_fit(data, **kwargs)

    monkeypatch.setattr(model, "fit", fit)
    fits = trial_step_fits(model, 64, budget_bytes=60_000_000, memory_peak=lambda: peak["bytes"], reset=lambda: None)
    result = search_largest_batch(fits, start=2, limit=64)
    assert result.batch == 6 and set(seen) >= {2, 4, 6}
    assert isinstance(result, BatchSearch) and "6 fits" in result.describe()
    # dense images: the trial batch holds as many boxes per image as the densest training image
    # (the loss's anchor matching grows with them), and the real train step runs on it
    shapes = []
    monkeypatch.setattr(model, "fit", lambda data, **kwargs: shapes.append(data.element_spec[1]["boxes"].shape)
                        or real_fit(data, **kwargs))
    assert trial_step_fits(model, 64, budget_bytes=60_000_000, memory_peak=lambda: 0, reset=lambda: None,
                           boxes_per_image=150)(3)
    assert tuple(shapes[0]) == (3, 150, 4)


def test_cpu_bound_grows_with_ram_and_auto_is_capped_by_the_data():
    from components.train.plan import choose_batch_size

    from components.detector.model import model_config_for

    config = model_config_for("tiny", 128, 3)
    small, large = cpu_ram_bound(config, 2**30), cpu_ram_bound(config, 16 * 2**30)
    assert 0 < small < large
    size, reason = choose_batch_size("auto", 10, auto=(16, "auto: test"))
    assert size == 10 and "capped at the dataset size 10" in reason


def test_the_cpu_bound_counts_the_anchor_matching_of_the_densest_image(monkeypatch):
    """Dense images (shelves, crowds): the loss's anchor matching holds anchors x boxes
    IoU tensors for every image of a batch; a bound from the layer outputs alone lets a
    batch of 1,000-box images at 512 px with P2 anchors run out of RAM."""
    from dataclasses import replace

    import psutil

    from components.detector.memory_estimate import MATCH_BYTES_PER_PAIR, anchor_count, bytes_per_image
    from components.detector.model import model_config_for
    from components.train import batch_search
    from components.train.config import TrainConfig

    config = replace(model_config_for("tiny", 512, 3), min_level=2, max_level=7)  # the fit's shape for tiny objects
    assert anchor_count(config) == 196_560
    added = bytes_per_image(config, False, boxes_per_image=1000) - bytes_per_image(config, False)
    assert added == anchor_count(config) * 999 * MATCH_BYTES_PER_PAIR  # 2.6 GiB an image
    ram = 24 * 2**30
    sparse, dense = cpu_ram_bound(config, ram), cpu_ram_bound(config, ram, boxes_per_image=1000)
    assert sparse >= 16 and 0 < dense < 8

    # `--batch-size auto` on a CPU takes the densest image's count and says so
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": ram})())
    batch, reason = batch_search.measure_auto_batch(TrainConfig(data_dir="d", output_dir="o"), config,
                                                    boxes_per_image=1000)
    assert batch == dense and "anchor matching of 1000 box(es) an image" in reason


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_the_gpu_batch_search_trains_trial_steps_under_each_mixed_policy_and_keeps_what_fits(precision, monkeypatch):
    """The search a GPU machine runs, on this CPU: the trial model built as training builds it
    (batch_search.trial_model) under the policy training_state sets, real trial steps, an
    out-of-memory error injected from batch 3 up (as the GPU raises it from the step)."""
    import keras
    import tensorflow as tf

    from components.detector.model import model_config_for
    from components.train.batch_search import trial_model
    from components.train.config import TrainConfig
    from components.train.process_state import training_state

    with training_state(seed=0, deterministic=False, precision=precision):
        model = trial_model(model_config_for("tiny", 64, 2), TrainConfig(data_dir="d", output_dir="o"))
        assert model.dtype_policy.name == precision
        scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert scaled == (precision == "mixed_float16")  # float16 trains with loss scaling
        real_fit, trained = model.fit, []

        def fit(data, **kwargs):
            batch = int(data.element_spec[0].shape[0])
            if batch >= 3:
                raise tf.errors.ResourceExhaustedError(None, None, f"injected: OOM at batch {batch}")
            history = real_fit(data, **kwargs)
            trained.append((batch, history.history["loss"][-1]))
            return history

        monkeypatch.setattr(model, "fit", fit)
        fits = trial_step_fits(model, 64, budget_bytes=10**9, memory_peak=lambda: 0, reset=lambda: None)
        result = search_largest_batch(fits, start=2, limit=8)
    assert result.batch == 2
    assert result.trials == [(2, True), (4, False), (3, False), (2, True)]
    assert [batch for batch, _ in trained] == [2, 2]  # the real steps: the first trial and the verifying one
    assert all(np.isfinite(loss) for _, loss in trained)  # the steps really trained under the policy
