"""Which mixed-precision policy and whether XLA: decided in one place for the trainer, the
tuner, the probe's recommendation, its memory check and its dry run.

`--precision auto` takes the rule for the machine's GPUs (the oldest decides); a policy
given by name is used as it is, with a warning in its reason when the machine runs it
slowly (mixed policies on a CPU, which emulates float16 and bfloat16: useful to run the GPU
path before paying for a GPU, not to train). `--xla auto` compiles the train step with XLA
on one GPU (what Keras' own `jit_compile="auto"` picks there) and leaves it off on a CPU and
under tf.distribute (where Keras leaves it off too).

Example:
    >>> precision_for([8, 9])
    ('mixed_bfloat16', 'GPU compute capability 8.x supports bfloat16')
    >>> precision_for([])[0]
    'float32'
    >>> choose_precision("mixed_float16", None, ())[0], choose_xla("auto", (7,), replicas=1)[0]
    ('mixed_float16', True)
"""

from __future__ import annotations

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
XLA_MODES = ("auto", "on", "off")


def precision_for(compute_capability_majors: list[int]) -> tuple[str, str]:
    """The Keras policy for these GPUs (the oldest decides) and the reason."""
    if not compute_capability_majors:
        return "float32", "no GPU: float32"
    major = min(compute_capability_majors)
    if major >= 8:
        return "mixed_bfloat16", f"GPU compute capability {major}.x supports bfloat16"
    if major >= 7:
        return "mixed_float16", f"GPU compute capability {major}.x: float16 with loss scaling"
    return "float32", f"GPU compute capability {major}.x is too old for fast mixed precision"


def is_mixed(policy: str) -> bool:
    return policy.startswith("mixed_")


def choose_precision(requested: str, advised: str | None, gpu_majors: tuple[int, ...]) -> tuple[str, str]:
    """The policy a run uses and why: `requested` (--precision) when it names one, else the
    probe's advice on a GPU machine, else the rule for these GPUs.

    >>> choose_precision("auto", None, (7, 7))
    ('mixed_float16', 'auto: GPU compute capability 7.x: float16 with loss scaling')
    >>> choose_precision("mixed_bfloat16", None, ())[1].split(";")[0]
    'given with --precision'
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested != "auto":
        reason = "given with --precision"
        if is_mixed(requested) and not gpu_majors:
            reason += ("; WARNING: no GPU here, and a CPU emulates float16 and bfloat16 slowly: this runs the GPU "
                       "path's code, it does not train fast")
        elif requested == "mixed_bfloat16" and gpu_majors and min(gpu_majors) < 8:
            reason += f"; WARNING: compute capability {min(gpu_majors)}.x has no fast bfloat16"
        return requested, reason
    if advised and gpu_majors:
        return advised, "auto: as the probe measured on this machine"
    policy, reason = precision_for(list(gpu_majors))
    return policy, f"auto: {reason}"


def choose_xla(requested: str, gpu_majors: tuple[int, ...], replicas: int,
               deterministic: bool = False) -> tuple[bool, str]:
    """Whether the train step is compiled with XLA, and why. Never with `--deterministic`:
    XLA has no deterministic max-pool gradient ("GPU MaxPool gradient ops do not yet have a
    deterministic XLA implementation", on a CPU too), so `--xla on` with it is refused.

    >>> choose_xla("auto", (), replicas=1)
    (False, 'off (auto): no GPU; XLA on a CPU spends its compile time for little gain')
    >>> choose_xla("auto", (8, 8), replicas=2)[0], choose_xla("on", (), replicas=1)[0]
    (False, True)
    >>> choose_xla("auto", (7,), replicas=1, deterministic=True)[0]
    False
    """
    if requested not in XLA_MODES:
        raise ValueError(f"xla must be one of {', '.join(XLA_MODES)}, got {requested!r}")
    if deterministic:
        if requested == "on":
            raise ValueError("--xla on cannot train --deterministic: XLA has no deterministic max-pool gradient; "
                             "use --xla off (or auto) with --deterministic")
        return False, f"off ({requested}): --deterministic, and XLA has no deterministic max-pool gradient"
    if requested == "on":
        return True, "on: given with --xla" + ("" if gpu_majors else "; no GPU here: it compiles, it does not speed up")
    if requested == "off":
        return False, "off: given with --xla"
    if not gpu_majors:
        return False, "off (auto): no GPU; XLA on a CPU spends its compile time for little gain"
    if replicas > 1:
        return False, (f"off (auto): {replicas} replicas under tf.distribute, where Keras leaves XLA off too; "
                       "--xla on compiles each replica's step")
    return True, "on (auto): one GPU, where XLA fuses the train step's ops (as Keras' jit_compile='auto' does)"
