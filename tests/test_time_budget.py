"""A run trained as long as its time budget pays for, watching its own learning curve on held-out
train images: the budget's plan (pure), the stop on a made-up flat curve with the best point's
weights kept, the curves written where people look, and a deadline that ends a run inside it."""

import doctest
import json
import math
import os
from pathlib import Path

import pytest


def test_the_examples_in_the_budget_modules_run():
    from components.detector import artifacts, training_rate
    from components.train import augment_settings, refit_choice, schedules, stopped_short, time_budget

    for module in (time_budget, schedules, artifacts, refit_choice, training_rate, stopped_short, augment_settings):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_a_hiccup_does_not_make_the_measured_training_rate():
    """The rate a budget plans with is the median step: the case that once read 2,226 images/s
    (a delayed step in the short timing call, so the long call was barely longer) reads the
    steps' own rate, and so does a run with its slowest step anywhere."""
    from components.detector.training_rate import median_step_rate

    steady = [0.1 * i for i in range(11)]  # 10 steps of 0.1 s, batch 8: 80 images/s
    assert median_step_rate(steady, 8) == pytest.approx(80.0)
    for late in range(1, 11):
        ends = [t + (0.9 if i >= late else 0.0) for i, t in enumerate(steady)]  # one step 1 s long
        assert median_step_rate(ends, 8) == pytest.approx(80.0)
    with pytest.raises(ValueError, match="at least two steps"):
        median_step_rate([1.0], 8)


def test_a_budget_becomes_epochs_at_the_measured_rate():
    from components.train.time_budget import (END_RESERVE_SECONDS, MAX_BUDGET_EPOCHS, SCORE_SHARE, chosen_budget,
                                              epochs_for_budget)

    length = epochs_for_budget(600, 60, images_per_second=50, examples_per_epoch=1000)
    assert length.epochs == int((600 - 60 - END_RESERVE_SECONDS) * (1 - SCORE_SHARE) * 50 / 1000)
    assert "600 s budget" in length.reason and "50.0 images/s" in length.reason and length.affordable > 25
    assert epochs_for_budget(600, 60, 100, 1000).epochs in (2 * length.epochs, 2 * length.epochs + 1)
    # A fast machine reaches the cap, a warm start's smaller one; a budget spent on set-up still trains once.
    assert epochs_for_budget(3600, 0, 5000, 1000).epochs == MAX_BUDGET_EPOCHS
    assert epochs_for_budget(3600, 0, 5000, 1000, fine_tune_share=0.4).epochs == int(MAX_BUDGET_EPOCHS * 0.4)
    assert epochs_for_budget(10, 30, 50, 1000).epochs == 1
    assert chosen_budget("auto", on_gpu=False)[0] < chosen_budget("auto", on_gpu=True)[0]


