"""A job's start and its rate once running, from two runs of it on different numbers of
items (what a job over many more items sees): shared by the benchmark scripts."""

from __future__ import annotations


def start_and_rate(few: int, few_s: float, many: int, many_s: float) -> tuple[float, float]:
    """(seconds before the first item, items a second after it), assuming a fixed start and a
    steady rate: the line through (few, few_s) and (many, many_s).

    >>> start_and_rate(1000, 5.0, 5000, 13.0)
    (3.0, 500.0)
    """
    rate = (many - few) / (many_s - few_s)
    return many_s - many / rate, rate
