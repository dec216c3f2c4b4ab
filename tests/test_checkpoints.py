"""Kill test: SIGKILL training after its first checkpoint, run the same command again;
it resumes from the checkpoint's step and, with --deterministic, ends with the weights of
an uninterrupted run."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import numpy as np
from cli_here import run_here

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


STEPS = 12  # in chunks of 3: enough for a kill to land between checkpoints


def _command(data, out):
    return [sys.executable, "-m", "pipeline.cli", "train", "--data", str(data), "--output", str(out),
            "--batch-size", "4", "--image-size", "64", "--epochs", "100", "--max-steps", str(STEPS),
            "--checkpoint-every", "3", "--deterministic", "--seed", "5", "--no-export"]


ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _weights(out):
    from components.detector.artifacts import load_trained

    return load_trained(str(out))[0].get_weights()


def _train_here(command: list[str]) -> tuple[int, str]:
    """`_command` run in this process (--deterministic is set and restored around the training,
    process_state.py): its exit code and what it said."""
    return run_here(command[command.index("train"):])


@pytest.fixture(scope="module")
def uninterrupted(demo_shards, tmp_path_factory):
    """The weights of `_command` run once without interruption: what every interrupted and
    resumed run of the same command, in this process or another, must end with."""
    full = tmp_path_factory.mktemp("uninterrupted")
    code, said = _train_here(_command(demo_shards, full))
    assert code == 0, said[-2000:]
    return _weights(full)


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_resume_equals_uninterrupted(demo_shards, uninterrupted, tmp_path):
    killed = tmp_path / "killed"

    proc = subprocess.Popen(_command(demo_shards, killed), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The first checkpoint after training steps is complete once the manager's state file
    # names it (it is written after ckpt-1.index: a kill in between resumes from ckpt-0).
    state = killed / "checkpoints" / "checkpoint"

    def first_checkpoint_done() -> bool:
        text = state.read_text() if state.exists() else ""
        return re.search(r'^model_checkpoint_path: "ckpt-[1-9]\d*"', text, re.M) is not None

    deadline = time.monotonic() + 300
    while not first_checkpoint_done() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "training ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.keras").exists()

    code, said = _train_here(_command(demo_shards, killed))  # the rerun: in this process (no second TF import)
    assert code == 0, said[-2000:]
    resumed = re.search(r"resuming from checkpoint \S+: (\d+) step\(s\) already done", said)
    assert resumed, said[-2000:]
    steps = int(resumed.group(1))
    assert 3 <= steps < STEPS and steps % 3 == 0  # chunks of 3: it lost at most one chunk
    config = json.loads((killed / "train_config.json").read_text())
    assert f"resumed after step {steps}" in config["result"]["decisions"]["checkpoints"]
    assert config["result"]["steps"] == STEPS

    for a, b in zip(uninterrupted, _weights(killed)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_finished_run_resumes_to_nothing_left(trained_model, demo_shards, tmp_path):
    """Running a completed command again restores the last checkpoint and trains no more."""
    import shutil

    from components.train.trainer import TrainConfig, train_detector

    copy = tmp_path / "model"
    shutil.copytree(trained_model, copy)  # the fixture is shared: work on a copy
    steps = json.loads((trained_model / "train_config.json").read_text())["result"]["steps"]
    result = train_detector(TrainConfig(data_dir=str(demo_shards), output_dir=str(copy), epochs=7, batch_size=8))
    assert f"resumed after step {steps}" in result.decisions["checkpoints"]
    assert result.weights_sha256 == json.loads((trained_model / "train_config.json").read_text())["result"][
        "weights_sha256"]  # the same averaged weights as the finished run's
    assert result.final_loss is None and json.loads((copy / "history.json").read_text()) == {}


def _nan_config(demo_shards, out, batch_size=4, **kwargs):
    from components.train.trainer import TrainConfig

    return TrainConfig(data_dir=str(demo_shards), output_dir=str(out), epochs=100, batch_size=batch_size,
                       image_size=64, max_steps=10, checkpoint_every=2, **kwargs)


def test_nan_at_step_k_recovers_then_a_nan_every_time_fails_clearly(demo_shards, tmp_path, monkeypatch):
    import tensorflow as tf

    from components.train.trainer import train_detector

    created_while_tracing = []

    def record(next_creator, **kwargs):  # a variable made in a traced step makes TF trace the step twice
        if tf.inside_function():
            created_while_tracing.append(kwargs.get("name"))
        return next_creator(**kwargs)

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "nan@5")
    with tf.variable_creator_scope(record):
        result = train_detector(_nan_config(demo_shards, tmp_path))
    assert created_while_tracing == []
    recovery = result.decisions["recoveries"]
    assert "at step 5" in recovery and "after step 4" in recovery and "scaled to 0.5x" in recovery
    assert result.steps == 10 and result.final_loss is not None and np.isfinite(result.final_loss)
    assert "recoveries" in (tmp_path / "train_report.md").read_text()
    assert all(np.isfinite(w).all() for w in _weights(tmp_path))
    # Non-finite every time: the run fails clearly after the allowed recoveries. A restarted run,
    # here: it keeps the lowered rate (saved with the checkpoints), so two more halvings end at 0.125x.
    from dataclasses import replace

    from components.train.faults import TrainingDiverged

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "nan@11:always")
    with pytest.raises(TrainingDiverged, match=r"at step 11; still non-finite after 2 recoveries .* 0\.125x"):
        train_detector(replace(_nan_config(demo_shards, tmp_path, max_nan_recoveries=2), max_steps=12))


def test_bad_fault_spec_is_rejected(monkeypatch):
    import pytest

    from components.train.faults import FaultPlan

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "nan-at-3")
    with pytest.raises(ValueError, match="nan@STEP"):
        FaultPlan.from_env()


@pytest.mark.slow
def test_oom_at_step_k_halves_the_micro_batch_and_keeps_the_effective_batch(demo_shards, tmp_path, monkeypatch,
                                                                            caplog):
    from components.train.trainer import train_detector

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "oom@5")
    result = train_detector(_nan_config(demo_shards, tmp_path))
    assert result.steps == 10 and np.isfinite(result.final_loss)
    assert result.batch_size == 4 and result.micro_batch_size == 2
    recovery = result.decisions["recoveries"]
    assert "out of memory at step 5: micro-batch 4 -> 2 images" in recovery
    assert "effective batch at 4" in recovery and "after step 4" in recovery
    report = (tmp_path / "train_report.md").read_text()
    assert "2 images x 2 accumulated parts = effective batch 4" in report
    assert "effective batch: 4 images per step; micro-batch: 2" in report
    assert all(np.isfinite(w).all() for w in _weights(tmp_path))
    # A restarted run keeps the smaller micro-batch (saved with the checkpoints): out of memory
    # every time from step 11, it halves 2 -> 1, not 4 -> 2, then fails clearly at one image.
    from dataclasses import replace

    from components.train.faults import OutOfMemory

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "oom@11:always")
    with caplog.at_level("INFO", logger="components.train"), pytest.raises(
            OutOfMemory, match="out of memory at step 11 even with a micro-batch of 1 image"):
        train_detector(replace(_nan_config(demo_shards, tmp_path), max_steps=12))
    assert "resumed after step 10" in caplog.text and "out of memory at step 11: micro-batch 2 -> 1 images" in caplog.text


def test_micro_batches_halve_through_divisors_of_the_batch():
    from components.train.accumulation import next_micro_batches

    assert [next_micro_batches(16, n) for n in (1, 2, 4, 8, 16)] == [2, 4, 8, 16, None]
    assert next_micro_batches(12, 4) == 12  # parts of 3 cannot halve evenly: straight to 1 image
    assert next_micro_batches(7, 1) == 7


def test_accumulated_step_matches_the_full_batch_gradient_for_a_mean_loss():
    """Equal parts of a mean loss: the averaged part gradients equal the full batch's."""
    import keras

    from components.train.accumulation import use_micro_batches

    def model_after_one_step(parts):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        use_micro_batches(model, parts)
        x = np.arange(24, dtype="float32").reshape(8, 3) / 10
        y = np.ones((8, 2), dtype="float32")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        return model.get_weights()

    for a, b in zip(model_after_one_step(1), model_after_one_step(4)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def _tiny_model():
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _fit_tiny(model, guard, steps=4, micro_batches=1, plan=None):
    from components.train.accumulation import use_micro_batches
    from components.train.faults import InjectFault, RaiseOnNonFinite

    use_micro_batches(model, micro_batches, wrap=guard.checked)
    x = np.arange(3 * 4 * steps, dtype="float32").reshape(4 * steps, 3) / 10
    model.fit(x, np.ones((4 * steps, 2), "float32"), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[RaiseOnNonFinite(guard)] + ([InjectFault(plan)] if plan else []))


def test_a_non_finite_update_is_named_at_its_step_even_when_its_loss_was_finite():
    """A gradient that is NaN while the loss is finite (as oneDNN's kernels make of NaN
    pixels): the step whose update poisoned the weights is named, not the next one."""
    import keras
    import pytest
    import tensorflow as tf

    from components.train.faults import FiniteGuard, NonFiniteLoss

    @tf.custom_gradient
    def nan_gradient_at_step_2(x):
        step = model.optimizer.iterations + 1
        return tf.identity(x), lambda dy: dy * tf.where(tf.equal(step, 2), float("nan"), 1.0)

    class NanGradient(keras.layers.Layer):
        def call(self, x):
            return nan_gradient_at_step_2(x)

    model = _tiny_model()
    model = keras.Sequential([*model.layers, NanGradient()])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    with pytest.raises(NonFiniteLoss, match=r"^the update made the weights non-finite \(its running loss was "
                                            r"[0-9.]+\) at step 2$"):
        _fit_tiny(model, FiniteGuard(model))


def test_injected_nan_reaches_the_loss_of_exactly_step_k_with_or_without_micro_batches(monkeypatch):
    import pytest

    from components.train.faults import FaultPlan, FiniteGuard, NonFiniteLoss

    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "nan@3")
    for parts in (1, 2):
        model = _tiny_model()
        plan = FaultPlan.from_env()
        plan.poison_loss(model)
        with pytest.raises(NonFiniteLoss, match=r"^loss is nan at step 3$"):
            _fit_tiny(model, FiniteGuard(model), micro_batches=parts, plan=plan)
    plan = FaultPlan.from_env()
    model = _tiny_model()
    plan.poison_loss(model)
    plan.mark_fired()  # once: after it fired, the same step trains normally
    _fit_tiny(model, FiniteGuard(model), plan=plan)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_tf_config_gives_each_process_its_role_and_folder():
    """Vertex names the pools chief and worker; a cluster without a chief makes worker 0 the chief."""
    from components.train.distribution import ClusterRole, cluster_role

    vertex = {"cluster": {"chief": ["a:2222"], "worker": ["b:2222", "c:2222"]}, "task": {"type": "worker", "index": 1}}
    role = cluster_role({"TF_CONFIG": json.dumps(vertex)})
    assert (role.workers, role.is_chief, role.name, role.index) == (3, False, "worker-1", 2)
    assert role.write_dir("gs://b/out") == "gs://b/out/_scratch/worker-1"
    chief = cluster_role({"TF_CONFIG": json.dumps({**vertex, "task": {"type": "chief", "index": 0}})})
    assert chief.is_chief and chief.write_dir("gs://b/out") == "gs://b/out"
    no_chief = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    assert cluster_role({"TF_CONFIG": json.dumps(no_chief)}).is_chief
    assert cluster_role({}) == ClusterRole() and cluster_role({}).workers == 1
    one = {"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}
    assert cluster_role({"TF_CONFIG": json.dumps(one)}).workers == 1


@pytest.mark.slow
def test_sigterm_from_outside_saves_the_current_step_and_the_rerun_resumes_there(demo_shards, uninterrupted,
                                                                                 tmp_path):
    """A real SIGTERM from outside (as Vertex sends before it takes a spot VM back), whenever it
    lands: exit 143 after a checkpoint at the step it stopped at; the same command resumes from
    that step and ends with the uninterrupted run's weights."""
    command = _command(demo_shards, tmp_path)
    proc = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state = tmp_path / "checkpoints" / "checkpoint"
    deadline = time.monotonic() + 300
    # Training has begun once the first chunk's checkpoint (after step 3) is recorded.
    while proc.poll() is None and time.monotonic() < deadline and not (
            state.exists() and re.search(r'^model_checkpoint_path: "ckpt-[1-9]\d*"', state.read_text(), re.M)):
        time.sleep(0.02)
    assert proc.poll() is None, "training ended before the SIGTERM"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    stopped = re.search(r"stopped at step (\d+) after saving checkpoint (\S+);", stderr)
    assert stopped, stderr[-2000:]
    step = int(stopped.group(1))
    assert 3 <= step < STEPS and stopped.group(2).endswith(f"ckpt-{step}")

    code, said = _train_here(command)  # the rerun: in this process (no second TF import)
    assert code == 0, said[-2000:]
    assert re.search(rf"resuming from checkpoint \S+ckpt-{step}: {step} step\(s\) already done", said)
    config = json.loads((tmp_path / "train_config.json").read_text())
    assert f"resumed after step {step}" in config["result"]["decisions"]["checkpoints"]
    assert config["result"]["steps"] == STEPS
    for a, b in zip(uninterrupted, _weights(tmp_path)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_a_sigterm_at_step_k_then_resume_equals_an_uninterrupted_run(demo_shards, uninterrupted, tmp_path,
                                                                      monkeypatch):
    """`term@7` (fault injection: SIGTERM as step 7 starts) with chunks of 3: the checkpoint
    is at step 7, mid-chunk; the resumed run first finishes that chunk, and with
    --deterministic it ends with the uninterrupted run's weights. In this process: the
    injected SIGTERM is a real one, to this process, and the trainer's handler takes it."""
    stopped = tmp_path / "stopped"
    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "term@7")
    code, said = _train_here(_command(demo_shards, stopped))
    monkeypatch.delenv("DETPIPE_INJECT_FAULT")
    assert code == 143, said[-2000:]
    assert re.search(r"stopped at step 7 after saving checkpoint \S+ckpt-7;", said), said[-2000:]
    assert not (stopped / "model.keras").exists()
    code, said = _train_here(_command(demo_shards, stopped))
    assert code == 0, said[-2000:]
    config = json.loads((stopped / "train_config.json").read_text())
    assert "resumed after step 7" in config["result"]["decisions"]["checkpoints"]
    assert config["result"]["steps"] == STEPS
    assert config["result"]["weights_sha256"]
    for a, b in zip(uninterrupted, _weights(stopped)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_traced_learning_rate_is_built_once_a_graph_and_follows_every_step():
    """AdamW asks for the rate once for each variable it decays; the schedule builds it once
    a traced graph, and the weights after warmup and decay steps equal those of a schedule
    that rebuilds it at every ask."""
    import keras
    import tensorflow as tf

    from components.train.schedules import ScaledSchedule

    class Counted(keras.optimizers.schedules.CosineDecay):
        calls = 0

        def __call__(self, step):
            Counted.calls += 1
            return super().__call__(step)

    class Unshared(ScaledSchedule):
        def __call__(self, step):
            return self._rate(step)

    def train(schedule_class):
        keras.utils.set_random_seed(0)
        variables = [tf.Variable(tf.random.normal([3, 3])) for _ in range(6)]
        schedule = schedule_class(Counted(0.0, 6, warmup_target=0.1, warmup_steps=3))
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=0.5)
        optimizer.build(variables)

        @tf.function
        def step():
            optimizer.apply_gradients([(tf.ones_like(v), v) for v in variables])

        Counted.calls = 0
        for _ in range(8):
            step()
        return [v.numpy() for v in variables], Counted.calls

    shared, traced_calls = train(ScaledSchedule)
    unshared, untraced_calls = train(Unshared)
    assert traced_calls == 1 and untraced_calls > len(shared)
    for a, b in zip(shared, unshared):
        np.testing.assert_array_equal(a, b)


def test_a_fit_slow_to_return_after_its_last_callback_is_said_in_the_log(caplog):
    from types import SimpleNamespace

    from components.train import loop

    with caplog.at_level("WARNING"):
        loop._say_slow_teardown(SimpleNamespace(fit_ended=time.monotonic() - 2 * loop.SLOW_TEARDOWN_SECONDS))
        assert "fit returned 1" in caplog.text and "teardown" in caplog.text
        caplog.clear()
        loop._say_slow_teardown(SimpleNamespace(fit_ended=time.monotonic()))
        loop._say_slow_teardown(SimpleNamespace(fit_ended=None))  # no fit has ended yet: nothing to say
    assert caplog.text == ""
