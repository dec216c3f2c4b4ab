"""Compare two probe results fact by fact: "baseline: X · here: Y".

Example:
    >>> compare_facts({"a": {"b": 1}, "c": [1]}, {"a": {"b": 2}, "c": [1]})
    [('a.b', '1', '2')]
"""

from __future__ import annotations

# Measurements that differ on every run are not differences between machines.
_VOLATILE = ("memory.available", "disk.free", "storage.", "matmul.", "packages.installed_count",
             "probe_seconds", "nvml.gpus.*.memory_free")


def flatten(value, prefix: str = "") -> dict[str, str]:
    """Nested dicts and lists → {"dotted.path": "value"}."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: str(value)}
    flat = {}
    for key, child in items:
        flat.update(flatten(child, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _volatile(path: str) -> bool:
    generic = ".".join("*" if part.isdigit() else part for part in path.split("."))
    return any(generic.startswith(v) or generic == v for v in _VOLATILE)


def compare_facts(baseline: dict, here: dict) -> list[tuple[str, str, str]]:
    """(path, baseline value, value here) for every fact that differs; absent is '-'."""
    a, b = flatten(baseline), flatten(here)
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not _volatile(k)]


def difference_lines(differences: list[tuple[str, str, str]]) -> list[str]:
    return [f"{path}: baseline: {old} · here: {new}" for path, old, new in differences]
