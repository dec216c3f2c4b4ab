"""Argument types shared by the `detpipe` subcommands: each rejects bad values with a
message argparse prints as a usage error (exit 2)."""

import argparse


def positive_int(value: str, name: str = "value") -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {number}")
    return number


def batch_size_arg(value: str) -> str:
    """'auto' or a whole number >= 1, kept as a string (the pipeline parameter's type)."""
    if value == "auto":
        return value
    try:
        return str(positive_int(value, "--batch-size"))
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} (or 'auto')") from None


def fraction_arg(value: str) -> float:
    number = float(value)
    if not 0.0 <= number < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return number


def unit_float(value: str) -> float:
    """A number in [0, 1]."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return number
