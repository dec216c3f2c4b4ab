"""Checks over collected machine facts: PASS / WARN / FAIL, each with a reason and a fix.

Checks are pure functions of the facts dict, so any machine can be simulated in a test.

Example:
    >>> facts = {"tensorflow": {"gpus": [], "build": {}}, "cpu": {"usable": 2, "visible": 2},
    ...          "memory": {"total": 8 << 30, "available": 6 << 30, "cgroup_limit": None}}
    >>> [c.status for c in run_checks(facts, require_gpu=True)][0]
    'FAIL'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
_ORDER = {PASS: 0, WARN: 1, FAIL: 2}
MIN_RAM_BYTES = 4 << 30


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    reason: str
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def check_gpu(facts: dict, require_gpu: bool) -> CheckResult:
    gpus = facts["tensorflow"]["gpus"]
    build = facts["tensorflow"]["build"]
    if gpus:
        names = ", ".join(f"{g['name']} (cc {'.'.join(map(str, g['compute_capability']))})" for g in gpus)
        return CheckResult("gpu", PASS, f"{len(gpus)} GPU(s) visible to TensorFlow: {names}")
    cuda = build.get("cuda_version")
    if not build.get("is_cuda_build"):
        fix = "install the GPU build: `uv sync --frozen --extra gpu` (tensorflow[and-cuda])"
        reason = "no GPU visible: this TensorFlow is a CPU-only build"
    else:
        fix = (f"check `nvidia-smi` works, the driver supports CUDA {cuda}, and the job requests an "
               "accelerator (Vertex: --accelerator-type/--accelerator-count)")
        reason = "no GPU visible to TensorFlow"
    return CheckResult("gpu", FAIL if require_gpu else WARN, reason, fix)


def check_cpus(facts: dict) -> CheckResult:
    cpu = facts["cpu"]
    if cpu["usable"] < cpu["visible"]:
        return CheckResult(
            "cpus", WARN,
            f"{cpu['usable']} usable CPUs of {cpu['visible']} visible (affinity/cgroup quota)",
            "size input-pipeline parallelism to the usable CPUs, not os.cpu_count()")
    return CheckResult("cpus", PASS, f"{cpu['usable']} usable CPUs")


def check_memory(facts: dict) -> CheckResult:
    mem = facts["memory"]
    total = mem.get("cgroup_limit") or mem.get("total") or 0
    gib = total / (1 << 30)
    if total and total < MIN_RAM_BYTES:
        return CheckResult("ram", WARN, f"{gib:.1f} GiB RAM usable, under {MIN_RAM_BYTES >> 30} GiB",
                           "use a machine type with more memory or a smaller shuffle buffer")
    return CheckResult("ram", PASS, f"{gib:.1f} GiB RAM usable")


def run_checks(facts: dict, require_gpu: bool = False) -> list[CheckResult]:
    return [check_gpu(facts, require_gpu), check_cpus(facts), check_memory(facts)]


def verdict(results: list[CheckResult]) -> str:
    """The worst status of all checks."""
    return max((r.status for r in results), key=_ORDER.__getitem__, default=PASS)
