"""GPU facts: NVML (driver, the CUDA version it supports, per-GPU memory, ECC, throttling,
other processes), whether the CUDA/cuDNN libraries TensorFlow needs load, and a matmul
on the GPU checked against the CPU.

Each function returns plain data and never raises for a missing GPU or library, so the
checks can say what is wrong instead of the probe crashing.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
import time

logger = logging.getLogger(__name__)


def nvml_facts() -> dict:
    """Through `nvidia-ml-py` when it is installed and a driver answers; else `available: False`."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"available": False, "reason": f"NVML did not start: {err}"}
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12020
        facts = {
            "available": True,
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "driver_cuda_version": f"{cuda // 1000}.{(cuda % 1000) // 10}",
            "gpus": [],
        }
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpu = {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_total": int(memory.total),
                "memory_free": int(memory.free),
                "compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
                "ecc_uncorrected": _optional(lambda h=handle: int(pynvml.nvmlDeviceGetTotalEccErrors(
                    h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))),
                "throttle_reasons": _optional(lambda h=handle: int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))),
                "other_processes": _optional(lambda h=handle: [
                    {"pid": p.pid, "used_memory": int(p.usedGpuMemory or 0)}
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid != os.getpid()]),
            }
            facts["gpus"].append(gpu)
        return facts
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(read):
    try:
        return read()
    except Exception:  # not supported on this GPU / driver
        return None


# The libraries TF 2.16's CUDA build opens (sonames), in the order they are needed.
CUDA_LIBRARIES = ("libcuda.so.1", "libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12",
                  "libcufft.so.11", "libcusolver.so.11", "libcusparse.so.12", "libcudnn.so.8")


def _pip_cuda_dirs() -> list[str]:
    """Library folders of the `nvidia-*` wheels that `tensorflow[and-cuda]` installs."""
    return sorted({d for p in sys.path for d in glob.glob(os.path.join(p, "nvidia", "*", "lib"))})


def library_facts(libraries: tuple[str, ...] = CUDA_LIBRARIES) -> dict:
    """Try to load each library (system path, then the pip `nvidia-*` folders); name failures."""
    dirs = _pip_cuda_dirs()
    results = {}
    for name in libraries:
        error = None
        for candidate in (name, *(os.path.join(d, name) for d in dirs)):
            try:
                ctypes.CDLL(candidate)
                results[name] = {"loaded": True, "path": candidate}
                break
            except OSError as err:
                error = str(err)
        else:
            results[name] = {"loaded": False, "error": error}
    return {"searched": dirs, "libraries": results}


def matmul_facts(size: int = 4096, repeats: int = 10) -> dict:
    """A float32 matmul on the first GPU: agreement with the CPU and TFLOP/s."""
    import numpy as np
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return {"ran": False, "reason": "no GPU visible to TensorFlow"}
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((256, 256), dtype=np.float32)
        b = rng.standard_normal((256, 256), dtype=np.float32)
        with tf.device("/GPU:0"):
            gpu_small = tf.matmul(a, b).numpy()
        max_error = float(np.max(np.abs(gpu_small - a @ b)))
        with tf.device("/GPU:0"):
            x = tf.random.normal((size, size))
            y = tf.random.normal((size, size))
            tf.matmul(x, y).numpy()  # warm-up
            started = time.perf_counter()
            for _ in range(repeats):
                z = tf.matmul(x, y)
            z.numpy()
            seconds = time.perf_counter() - started
        return {"ran": True, "max_abs_error_vs_cpu": max_error,
                "tflops": round(2 * size**3 * repeats / seconds / 1e12, 2), "size": size}
    except Exception as err:  # a kernel that is missing or fails to launch
        return {"ran": False, "reason": f"{type(err).__name__}: {err}".splitlines()[0]}
