"""Two real `detpipe train` processes on 127.0.0.1 with TF_CONFIG, as Vertex starts the
replicas of a multi-pool custom job: MultiWorkerMirroredStrategy on CPU, a tiny model."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _start_cluster(data, out, logs, max_steps: int, export: bool = False, extra: tuple = (),
                   epochs: int = 100) -> list[subprocess.Popen]:
    chief, worker = (f"127.0.0.1:{p}" for p in _free_ports(2))
    cluster = {"chief": [chief], "worker": [worker]}
    command = [sys.executable, "-m", "pipeline.cli", "train", "--data", str(data), "--output", str(out),
               "--batch-size", "4", "--image-size", "64", "--epochs", str(epochs), "--max-steps", str(max_steps),
               "--checkpoint-every", "4", "--seed", "3", *extra] + ([] if export else ["--no-export"])
    procs = []
    for task in ({"type": "chief", "index": 0}, {"type": "worker", "index": 0}):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
        log = open(logs / f"{task['type']}.log", "w")
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs, timeout=300) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _digest(log_path) -> str:
    found = re.findall(r"final weights sha256 ([0-9a-f]{64})", log_path.read_text())
    assert found, log_path.read_text()[-3000:]
    return found[-1]


@pytest.fixture(scope="module")
def two_worker_run(demo_shards, tmp_path_factory):
    logs = tmp_path_factory.mktemp("two_workers")
    out = logs / "out"
    # Every default, export included, as a two-replica custom job runs it on the default
    # accelerator (T4s: mixed_float16, forced here; the LossScaleOptimizer all-reduces its
    # gradients' finiteness across the workers); the default length too (a time budget: each
    # worker measures the rate, and the epochs, the held-out scores and the stop are agreed).
    probe = logs / "probe.json"  # the probe's measured rate, as the pipeline's train step gets it
    probe.write_text(json.dumps({"recommendations": {"images_per_second": 40.0}}))
    codes = _wait(_start_cluster(demo_shards, out, logs, max_steps=8, export=True, epochs=0,
                                 extra=("--precision", "mixed_float16", "--probe", str(probe))))
    return out, logs, codes


@pytest.mark.slow
def test_two_workers_train_in_lockstep_and_only_the_chief_writes(two_worker_run):
    out, logs, codes = two_worker_run
    assert codes == [0, 0], (logs / "chief.log").read_text()[-3000:] + (logs / "worker.log").read_text()[-3000:]
    assert (out / "saved_model" / "saved_model.pb").is_file() and "exported a SavedModel" in (logs / "chief.log").read_text()
    assert "the chief writes the model and exports it" in (logs / "worker.log").read_text()
    assert _digest(logs / "chief.log") == _digest(logs / "worker.log")  # the same weights on both
    names = {p.name for p in out.iterdir()}
    assert {"model.keras", "train_report.md", "train_config.json", "checkpoints", "tensorboard"} <= names
    assert "_scratch" not in names  # the worker's own saves are gone
    report = (out / "train_report.md").read_text()
    assert "MultiWorkerMirroredStrategy, 2 workers, global batch 8" in report
    # The budgeted length and the held-out curve, agreed: both workers scored the same points alike.
    history = json.loads((out / "history.json").read_text())
    assert [v for v in history["held_out_mAP"] if v is not None] and history["stopped"]["reason"]
    scores = [re.findall(r"held-out mAP ([0-9.]+) at step (\d+)", (logs / f"{role}.log").read_text())
              for role in ("chief", "worker")]
    assert scores[0] and scores[0] == scores[1]
    assert "mixed_float16: given with --precision" in report
    config = json.loads((out / "train_config.json").read_text())
    assert config["result"]["batch_size"] == 8 and config["result"]["steps"] == 8
    assert config["result"]["weights_sha256"] == _digest(logs / "chief.log")
    # The saved model needs no strategy: batch normalisation is saved unsynchronised.
    assert '"synchronized": true' not in json.dumps(json.loads(_model_config(out / "model.keras")))


def _model_config(path) -> str:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.read("config.json").decode()


@pytest.mark.slow
def test_a_killed_worker_stops_the_chief_and_both_resume_from_the_checkpoint(demo_shards, two_worker_run, tmp_path):
    """From a warm start (the two-worker run's model), as a scheduled retrain on a custom job:
    the resumed run continues its own checkpoint, not the model it started from."""
    out, logs = tmp_path / "out", tmp_path
    warm = ("--init-from", str(two_worker_run[0]))
    chief, worker = _start_cluster(demo_shards, out, logs, max_steps=24, extra=warm)
    state = out / "checkpoints" / "checkpoint"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and chief.poll() is None:
        text = state.read_text() if state.exists() else ""
        if re.search(r'^model_checkpoint_path: "ckpt-[1-9]\d*"', text, re.M):
            break
        time.sleep(0.05)
    assert chief.poll() is None, "training ended before the worker could be killed"
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    chief_code = _wait([chief], timeout=180)[0]  # it must not hang on the lost peer
    assert chief_code != 0
    assert "a worker of the cluster is gone" in (logs / "chief.log").read_text()
    assert not (out / "model.keras").exists()
    for name in ("chief.log", "worker.log"):  # each replica loaded the same starting weights
        assert f"train: starts from {two_worker_run[0]}: the same tiny" in (logs / name).read_text(), name

    rerun = tmp_path / "rerun"
    rerun.mkdir()
    codes = _wait(_start_cluster(demo_shards, out, rerun, max_steps=24, extra=warm))
    assert codes == [0, 0], (rerun / "chief.log").read_text()[-3000:]
    for name in ("chief.log", "worker.log"):
        resumed = re.search(r"resuming from checkpoint \S+: (\d+) step\(s\) already done", (rerun / name).read_text())
        assert resumed and int(resumed.group(1)) >= 4, name
    assert _digest(rerun / "chief.log") == _digest(rerun / "worker.log")
    config = json.loads((out / "train_config.json").read_text())
    assert "resumed after step" in config["result"]["decisions"]["checkpoints"] and config["result"]["steps"] == 24
    assert config["result"]["warm_start"]["used"]
    assert "resumed from this run's own checkpoint" in config["result"]["decisions"]["warm_start"]
