"""Training over several devices (MirroredStrategy), as on a multi-GPU Vertex machine:
simulated with two logical CPUs in a fresh process, with an injected OOM on top."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from components.train import trainer
trainer.make_strategy = lambda role: (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), "test: 2 logical CPUs")
result = trainer.train_detector(trainer.TrainConfig(data_dir=sys.argv[1], output_dir=sys.argv[2], epochs=100,
                                                    batch_size=7, image_size=64, max_steps=6, checkpoint_every=2))
print("RESULT " + json.dumps(result.to_dict()))
"""


@pytest.mark.slow
def test_two_replicas_train_and_recover_from_oom_per_device(demo_shards, tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "DETPIPE_INJECT_FAULT": "oom@3"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(demo_shards), str(tmp_path / "m")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert result["batch_size"] == 6  # 7 rounded down to a multiple of the 2 replicas
    assert "a multiple of the 2 GPUs" in result["decisions"]["batch_size"]
    assert result["micro_batch_size"] == 1  # 3 per device, halved: 3 parts of 1
    assert "micro-batch 3 -> 1 images per GPU" in result["decisions"]["recoveries"]
    assert "effective batch at 6" in result["decisions"]["recoveries"]
    assert result["steps"] == 6 and result["final_loss"] > 0