def test_the_plan_takes_the_epochs_the_budget_bought():
    from components.train.config import TrainConfig
    from components.train.plan import MachineFacts, plan_training
    from components.train.time_budget import RunLength

    config = TrainConfig("data", "out", batch_size=8)
    assert config.budgeted and not TrainConfig("data", "out", epochs=3).budgeted
    plan = plan_training(config, MachineFacts(), 100, length=RunLength(7, "the budget's 7"))
    assert plan.total_steps == 7 * (100 // 8) and plan.decisions["epochs"].startswith("7: the budget's 7")
    with pytest.raises(ValueError, match="needs the run length"):
        plan_training(config, MachineFacts(), 100)
    with pytest.raises(ValueError, match="time_budget must be 'auto' or a duration"):
        TrainConfig("data", "out", time_budget="soon")


def test_a_long_plan_augments_harder():
    from components.train.augment_settings import LONG_RUN_EPOCHS, STRENGTH_GROWS_AFTER
    from components.train.config import TrainConfig
    from components.train.plan import MachineFacts, plan_training
    from components.train.time_budget import RunLength

    def strength(epochs, **given):
        plan = plan_training(TrainConfig("data", "out", batch_size=8, **given), MachineFacts(), 100,
                             length=RunLength(epochs, "bought"))
        return plan.augment_strength, plan.decisions["augmentation"]

    assert strength(STRENGTH_GROWS_AFTER) == (0.25, f"strength 0.25: as given (a run of up to {STRENGTH_GROWS_AFTER} "
                                                    "epochs keeps it)")
    long, why = strength(LONG_RUN_EPOCHS)
    assert long == 0.6 and why.startswith(f"strength 0.6: 0.25 given x 2.4 for {LONG_RUN_EPOCHS} planned epochs")
    assert 0.25 < strength((STRENGTH_GROWS_AFTER + LONG_RUN_EPOCHS) // 2)[0] < 0.6
    assert strength(LONG_RUN_EPOCHS, augment_strength=0.0)[0] == 0.0  # none given stays none
    assert strength(LONG_RUN_EPOCHS, augment_strength=0.9)[0] == 1.0  # at most 1


def test_the_stop_rule_on_made_up_curves():
    from components.train.time_budget import plateaued, score_every

    flat = [0.2, 0.3, 0.31, 0.31, 0.30, 0.31, 0.30, 0.30]  # smoothed over 3, the best is four scores back
    assert plateaued(flat, patience=8, every=2) and not plateaued(flat, patience=10, every=2)
    assert not plateaued(flat, patience=0, every=2)  # patience 0: never stops early
    assert not plateaued([0.1, 0.2, 0.3, 0.4], patience=1, every=1)  # still rising
    # One lucky early score (a held-out set of 32 photos: an mAP's sd about 0.03) stops a curve that
    # still climbs on single scores, not on the smoothed curve.
    lucky = [0.1, 0.4, 0.3, 0.32, 0.33, 0.34, 0.35]
    assert plateaued(lucky, patience=4, every=1, window=1) and not plateaued(lucky, patience=4, every=1)
    # Scoring more held-out images, or slower, is done less often; never less than once an epoch.
    assert score_every(400, 1000, 50) > score_every(40, 1000, 50) >= 1


def test_patience_auto_is_tied_to_the_plan():
    from components.train.config import TrainConfig
    from components.train.time_budget import DEFAULT_PATIENCE, PATIENCE_SHARE, patience_epochs

    assert TrainConfig("data", "out").patience == "auto" and TrainConfig("data", "out", patience="7").patience == 7
    assert patience_epochs("auto", 100)[0] == max(DEFAULT_PATIENCE, round(PATIENCE_SHARE * 100))
    assert patience_epochs("auto", 6)[0] == DEFAULT_PATIENCE and patience_epochs(0, 100)[0] == 0
    with pytest.raises(ValueError, match="patience must be 'auto' or a whole number"):
        TrainConfig("data", "out", patience="soon")


def test_auto_on_a_cpu_trains_the_same_images_on_a_slow_machine_and_a_fast_one():
    from components.train.time_budget import CPU_AUTO_IMAGES, CPU_AUTO_SECONDS, chosen_length, epochs_for_budget

    auto = chosen_length("auto", on_gpu=False)
    assert auto.images == CPU_AUTO_IMAGES and auto.seconds == CPU_AUTO_SECONDS
    assert chosen_length("auto", on_gpu=True).images == 0 and chosen_length("20m", on_gpu=False).images == 0
    slow, fast = (epochs_for_budget(auto.seconds, 60, rate, 1880, max_images=auto.images) for rate in (37.0, 111.0))
    assert slow.epochs == fast.epochs == CPU_AUTO_IMAGES // 1880 == slow.cap and "CPU_AUTO_IMAGES" in slow.reason
    # Where the images are dear (large photos), the seconds bound it; a warm start takes its share.
    assert epochs_for_budget(auto.seconds, 60, 2.0, 1880, max_images=auto.images).epochs < slow.epochs
    assert epochs_for_budget(auto.seconds, 60, 111.0, 1880, 0.4, max_images=auto.images).epochs == int(
        CPU_AUTO_IMAGES * 0.4 // 1880)


def test_the_time_budget_option_is_checked_before_anything_runs(demo_shards, tmp_path, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--data", str(demo_shards), "--output", str(tmp_path), "--time-budget", "3 days"])
    assert exit_info.value.code == 2 and "--time-budget must be 'auto' or a duration" in capsys.readouterr().err


@pytest.fixture(scope="module")
def plateau_run(demo_shards, tmp_path_factory):
    """A budgeted training on real shards whose held-out scores are made up: 0.1, then 0.5,
    then 0.3 every time after (a plateau), with the weights in place at each score recorded."""
    from components.train import curve
    from components.train.distribution import weights_digest
    from components.train.trainer import ProbeAdvice, TrainConfig, train_detector

    scores, seen = iter([0.1, 0.5]), []

    def made_up(model, record, data_dir, split="val", detector=None, batches=None):
        assert split == "val" and Path(data_dir).name == "held_out"  # the carve of train, never the data's val
        seen.append(weights_digest(model))
        return {"mAP": next(scores, 0.3)}

    out = tmp_path_factory.mktemp("plateau_run")
    vertex = tmp_path_factory.mktemp("vertex_tensorboard")  # as Vertex sets it in a job with a TensorBoard
    real = curve.model_metrics
    curve.model_metrics = made_up
    os.environ[curve.VERTEX_TENSORBOARD_ENV] = str(vertex)
    try:
        result = train_detector(TrainConfig(
            data_dir=str(demo_shards), output_dir=str(out), batch_size=4, image_size=64, time_budget="10m",
            patience=3, probe=ProbeAdvice(images_per_second=40.0)))
    finally:
        curve.model_metrics = real
        del os.environ[curve.VERTEX_TENSORBOARD_ENV]
    return result, out, seen, vertex


@pytest.mark.slow
def test_a_flat_curve_stops_the_run_and_the_best_points_weights_are_kept(plateau_run):
    from components.detector.artifacts import HistoryFile, load_trained
    from components.train.distribution import weights_digest

    result, out, seen, _ = plateau_run
    history = HistoryFile.read(out)
    scored = history.scored()
    assert [v for _, v in scored][:2] == [0.1, 0.5] and all(v == 0.3 for _, v in scored[2:])
    every = scored[1][0] - scored[0][0]
    steps_per_epoch = history.columns["step"][0]  # one chunk an epoch
    assert (len(scored) - 2) * every // steps_per_epoch >= 3  # patience 3 epochs, counted in scores
    assert result.stopped.startswith("plateau: no better held-out mAP for 3 epochs") == history.stop.startswith(
        "plateau")
    assert result.steps == scored[-1][0] < 100 * steps_per_epoch  # stopped long before the budget's epochs
    # The model is the weights of the 0.5 point (their average, as scored), not the last step's.
    assert result.best_step == history.best_step == scored[1][0]
    assert result.weights_sha256 == seen[1] != seen[-1]
    model, _ = load_trained(str(out))
    assert weights_digest(model) == seen[1]
    assert f"kept the weights of step {scored[1][0]}" in result.decisions["stopped"]


@pytest.mark.slow
def test_the_curves_are_written_where_people_look(plateau_run):
    import tensorflow as tf

    from components.detector.artifacts import HistoryFile

    result, out, _, vertex = plateau_run
    history = json.loads((out / "history.json").read_text())
    assert {"step", "epoch", "learning_rate", "loss", "held_out_mAP"} <= set(history)
    assert len(set(len(history[k]) for k in ("step", "epoch", "learning_rate", "loss", "held_out_mAP"))) == 1
    assert history["stopped"]["reason"] == result.stopped and HistoryFile.read(out).best_step == result.best_step
    rates = history["learning_rate"]
    assert rates[0] < max(rates) and rates[-1] < 0.05 * max(rates)  # the warmup; after the plateau, the decay to 0
    assert "then the learning rate decayed to 0 over" in result.stopped
    for folder in (out / "tensorboard", vertex):  # the model's folder, and Vertex's TensorBoard directory
        tags = set()
        for events in folder.rglob("events.out.tfevents.*"):
            for record in tf.compat.v1.train.summary_iterator(str(events)):
                tags |= {value.tag for value in record.summary.value}
        assert {"held_out/held_out_mAP", "epoch/learning_rate", "epoch/loss"} <= tags, folder
    assert (out / "loss_curve.png").stat().st_size > 10_000
    report = (out / "train_report.md").read_text()
    assert f"- stopped: {result.stopped}" in report and "held_out_curve" in report
    assert json.loads((out / "checkpoints" / "run_length.json").read_text())["epochs"] >= 1
    assert not (out / "held_out").exists()  # the carve of train is not left in the model's folder


def test_the_deadline_stops_before_the_chunk_that_would_pass_it():
    """The deadline check of the curve (curve.LearningCurve._out_of_time), on its own: a chunk of
    about 2 s, a score of about 1 s."""
    import time

    from components.train.curve import CurvePlan, CurveState, LearningCurve

    def curve(deadline_in: float, end_step: int = 100) -> LearningCurve:
        made = LearningCurve(CurvePlan(10, deadline=time.monotonic() + deadline_in, end_step=end_step),
                             record=lambda: None, writer=None)
        made._chunk_seconds = 2.0
        made.state = CurveState(rows={10: {"held_out_mAP": 0.2}}, score_seconds=1.0)
        return made

    assert curve(2.5)._out_of_time(step=10)  # 2 s of chunk and 1 s of score do not fit in 2.5
    assert not curve(3.5)._out_of_time(step=10)
    assert not curve(-1.0, end_step=10)._out_of_time(step=10)  # the last chunk: nothing left to stop


def test_a_budget_is_corrected_again_by_the_mean_pace_at_its_rechecks():
    """curve.LearningCurve._correct on its own: the early corrections take one chunk's time; at
    each of RECHECK_SHARES of the planned steps the length is set again by the mean of every
    chunk timed, so a slow early chunk does not leave the budget's end unspent."""
    import time

    from components.train.curve import RECHECK_SHARES, CurvePlan, LearningCurve
    from components.train.schedules import WarmupCosine

    schedule = WarmupCosine(1.0, warmup_steps=10, total_steps=200)
    made = LearningCurve(CurvePlan(10, deadline=time.monotonic() + 100.0, budgeted=True, end_step=200,
                                   examples_per_epoch=100, chunk=10), record=lambda: None, writer=None,
                         schedule=schedule)
    made._paced_seconds, made._paced_chunks = 8.0, 1  # the second chunk: 8 s
    made._correct(step=20, chunk_seconds=8.0)  # 12 more epochs of 8 s in the ~100 s left
    assert made.plan.end_step == 140 and "by step 20 (a whole chunk's time)" in made.state.corrected
    assert not made._due_correction(30, chunk_time=4.0)  # no score, no recheck share reached yet
    made._paced_seconds, made._paced_chunks = 8.0 + 4.0 * 3, 4  # then chunks of 4 s: a mean of 5 s
    step = int(RECHECK_SHARES[0] * 140) // 10 * 10 + 10
    assert made._due_correction(step, chunk_time=4.0)
    made._correct(step, chunk_seconds=4.0)
    assert made.plan.end_step > 140 and int(schedule.total_steps.numpy()) == made.plan.end_step
    assert "the mean pace of the 4 chunks timed" in made.state.corrected.split("; then ")[1]
    assert made._rechecks == 1 and not made._due_correction(step + 10, chunk_time=4.0)
    assert made._due_correction(int(RECHECK_SHARES[1] * made.plan.end_step) + 10, chunk_time=4.0)


def test_a_rising_curve_the_budget_ends_says_it_stopped_short():
    """A made-up curve still climbing when the budget ends: one line, with the epochs to the
    plateau and the budget that buys them at the run's pace; a flat or falling one: nothing."""
    from components.train.stopped_short import PLATEAU_GAIN, plateau_epoch, short_line

    rising = [(1, 0.02), (2, 0.24), (3, 0.61), (4, 0.73), (5, 0.79), (6, 0.80)]  # the demo's 6 epochs in make run
    line = short_line(rising, patience=10, seconds_per_epoch=22.0, images_per_second=88.5, cap=100)
    assert line.startswith("stopped short: the held-out curve was still rising (mAP 0.020 at epoch 1 to 0.800 at "
                           "epoch 6); about ") and line.endswith("at the 88.5 images/s trained here")
    epochs = int(line.split("about ")[1].split(" epochs")[0])
    minutes = int(line.split("--time-budget ")[1].split("m ")[0])
    assert 6 < epochs <= 100 and minutes == -(-epochs * 22 // 60)
    flat = [(2, 0.5), (4, 0.6), (6, 0.61), (8, 0.605), (10, 0.61), (12, 0.60), (14, 0.61)]
    assert short_line(flat, patience=6, seconds_per_epoch=22.0, images_per_second=88.5, cap=100, every=2) == ""
    assert short_line([(1, 0.3)], patience=10, seconds_per_epoch=1, images_per_second=1, cap=100) == ""  # one point
    # A run its epoch cap ended (raccoon-like: 100 epochs in a 10-minute budget, still rising): a longer
    # budget buys no more epochs, so the line names --epochs beyond the cap, never a --time-budget.
    capped = [(10, 0.05), (30, 0.18), (60, 0.25), (80, 0.28), (100, 0.295)]
    line = short_line(capped, patience=20, seconds_per_epoch=4.5, images_per_second=59.7, cap=100)
    assert "at the most epochs a budget buys (100)" in line and "--time-budget" not in line
    past = int(line.split("--epochs ")[1].split(" ")[0])
    assert 100 < past <= 500 and f"about {past} epochs would reach its plateau" in line
    # A run whose pace, measured early, planned fewer epochs than its budget buys at the pace it
    # trained (the demo at 25 minutes: 82 epochs planned, the plateau about 84 at 22 minutes of
    # the 25): the line names --epochs, never a budget no longer than the one given.
    line = short_line(rising, patience=10, seconds_per_epoch=22.0, images_per_second=88.5, cap=100,
                      budget_seconds=minutes * 60 + 60)
    assert line.endswith(f"--epochs {epochs}") and "--time-budget" not in line
    assert f"which the {minutes + 1}m given buys at the 88.5 images/s trained here" in line
    assert short_line(rising, patience=10, seconds_per_epoch=22.0, images_per_second=88.5, cap=100,
                      budget_seconds=epochs * 22.0 - 1) == short_line(rising, patience=10, seconds_per_epoch=22.0,
                                                                     images_per_second=88.5, cap=100)
    # The plateau estimate: gains under PLATEAU_GAIN per patience window from there on.
    slope = 0.1
    at = plateau_epoch(slope, 10, 1000)
    import math

    assert slope * math.log((at + 10) / at) < PLATEAU_GAIN <= slope * math.log((at - 1 + 10) / (at - 1))


def rising_config(demo_shards, out):
    from components.train.trainer import ProbeAdvice, TrainConfig

    return TrainConfig(data_dir=str(demo_shards), output_dir=str(out), batch_size=4, image_size=64, time_budget="10m",
                       holdout=0.1, max_steps=60, refit="on", probe=ProbeAdvice(images_per_second=40.0))


@pytest.fixture(scope="module")
def rising_run(demo_shards, tmp_path_factory):
    """A budgeted training on real shards that its steps' cap ends while its made-up held-out
    scores still climb (0.1, 0.2, 0.3, ...); then, with `--refit on`, trained again on the whole
    train split (refit.py): the model handed over is the refit's."""
    from components.train import curve
    from components.train.refit import train_and_refit

    scores = iter(0.1 * (i + 1) for i in range(100))
    real = curve.model_metrics
    curve.model_metrics = lambda *args, **kwargs: {"mAP": next(scores)}
    out = tmp_path_factory.mktemp("rising_run")
    try:
        result = train_and_refit(rising_config(demo_shards, out))
    finally:
        curve.model_metrics = real
    return result, out


@pytest.mark.slow
def test_a_run_its_budget_ends_on_a_rising_curve_says_so_where_people_look(rising_run, tmp_path):
    from components.detector.artifacts import HistoryFile
    from components.report.sections import training_section
    from components.train.stopped_short import SHORT_OF_PLATEAU
    from pipeline.kfp_steps import KEY_FIGURES

    result, out = rising_run
    assert len(HistoryFile.read(out).scored()) >= 2 and result.stopped.startswith("budget")
    assert result.short.startswith("stopped short: the held-out curve was still rising")
    assert result.length_line.endswith(SHORT_OF_PLATEAU) and result.decisions["stopped_short"] == result.short
    assert f"- **{result.short}**" in (out / "train_report.md").read_text()
    assert training_section(out)["result"]["short"] == result.short  # what the run report shows
    from components.report.run_report import RunInputs, render_run_report

    page = render_run_report(RunInputs(train_dir=str(out)))
    assert f"Training {result.short}." in page and f"The model is a refit on the whole train split ({result.refit})" in page
    figure = KEY_FIGURES["train"]({"images_per_second": 40.0, "length": result.length_line})
    assert figure.endswith("budget, refit, short")


@pytest.mark.slow
def test_a_refit_trains_the_whole_split_for_the_curves_epochs_and_its_model_is_handed_over(rising_run, demo_shards,
                                                                                           caplog):
    from components.detector.artifacts import CHECKPOINT_DIR, HistoryFile, TrainConfigFile, load_trained
    from components.detector.records import count_records
    from components.train.distribution import weights_digest
    from components.train.refit import CURVE_RUN, REFIT_DIR, train_and_refit

    result, out = rising_run
    curve_run = TrainConfigFile.read(out).result[CURVE_RUN]
    refit = TrainConfigFile.read(out / REFIT_DIR)
    train = count_records(refit.train["data_dir"], "train")
    # The curve's run trained the fit part; the refit every train image, its epochs those of the curve's
    # run (rounded up), its steps capped as the run's were (max_steps).
    assert curve_run["num_train"] + curve_run["held_out"] == train == refit.result["num_train"]
    assert refit.train["epochs"] == math.ceil(curve_run["epochs"]) and not refit.result["held_out"]
    assert result.decisions["refit"].startswith(f"on (given): {refit.train['epochs']} epoch(s) on all {train} ")
    # The model handed over is the refit's: its weights, named in the result, the report and the run's line.
    assert result.weights_sha256 == refit.result["weights_sha256"] != curve_run["weights_sha256"]
    assert weights_digest(load_trained(str(out))[0]) == result.weights_sha256
    assert result.refit.endswith(f"on all {train} train images") and f"({result.refit})" in result.length_line
    assert TrainConfigFile.read(out).result["refit"] == result.refit
    report = (out / "train_report.md").read_text()
    assert "## Refit" in report and f"the model is the refit's: {result.refit}" in report
    assert len(HistoryFile.read(out).scored()) >= 2  # the curve that chose the epochs stays the run's
    # Run again (a refit killed, or a step retried): the curve's run is not trained again and the
    # refit resumes from its own last checkpoint: the same model.
    assert (out / REFIT_DIR / CHECKPOINT_DIR).is_dir()
    with caplog.at_level("INFO"):
        again = train_and_refit(rising_config(demo_shards, out))
    assert "the curve's run is done" in caplog.text and again.weights_sha256 == result.weights_sha256
    assert (out / "train_report.md").read_text().count("## Refit") == 1
