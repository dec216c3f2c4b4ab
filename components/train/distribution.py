"""Where training runs: one device, several GPUs of one machine, or several machines.

Vertex AI sets `TF_CONFIG` on every replica of a multi-pool custom job (pool 0 is the
`chief`, pool 1 the `worker`s). With more than one machine in it the trainer uses
`tf.distribute.MultiWorkerMirroredStrategy`: every step's gradients are all-reduced across
all machines, so every worker holds the same weights after every step.

Outputs (the TF multi-worker guide's pattern): every worker takes part in every save,
since saving may read synchronised variables through collectives, but only the chief
writes into the output folder; the others write into `OUTPUT/_scratch/worker-N`, which is
deleted when they finish. Every worker restores from the chief's checkpoints.

Faults across workers (loop.py): a NaN is seen by every worker at the same step (the loss
is all-reduced and the weights are the same), so all restore the same checkpoint in
lockstep. A SIGTERM on any worker is all-reduced into every step (`StopRequest`), so all
workers save at the same step and exit with code 143. Anything else that stops one worker
(SIGKILL, out of memory, a lost VM) makes the others' collectives fail (MultiWorkerMirrored-
Strategy checks its peers' health): every process exits non-zero, and the restarted job
resumes from the chief's last checkpoint on every worker.

Example:
    >>> role = cluster_role({"TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, '
    ...                      '"task": {"type": "worker", "index": 0}}'})
    >>> role.workers, role.is_chief, role.name
    (2, False, 'worker-0')
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import keras
import tensorflow as tf

SCRATCH_DIR = "_scratch"


@dataclass(frozen=True)
class ClusterRole:
    """This process's place in the training cluster."""

    workers: int = 1  # machines in the cluster
    task_type: str = "chief"  # as TF_CONFIG names it
    task_index: int = 0
    is_chief: bool = True
    index: int = 0  # 0 for the chief, then 1, 2, ... for the other workers

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.task_index}"

    def write_dir(self, output_dir: str) -> str:
        """Where this process writes: the output folder on the chief, a scratch folder on the others."""
        return output_dir if self.is_chief else f"{output_dir.rstrip('/')}/{SCRATCH_DIR}/{self.name}"

    def clean_up(self, output_dir: str) -> None:
        """Delete a non-chief's scratch folder (and the scratch root once it is empty)."""
        if self.is_chief:
            return
        scratch = self.write_dir(output_dir)
        if tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)
        root = f"{output_dir.rstrip('/')}/{SCRATCH_DIR}"
        if tf.io.gfile.isdir(root) and not tf.io.gfile.listdir(root):
            tf.io.gfile.rmtree(root)


_MACHINE_ROLES = ("chief", "master", "worker")  # "ps" and "evaluator" take no part in all-reduce


def cluster_role(environ=os.environ) -> ClusterRole:
    """The role `TF_CONFIG` gives this process; one machine without one."""
    raw = environ.get("TF_CONFIG", "")
    if not raw:
        return ClusterRole()
    config = json.loads(raw)
    cluster, task = config.get("cluster", {}), config.get("task", {})
    workers = sum(len(cluster.get(role, [])) for role in _MACHINE_ROLES)
    if workers <= 1:
        return ClusterRole()
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    has_chief = any(cluster.get(role) for role in ("chief", "master"))
    # The chief is the chief/master task, or worker 0 when the cluster names none (as TF does).
    is_chief = kind in ("chief", "master") or (kind == "worker" and index == 0 and not has_chief)
    position = 0 if kind in ("chief", "master") else index + (1 if has_chief else 0)
    return ClusterRole(workers=workers, task_type=kind, task_index=index, is_chief=is_chief, index=position)


_STRATEGIES: dict[str, tf.distribute.Strategy] = {}


def training_devices() -> list[str]:
    """The devices one machine trains on when it has several: its GPUs, or, on a machine
    without one, the logical CPU devices the process was given
    (`tf.config.set_logical_device_configuration`: how the tests run MirroredStrategy, and
    how a CPU host could be split); an empty list for one device."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus] if len(gpus) > 1 else []
    cpus = tf.config.list_logical_devices("CPU")
    return [d.name for d in cpus] if len(cpus) > 1 else []


def make_strategy(role: ClusterRole) -> tuple[tf.distribute.Strategy, str]:
    """The strategy for this cluster and how to describe it. Call before any other
    TensorFlow work: MultiWorkerMirroredStrategy must configure collectives first."""
    if role.workers > 1:
        # One per process: collectives are configured once (the tuner trains several times).
        if "multi_worker" not in _STRATEGIES:
            _STRATEGIES["multi_worker"] = tf.distribute.MultiWorkerMirroredStrategy()
        return _STRATEGIES["multi_worker"], f"MultiWorkerMirroredStrategy, {role.workers} workers"
    devices = training_devices()
    if devices:
        kind = "GPUs" if "GPU" in devices[0] else "logical CPU devices"
        return (tf.distribute.MirroredStrategy(devices),
                f"MirroredStrategy over {len(devices)} {kind}, the batch split evenly")
    return tf.distribute.get_strategy(), "one device"


def fit_across_workers(model: keras.Model) -> None:
    """Let Keras 3.15's `fit` run under MultiWorkerMirroredStrategy (tensorflow#72388):
    - its symbolic build reduces a (x, y) tuple of per-replica batches with
      `strategy.reduce`, which only takes one value: it is skipped, since the training loop
      builds the model from the dataset's element spec before every `fit` (build_for_fit:
      the shapes are all it needs);
    - it reduces every step's logs with `strategy.reduce("MEAN", v, axis=0)`, which fails
      on scalars: `vector_logs` gives each log a length-1 axis to reduce over."""
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def synchronise_batch_norm(model: keras.Model, on: bool = True) -> None:
    """Batch normalisation over the global batch (Keras' `synchronized=True`: the batch
    moments are all-reduced across every replica): without it each worker normalises with
    its own few images and keeps its own moving statistics, so the workers' models drift
    apart. Switched off again before the model is saved, so the saved model needs no
    strategy. (`_flatten_layers` is Keras' own walk over nested layers, the backbone's too.)"""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = on


def vector_logs(train_step):
    """A train step whose logs have shape [1] (see `fit_across_workers`)."""

    def step(data):
        return {name: tf.reshape(value, [1]) for name, value in train_step(data).items()}

    return step


def weights_digest(model: keras.Model) -> str:
    """sha256 of every weight's bytes, in order: equal on every worker after a synchronous step."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


def agreement(strategy: tf.distribute.Strategy, workers: int) -> Callable[[list[float]], list[float]]:
    """A function that averages numbers over every worker (each passes its own; each gets the same
    mean back), for decisions every worker must take alike (a time budget's epochs, the held-out
    curve's stop); on one machine the numbers as they are. Every worker must call it at the same point."""
    if workers <= 1:
        return lambda values: list(values)

    def agreed(values: list[float]) -> list[float]:
        local = tf.constant(values, tf.float32)
        mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(lambda: tf.identity(local)), axis=None)
        return [float(v) for v in mean.numpy()]

    return agreed
