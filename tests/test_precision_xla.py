"""Precision and XLA: decided by the plan with reasons, the weight average under loss
scaling, XLA's step giving the same losses as without, and the boxes padded so XLA does not
recompile. (The full GPU paths on real photos: test_mixed_float16.py, test_mixed_bfloat16.py.)"""

import numpy as np
import pytest

from components.detector.precision import choose_precision, choose_xla
from components.train.config import TrainConfig
from components.train.plan import MachineFacts, plan_training


def test_module_examples():
    import doctest

    from components.detector import precision
    from components.probe import dry_run, machine_facts
    from components.train import input_pipeline, plan, xla

    for module in (precision, xla, input_pipeline, plan, dry_run, machine_facts):
        assert doctest.testmod(module).failed == 0, module.__name__


@pytest.mark.parametrize("majors,replicas,precision,xla", [
    ((), 1, "float32", False),  # a CPU
    ((7,), 1, "mixed_float16", True),  # the default accelerator, a T4
    ((8, 8), 2, "mixed_bfloat16", False),  # two A100s: MirroredStrategy, where Keras leaves XLA off too
    ((9,), 1, "mixed_bfloat16", True),  # an H100
])
def test_auto_picks_what_the_machine_gets_and_says_why(majors, replicas, precision, xla):
    plan = plan_training(TrainConfig("d", "o", epochs=10, batch_size=8), MachineFacts(local_replicas=replicas, gpu_majors=majors),
                         num_train=64)
    assert (plan.precision, plan.xla) == (precision, xla)
    assert plan.decisions["precision"].startswith(f"{precision}: auto: ")
    assert plan.decisions["xla"].startswith(("on (auto)" if xla else "off (auto)"))


def test_a_forced_choice_is_used_with_a_warning_where_the_machine_runs_it_slowly():
    plan = plan_training(TrainConfig("d", "o", epochs=10, batch_size=8, precision="mixed_float16", xla="on"), MachineFacts(),
                         num_train=64)
    assert plan.precision == "mixed_float16" and plan.xla
    assert "WARNING: no GPU here" in plan.decisions["precision"] and "no GPU here" in plan.decisions["xla"]
    assert "WARNING: compute capability 7.x has no fast bfloat16" in choose_precision("mixed_bfloat16", None, (7,))[1]
    assert choose_precision("auto", "mixed_float16", (8,)) == ("mixed_float16", "auto: as the probe measured on this machine")
    assert choose_precision("float32", "mixed_bfloat16", (8,))[0] == "float32"  # the command line wins
    with pytest.raises(ValueError, match="precision must be one of auto, float32"):
        choose_precision("float64", None, ())
    with pytest.raises(ValueError, match="xla must be one of auto, on, off"):
        choose_xla("yes", (), 1)


def test_xla_is_off_and_refused_with_deterministic_training():
    """Measured: XLA has no deterministic max-pool gradient ("GPU MaxPool gradient ops do not
    yet have a deterministic XLA implementation", raised on a CPU too) at the first step."""
    assert choose_xla("auto", (7,), 1, deterministic=True) == (
        False, "off (auto): --deterministic, and XLA has no deterministic max-pool gradient")
    with pytest.raises(ValueError, match="--xla on cannot train --deterministic"):
        plan_training(TrainConfig("d", "o", batch_size=8, xla="on", deterministic=True), MachineFacts(), num_train=64)


