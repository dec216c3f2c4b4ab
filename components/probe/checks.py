"""Checks over collected machine facts: PASS / WARN / FAIL, each with a reason and a fix.

Checks are pure functions of the facts dict (components/probe/machine_facts.py), so a
test can stand in any machine: no GPU, an old driver, a GPU the build has no kernels
for, a missing cuDNN, little VRAM, a CPU quota, slow storage, drifted packages.

Example:
    >>> facts = {"tensorflow": {"gpus": [], "build": {}}, "cpu": {"usable": 2, "visible": 2},
    ...          "memory": {"total": 8 << 30, "available": 6 << 30, "cgroup_limit": None}}
    >>> check_gpu(facts, require_gpu=True).status
    'FAIL'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from beam.contract.label_map import num_class_slots, read_dataset_label_map
from components.detector.geometry import FIXED_SIZE
from components.detector.precision import is_mixed, precision_for
from components.train.config import TrainConfig, number_or_auto

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
_ORDER = {PASS: 0, WARN: 1, FAIL: 2}
MIN_RAM_BYTES = 4 << 30
MIN_DISK_BYTES = 5 << 30
MAX_MATMUL_ERROR = 1e-2  # float32 256x256, TF32 allowed
MIN_TFLOPS = 1.0  # any data-centre GPU of the last decade does far more in float32
DEFAULT_NUM_CLASSES = 3  # the memory estimate's class head when no data is given


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    reason: str
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Expectations:
    """What training will ask of the machine (from the pipeline's parameters)."""

    image_size: int = FIXED_SIZE
    model_size: str = TrainConfig.model_size
    batch_size: int | None = None  # None: auto
    images_per_second: float | None = None  # expected training rate, for the storage check
    rate_source: str = ""  # how images_per_second was obtained (probe_report measures it when data is given)
    input_images_per_second: float | None = None  # what the input pipeline makes on this host's CPUs
    input_source: str = ""  # how input_images_per_second was obtained (probe_report measures it when data is given)
    num_classes: int = DEFAULT_NUM_CLASSES  # the class head's size: from the data's label map when known
    model_config: object | None = None  # the fitted ModelConfig (input size, levels, anchors) when known
    shape: str = ""  # how the model's shape was chosen, for the report
    boxes_per_image: int = 1  # the densest sampled training image's boxes (the loss's anchor matching) when known

    def model(self):
        """The ModelConfig the memory estimate builds: the fitted one, else the model size's at image_size."""
        if self.model_config is not None:
            return self.model_config
        from components.detector.model import model_config_for

        return model_config_for(self.model_size, self.image_size, self.num_classes)

    @classmethod
    def from_train_options(cls, image_size: int | str, model_size: str, batch_size: str,
                           data_dir: str | None = None, on_gpu: bool | None = None,
                           tile: str = "none") -> "Expectations":
        """From the train step's options, where the batch size is a number or 'auto', and
        the classes of the shards in `data_dir` when given. With data, the model's shape is
        fitted to the train boxes as training will fit it (`image_size` a number or 'auto', in
        tiles as `tile` says); without, 'auto' stands for the fixed 128 px shape."""
        image_size, batch_size = number_or_auto(image_size, "image_size"), number_or_auto(batch_size, "batch_size")
        batch = None if batch_size == "auto" else batch_size
        if not data_dir:
            size = FIXED_SIZE if image_size == "auto" else image_size
            return cls(image_size=size, model_size=model_size, batch_size=batch,
                       shape=f"{size}px" + (" (auto without --data: the fixed shape)" if image_size == "auto" else ""))
        from components.detector.fitted_shape import gpu_visible, shape_for_data

        num_classes = num_class_slots(read_dataset_label_map(data_dir))
        fitted = shape_for_data(data_dir, model_size, num_classes, image_size,
                                gpu_visible() if on_gpu is None else on_gpu,
                                allow_poor_anchors=True, tile=tile)  # the probe reports; training refuses
        m = fitted.model
        return cls(image_size=m.image_size, model_size=model_size, num_classes=num_classes, batch_size=batch,
                   model_config=m, boxes_per_image=max(1, fitted.densest_image_boxes),
                   shape=f"{m.image_size}px, P{m.min_level}-P{m.max_level} ({fitted.decisions['image_size']})"
                   + (f"; {fitted.decisions['tiling']}" if m.tiled else ""))


def _version(text) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError:
        return ()


def check_gpu(facts: dict, require_gpu: bool) -> CheckResult:
    gpus = facts["tensorflow"]["gpus"]
    build = facts["tensorflow"]["build"]
    if gpus:
        names = ", ".join(f"{g['name']} (cc {'.'.join(map(str, g['compute_capability']))})" for g in gpus)
        return CheckResult("gpu", PASS, f"{len(gpus)} GPU(s) visible to TensorFlow: {names}")
    if not build.get("is_cuda_build"):
        reason = "no GPU visible: this TensorFlow is a CPU-only build"
        fix = "install the GPU build: `uv sync --frozen --extra gpu` (tensorflow[and-cuda])"
    elif facts.get("nvml", {}).get("available"):
        reason = "NVIDIA driver sees a GPU but TensorFlow does not"
        fix = "check CUDA_VISIBLE_DEVICES and the cuda_libraries check below; the CUDA libraries may not load"
    else:
        reason = "no GPU visible to TensorFlow (no NVIDIA driver answered)"
        fix = ("request an accelerator for this step (Vertex: --accelerator-type/--accelerator-count) and use "
               f"a machine image with an NVIDIA driver for CUDA {build.get('cuda_version', '12')}")
    return CheckResult("gpu", FAIL if require_gpu else WARN, reason, fix)


def check_driver(facts: dict) -> CheckResult | None:
    nvml, build = facts.get("nvml", {}), facts["tensorflow"]["build"]
    if not nvml.get("available") or not build.get("cuda_version"):
        return None
    have, need = nvml["driver_cuda_version"], build["cuda_version"]
    if _version(have) < _version(need):
        return CheckResult("driver", FAIL,
                           f"driver {nvml['driver_version']} supports CUDA {have}; TensorFlow was built for CUDA {need}",
                           f"upgrade the NVIDIA driver to one for CUDA >= {need} (or pick a newer machine image)")
    return CheckResult("driver", PASS, f"driver {nvml['driver_version']} supports CUDA {have} >= {need}")


def compute_capability_status(cc: tuple[int, int], compiled: list[str]) -> str:
    """PASS when the build has a cubin for this GPU (same major, minor <= the GPU's),
    WARN when only PTX it can JIT-compile from, FAIL when neither."""
    major, minor = cc
    for arch in compiled:
        kind, _, digits = arch.partition("_")
        if len(digits) < 2 or not digits.isdigit():
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return PASS
    if any(arch.startswith("compute_") and arch[8:].isdigit() and int(arch[8:-1]) * 10 + int(arch[-1]) <= major * 10 + minor
           for arch in compiled):
        return WARN
    return FAIL


def check_compute_capability(facts: dict) -> list[CheckResult]:
    compiled = facts["tensorflow"]["build"].get("cuda_compute_capabilities") or []
    results = []
    for gpu in facts["tensorflow"]["gpus"]:
        cc = tuple(gpu["compute_capability"][:2])
        if len(cc) != 2:
            continue
        status = compute_capability_status(cc, compiled)
        label = f"{gpu['name']} (cc {cc[0]}.{cc[1]})"
        reason = {PASS: f"{label}: TensorFlow has kernels for it ({', '.join(compiled)})",
                  WARN: f"{label}: no native kernels in this build ({', '.join(compiled)}); they are JIT-compiled "
                        "from PTX at start-up (minutes, every new container)",
                  FAIL: f"{label}: this build has no kernels for it ({', '.join(compiled)})"}[status]
        fix = "" if status == PASS else ("use a GPU type the build supports, or a TensorFlow build that lists this "
                                         "architecture; for JIT, keep a persistent cache (CUDA_CACHE_MAXSIZE)")
        results.append(CheckResult("compute_capability", status, reason, fix))
    return results


# What installs the libraries TF 2.16's CUDA build opens: CUDA 12.3 and cuDNN 8.9, as the
# `nvidia-*` wheels of `tensorflow[and-cuda]==2.16.2` (the project's `gpu` extra) bring them.
CUDA_LIBRARY_FIX = ("install the GPU extra (`uv sync --frozen --extra gpu`, i.e. tensorflow[and-cuda]==2.16.2: CUDA "
                    "12.3 and cuDNN 8.9 as nvidia-* wheels) or use the project image; or put CUDA 12.x and cuDNN 8.9 "
                    "on LD_LIBRARY_PATH. A newer system CUDA (13.x) does not provide these sonames")


def check_cuda_libraries(facts: dict) -> CheckResult | None:
    """Each library TensorFlow's CUDA build opens that does not load, by name, with where
    it was looked for; the driver's libcuda comes with the driver, the rest with the fix."""
    libraries_facts = facts.get("cuda_libraries", {})
    libs = libraries_facts.get("libraries")
    if not libs:
        return None
    failed = [name for name, info in libs.items() if not info["loaded"]]
    if not failed:
        return CheckResult("cuda_libraries", PASS, f"{len(libs)} CUDA/cuDNN libraries load")
    searched = libraries_facts.get("searched") or []
    where = ("the system library path (ld.so.cache, LD_LIBRARY_PATH) and " + ", ".join(searched) if searched
             else "the system library path (ld.so.cache, LD_LIBRARY_PATH); no nvidia-* wheel folders are installed")
    loaded = [name for name in libs if name not in failed]
    reason = (f"{len(failed)} of {len(libs)} libraries TensorFlow opens do not load: {', '.join(failed)} "
              f"(looked in {where}; first error: {libs[failed[0]].get('error', '')})"
              + (f"; these load: {', '.join(loaded)}" if loaded else ""))
    fix = CUDA_LIBRARY_FIX
    if "libcuda.so.1" in failed:
        fix = "install the NVIDIA driver (libcuda.so.1 comes with it), then: " + fix
    return CheckResult("cuda_libraries", FAIL, reason, fix)


def check_matmul(facts: dict) -> CheckResult | None:
    matmul = facts.get("matmul", {})
    if not facts["tensorflow"]["gpus"]:
        return None
    if not matmul.get("ran"):
        return CheckResult("gpu_matmul", FAIL, f"a matmul on the GPU failed: {matmul.get('reason')}",
                           "see the driver, compute_capability and cuda_libraries checks")
    if matmul["max_abs_error_vs_cpu"] > MAX_MATMUL_ERROR:
        return CheckResult("gpu_matmul", FAIL,
                           f"GPU matmul differs from the CPU by {matmul['max_abs_error_vs_cpu']:.3g}",
                           "the GPU or its driver computes wrong results: replace the machine")
    if matmul["tflops"] < MIN_TFLOPS:
        return CheckResult("gpu_matmul", WARN, f"GPU matmul reaches only {matmul['tflops']} TFLOP/s",
                           "check throttling (nvml throttle reasons) and other processes on the GPU")
    return CheckResult("gpu_matmul", PASS, f"GPU matmul agrees with the CPU, {matmul['tflops']} TFLOP/s float32")


def check_gpu_memory(facts: dict, expect: Expectations) -> tuple[CheckResult | None, int | None]:
    """The GPU memory check and the largest safe batch (None without a GPU)."""
    from components.detector.memory_estimate import bytes_per_image, largest_safe_batch

    nvml_gpus = facts.get("nvml", {}).get("gpus") or []
    if not facts["tensorflow"]["gpus"] or not nvml_gpus:
        return None, None
    free = min(g["memory_free"] for g in nvml_gpus)
    mixed = is_mixed(precision_for([g["compute_capability"][0] for g in facts["tensorflow"]["gpus"]])[0])
    safe = largest_safe_batch(free, expect.model(), mixed, expect.boxes_per_image)
    need = bytes_per_image(expect.model(), mixed, expect.boxes_per_image)
    label = (f"{free / (1 << 30):.1f} GiB free GPU memory; about {need / (1 << 20):.0f} MiB an image at "
             f"{expect.image_size}px" + (f" with {expect.boxes_per_image} boxes" if expect.boxes_per_image > 1 else ""))
    if safe < 1:
        return CheckResult("gpu_memory", FAIL, f"{label}: not even one image fits",
                           "lower --image-size or --model-size, or use a GPU with more memory"), 0
    if expect.batch_size and expect.batch_size > safe:
        return CheckResult("gpu_memory", FAIL, f"{label}: batch {expect.batch_size} needs more; largest safe batch ~{safe}",
                           f"use --batch-size auto or <= {safe}"), safe
    others = [p for g in nvml_gpus for p in (g.get("other_processes") or [])]
    if others:
        return CheckResult("gpu_memory", WARN, f"{label}; {len(others)} other process(es) hold GPU memory",
                           "stop the other processes or use a dedicated machine"), safe
    return CheckResult("gpu_memory", PASS, f"{label}; largest safe batch ~{safe}"), safe


def check_cpus(facts: dict) -> CheckResult:
    cpu = facts["cpu"]
    if cpu["usable"] < cpu["visible"]:
        return CheckResult(
            "cpus", WARN,
            f"{cpu['usable']} usable CPUs of {cpu['visible']} visible (affinity/cgroup quota)",
            f"size input-pipeline parallelism to {cpu['usable']}, not os.cpu_count(); detpipe does")
    return CheckResult("cpus", PASS, f"{cpu['usable']} usable CPUs")


def check_memory(facts: dict) -> CheckResult:
    mem = facts["memory"]
    total = mem.get("cgroup_limit") or mem.get("total") or 0
    gib = total / (1 << 30)
    if total and total < MIN_RAM_BYTES:
        return CheckResult("ram", WARN, f"{gib:.1f} GiB RAM usable, under {MIN_RAM_BYTES >> 30} GiB",
                           "use a machine type with more memory or a smaller shuffle buffer")
    return CheckResult("ram", PASS, f"{gib:.1f} GiB RAM usable")


def check_disk(facts: dict) -> CheckResult | None:
    disk = facts.get("disk")
    if not disk:
        return None
    if disk["free"] < MIN_DISK_BYTES:
        return CheckResult("disk", WARN, f"{disk['free'] / (1 << 30):.1f} GiB free at {disk['path']}",
                           "free space or write outputs (checkpoints, model) to a larger disk or gs://")
    return CheckResult("disk", PASS, f"{disk['free'] / (1 << 30):.0f} GiB free at {disk['path']}")


def check_packages(facts: dict) -> CheckResult:
    packages = facts.get("packages", {})
    if not packages.get("lock_file"):
        return CheckResult("packages", WARN, "uv.lock not found: package drift not checked",
                           "set DETPIPE_LOCK_FILE to the project's uv.lock")
    drifted, missing = packages.get("drifted", []), packages.get("missing", [])
    if drifted or missing:
        parts = [f"{d['name']} (locked {d['locked']}, installed {d['installed']})" for d in drifted]
        parts += [f"{name} (locked, not installed)" for name in missing]
        return CheckResult("packages", WARN, f"{len(parts)} package(s) differ from uv.lock: {'; '.join(parts)}",
                           "rebuild the environment from the lock: `uv sync --frozen` (or the project image)")
    return CheckResult("packages", PASS, f"installed packages match {packages['lock_file']}")


def _training_rate(facts: dict, expect: Expectations) -> tuple[float, str]:
    if expect.images_per_second:
        return expect.images_per_second, expect.rate_source or "given"
    return (400.0 if facts["tensorflow"]["gpus"] else 40.0), "assumed for this kind of device; not measured"


def check_input(facts: dict, expect: Expectations) -> CheckResult | None:
    """Whether this host's CPUs make batches as fast as the model trains on them: else the
    accelerator waits for input, whatever its speed."""
    if not expect.input_images_per_second:
        return None
    made, (taken, source) = expect.input_images_per_second, _training_rate(facts, expect)
    cpus = facts.get("cpu", {}).get("usable") or 1
    reason = (f"the input pipeline makes {made:.1f} images/s here ({made / cpus:.1f} per usable CPU; "
              f"{expect.input_source or 'given'}); training takes {taken:.1f} images/s ({source})")
    if made < taken:
        return CheckResult("input", WARN, f"{reason}: the accelerator would wait for input about "
                                          f"{1 - made / taken:.0%} of the time",
                           "a machine type with more vCPUs per accelerator (the input pipeline scales with "
                           "usable CPUs), a smaller --image-size, or smaller stored photos")
    return CheckResult("input", PASS, reason)


def check_storage(facts: dict, expect: Expectations) -> CheckResult | None:
    from components.probe.storage_speed import needed_mb_per_s

    storage = facts.get("storage", {})
    if not storage.get("measured"):
        return None
    rate, source = _training_rate(facts, expect)
    if expect.input_images_per_second and expect.input_images_per_second < rate:
        # Training reads no faster than the input pipeline decodes: storage need not be faster either.
        rate, source = expect.input_images_per_second, (f"what the input pipeline makes here, below training's "
                                                        f"{rate:.1f} ({expect.input_source or 'given'})")
    need = needed_mb_per_s(rate, storage["mean_record_bytes"])
    got = f"{storage['mb_per_s']} MB/s, {storage['records_per_s']} records/s"
    training = f"training at {rate:.1f} images/s needs {need:.1f} MB/s; that rate is {source}"
    if storage["mb_per_s"] < need:
        return CheckResult("storage", WARN, f"shards read at {got}; {training}",
                           "copy the shards to local SSD, use larger shards, or enable the input cache")
    return CheckResult("storage", PASS, f"shards read at {got} ({training})")


def run_checks(facts: dict, require_gpu: bool = False, expect: Expectations = Expectations()) -> list[CheckResult]:
    results = [check_gpu(facts, require_gpu), check_driver(facts), *check_compute_capability(facts),
               check_cuda_libraries(facts), check_matmul(facts), check_gpu_memory(facts, expect)[0],
               check_cpus(facts), check_memory(facts), check_disk(facts), check_packages(facts),
               check_input(facts, expect), check_storage(facts, expect)]
    return [r for r in results if r is not None]


def verdict(results: list[CheckResult]) -> str:
    """The worst status of all checks."""
    return max((r.status for r in results), key=_ORDER.__getitem__, default=PASS)
