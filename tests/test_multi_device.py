"""Training over several devices of one machine (MirroredStrategy), as on a multi-GPU Vertex
machine: two logical CPU devices in a fresh process, which the trainer's own strategy
choice takes (distribution.training_devices); a SIGTERM, a resume, an injected OOM per
device, and the export."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import json, os, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from components.export.saved_model import export_trained
from components.train.loop import Preempted
from components.train.trainer import TrainConfig, train_detector
config = TrainConfig(data_dir=sys.argv[1], output_dir=sys.argv[2], epochs=100, batch_size=7, image_size=64,
                     max_steps=6, checkpoint_every=2)
os.environ["DETPIPE_INJECT_FAULT"] = "term@3"
try:
    train_detector(config)
except Preempted as stopped:
    print("PREEMPTED", stopped.step)
os.environ["DETPIPE_INJECT_FAULT"] = "oom@5"
result = train_detector(config)
export_trained(sys.argv[2], sys.argv[2] + "/saved_model")
print("RESULT " + json.dumps(result.to_dict()))
"""


@pytest.mark.slow
def test_two_devices_split_the_batch_resume_recover_from_oom_per_device_and_export(demo_shards, tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = tmp_path / "m"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(demo_shards), str(out)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "PREEMPTED 3" in run.stdout
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    decisions = result["decisions"]
    assert decisions["devices"] == "MirroredStrategy over 2 logical CPU devices, the batch split evenly, global batch 6"
    assert result["batch_size"] == 6  # 7 rounded down to a multiple of the 2 replicas
    assert "a multiple of the 2 GPUs" in decisions["batch_size"]
    assert "resumed after step 3" in decisions["checkpoints"]
    assert result["micro_batch_size"] == 1  # 3 per device, halved: 3 parts of 1
    assert "out of memory at step 5: micro-batch 3 -> 1 images per GPU" in decisions["recoveries"]
    assert "effective batch at 6" in decisions["recoveries"] and "after step 4" in decisions["recoveries"]
    assert result["steps"] == 6 and result["final_loss"] > 0
    assert (out / "saved_model" / "saved_model.pb").is_file()
    assert json.loads((out / "train_config.json").read_text())["result"]["batch_size"] == 6
