"""Collect facts about the machine training will run on.

Each collector is a small function with no side effects so that tests can stand in
other machines by passing other facts to the checks (components/probe/checks.py).
"""

from __future__ import annotations

import logging
import platform
import shutil
import sys
import time
from pathlib import Path

# Counted where every local Beam job counts them, at the bottom of the imports (beam/ imports no step).
from beam.data_workers import usable_cpus

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2


def memory(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> dict:
    """RAM total/available in bytes from /proc/meminfo, and any cgroup memory limit."""
    values = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, rest = line.split(":", 1)
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    limit = None
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < (1 << 60):
            limit = int(text)
        break
    return {"total": values.get("MemTotal"), "available": values.get("MemAvailable"), "cgroup_limit": limit}


def tensorflow_facts() -> dict:
    """TF version, what the build expects (CUDA, cuDNN, compute capabilities), GPUs TF sees."""
    import tensorflow as tf

    build = {k: (list(v) if isinstance(v, (list, tuple)) else v)
             for k, v in tf.sysconfig.get_build_info().items()}
    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append({"name": details.get("device_name", gpu.name),
                     "compute_capability": list(details.get("compute_capability") or [])})
    return {"version": tf.__version__, "build": build, "gpus": gpus}


def disk_facts(path: str) -> dict:
    """Free space where the outputs go (the nearest existing parent of `path`)."""
    target = Path(path).resolve()
    while not target.exists() and target != target.parent:
        target = target.parent
    usage = shutil.disk_usage(target)
    return {"path": str(target), "total": usage.total, "free": usage.free}


def collect(data_dir: str | None = None, output_dir: str = ".") -> dict:
    """Every fact, as the versioned JSON document `probe.json` holds.

    The library check runs on a CUDA build whenever TensorFlow sees a GPU or the NVIDIA
    driver answers: a driver that sees a GPU TensorFlow does not is the case it exists for
    (libraries that do not load). The matmul runs only on a GPU TensorFlow sees; the storage
    read test only when `data_dir` is given.
    """
    from components.detector.gpu_facts import library_facts, matmul_facts, nvml_facts
    from components.probe.package_drift import package_facts
    from components.probe.storage_speed import measure_read_speed

    started = time.perf_counter()
    tf_facts = tensorflow_facts()
    nvml = nvml_facts()
    facts = {
        "schema_version": SCHEMA_VERSION,
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "python": sys.version.split()[0],
        "cpu": {"model": _cpu_model(), **usable_cpus()},
        "memory": memory(),
        "disk": disk_facts(output_dir),
        "tensorflow": tf_facts,
        "nvml": nvml,
        "cuda_libraries": library_check_facts(tf_facts, nvml, library_facts),
        "matmul": matmul_facts() if tf_facts["gpus"] else {"ran": False, "reason": "no GPU visible to TensorFlow"},
        "packages": package_facts(),
        "storage": measure_read_speed(data_dir) if data_dir else {"measured": False, "reason": "no --data given"},
    }
    facts["probe_seconds"] = round(time.perf_counter() - started, 1)
    return facts


def library_check_facts(tf_facts: dict, nvml: dict, load_libraries) -> dict:
    """`load_libraries()` (gpu_facts.library_facts) when the check can tell something: a CUDA
    build of TensorFlow, and a GPU that TensorFlow sees or that the NVIDIA driver answers for.

    >>> library_check_facts({"build": {"is_cuda_build": True}, "gpus": []}, {"available": True}, lambda: {"libraries": {}})
    {'libraries': {}}
    >>> library_check_facts({"build": {"is_cuda_build": False}, "gpus": []}, {"available": True}, dict)["skipped"]
    'a CPU-only TensorFlow build opens no CUDA libraries'
    """
    if not tf_facts["build"].get("is_cuda_build"):
        return {"skipped": "a CPU-only TensorFlow build opens no CUDA libraries"}
    if not tf_facts["gpus"] and not nvml.get("available"):
        return {"skipped": "no GPU: TensorFlow sees none and no NVIDIA driver answered"}
    return load_libraries()


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
