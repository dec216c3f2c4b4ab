"""`--batch-size auto`: the search finds the largest batch that fits, with real trial steps."""

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
