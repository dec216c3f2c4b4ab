"""What the benchmarks that train per seed print under their tables."""

from __future__ import annotations


def per_seed_line(results: dict[int, dict[str, dict]], seeds: list[int], names: list[str]) -> str:
    """Each seed's test mAP of each training, on one line.

    >>> per_seed_line({0: {"a": {"metrics": {"mAP": 0.5}}}}, [0], ["a"])
    'per seed (test mAP): seed 0: a 0.500'
    """
    return "per seed (test mAP): " + "; ".join(
        f"seed {s}: " + ", ".join(f"{name} {results[s][name]['metrics']['mAP']:.3f}" for name in names) for s in seeds)