def test_the_cli_offers_both_and_refuses_other_values(capsys):
    from pipeline.cli import main

    for command in ("train", "tune", "run", "probe"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "--precision {auto,float32,mixed_float16,mixed_bfloat16}" in text and "--xla {auto,on,off}" in text
    with pytest.raises(SystemExit) as exited:
        main(["train", "--data", ".", "--output", "o", "--precision", "float64"])
    assert exited.value.code == 2


def test_the_weight_average_is_swapped_in_under_loss_scaling():
    """Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer, which has no
    `use_averages`: on main every mixed_float16 training crashed there, at its last line."""
    import keras

    from components.detector.losses import AveragedAdamW, use_weight_average
    from components.train.process_state import training_state

    with training_state(seed=1, deterministic=False, precision="mixed_float16"):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=AveragedAdamW(1e-2, use_ema=True, ema_momentum=0.5), loss="mse")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        model.fit(np.ones((8, 3), "float32"), np.zeros((8, 2), "float32"), batch_size=4, epochs=2, verbose=0)
        averages = [v.numpy() for v in model.optimizer.inner_optimizer._model_variables_moving_average]
        last = [w.numpy() for w in model.trainable_variables]
        assert not all(np.allclose(a, b) for a, b in zip(averages, last))
        use_weight_average(model)
        for average, weight in zip(averages, model.trainable_variables):
            np.testing.assert_array_equal(weight.numpy(), average)


@pytest.mark.slow
def test_the_xla_step_gives_the_same_losses_and_weights_as_without(raccoon_shards):
    """The real detector and loss on a real batch, three steps from the same weights: XLA's
    losses within 1e-5 (relative; measured 5e-7) of the step without. The weights: fused ops
    round differently, and Adam's normalised update turns a gradient near 0 into up to the
    learning rate (1e-3) either way, so a few weights may differ by up to twice the learning
    rate a step (measured: at most 2.3e-4, in 9 of 9,408 of a layer; once 1.27e-3, 0.25% of the weights
    over 1e-4, with one thread per op pool): all within 3 x 2 x 1e-3, 99% within 1e-4."""
    import keras
    import tensorflow as tf

    from components.detector.losses import AveragedAdamW, build_for_fit, compile_detector
    from components.detector.model import build_detector, model_config_for
    from components.train.accumulation import use_micro_batches
    from components.train.input_pipeline import InputConfig, finish_batch, train_dataset
    from components.train.xla import xla_step

    config = InputConfig(image_size=64, batch_size=2, augment=False, deterministic=True)  # the same batch every run
    batch = finish_batch(*next(iter(train_dataset(str(raccoon_shards), config))))
    data = tf.data.Dataset.from_tensors(batch).repeat()
    runs = {}
    for on in (False, True):
        keras.utils.set_random_seed(4)
        model = build_detector(model_config_for("tiny", 64, 2))
        compile_detector(model, AveragedAdamW(1e-3))
        build_for_fit(model, data.element_spec)
        use_micro_batches(model, 1, wrap=lambda step: xla_step(step, on))
        history = model.fit(data, epochs=3, steps_per_epoch=1, verbose=0)
        runs[on] = (np.array(history.history["loss"]), model.get_weights())
    (losses, weights), (xla_losses, xla_weights) = runs[False], runs[True]
    np.testing.assert_allclose(xla_losses, losses, rtol=1e-5)
    differences = np.concatenate([np.abs(a - b).ravel() for a, b in zip(weights, xla_weights)])
    assert differences.max() <= 3 * 2 * 1e-3 and np.mean(differences > 1e-4) < 0.01, (differences.max(),
                                                                                np.mean(differences > 1e-4))


def test_boxes_are_padded_to_few_shapes_under_xla(demo_shards):
    """Each new box count is a new XLA compilation (seen: a 13 s recompile mid-run): under
    XLA the box axis takes power-of-two sizes from the densest sampled image's count up."""
    from dataclasses import replace

    from components.train.input_pipeline import InputConfig, train_dataset

    config = InputConfig(image_size=64, batch_size=4, augment=False)
    counts = {int(t["labels"].shape[1]) for _, t in train_dataset(str(demo_shards), config).take(12)}
    padded = {int(t["labels"].shape[1])
              for _, t in train_dataset(str(demo_shards), replace(config, box_floor=3)).take(12)}
    assert padded == {4} and len(counts) >= 1 and max(counts) <= 4
