"""Which mixed-precision policy a machine's GPUs support, decided in one place for the
trainer, the probe's recommendation and its memory check.

Example:
    >>> precision_for([8, 9])
    ('mixed_bfloat16', 'GPU compute capability 8.x supports bfloat16')
    >>> precision_for([])[0]
    'float32'
"""

from __future__ import annotations


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
