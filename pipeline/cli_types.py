"""Argument types shared by the `detpipe` subcommands: each rejects bad values with a
message argparse prints as a usage error (exit 2)."""

import argparse


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 2, one line)."""

from beam.exif import EXIF_MODES


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


def _float_in(value: str, low: float, high: float, low_open: bool, what: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}") from None
    if not (low < number if low_open else low <= number) or not number <= high:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return number


def unit_float(value: str) -> float:
    """A number in [0, 1]."""
    return _float_in(value, 0.0, 1.0, False, "a number in [0, 1]")


def positive_float(value: str) -> float:
    return _float_in(value, 0.0, float("inf"), True, "a number > 0")


def non_negative_float(value: str) -> float:
    return _float_in(value, 0.0, float("inf"), False, "a number >= 0")


def add_exif_option(p) -> None:
    """--exif for `data build` and `run` (beam/exif.py)."""
    p.add_argument("--exif", choices=EXIF_MODES, default="auto",
                   help="photos with an EXIF orientation: 'auto' (default) writes them as displayed when the "
                        "annotated size is the displayed one, as stored when it is the stored one, and as "
                        "displayed when the sizes cannot tell (180-degree turns, flips, square images); "
                        "'apply' always as displayed (CVAT, Label Studio, Roboflow); 'ignore' always as "
                        "stored (LabelImg)")
