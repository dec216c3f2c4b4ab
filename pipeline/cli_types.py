"""Argument types shared by the `detpipe` subcommands: each rejects bad values with a
message argparse prints as a usage error (exit 2). They only look at strings and the local
file system, so the cheap checks run before TensorFlow or Beam are imported."""

import argparse
import os
import re

from pipeline import preflight
from pipeline.template_registry import REPO_PATTERN


# The exit codes every command uses (docs/troubleshooting.md lists them with interrupted's 130 and
# SIGTERM's 143): success, a check that found a problem, a command line that cannot be run as asked.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CheckFailed(Exception):
    """A step ran and found a problem; each line of the message is one problem."""


def fail_lines(lines: list[str]) -> CheckFailed:
    return CheckFailed("\n".join(lines))


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 2, one line)."""


def _int_at_least(value: str, least: int, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be a whole number >= {least}, got {value!r}") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"{name} must be a whole number >= {least}, got {number}")
    return number


def positive_int(value: str, name: str = "value") -> int:
    return _int_at_least(value, 1, name)


def review_folds(value: str) -> int:
    """`detpipe review --review-folds`: 0 (the val split only) or K >= 2 folds of the train split."""
    folds = _int_at_least(value, 0, "--review-folds")
    if folds == 1:
        raise argparse.ArgumentTypeError("--review-folds must be 0 (the val split only) or at least 2: one fold "
                                         "leaves no other fold to train on")
    return folds


def _auto_or_int(value: str, least: int, name: str) -> str:
    """'auto' or a whole number >= `least`, kept as a string (the pipeline parameter's type)."""
    if value == "auto":
        return value
    try:
        return str(_int_at_least(value, least, name))
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} (or 'auto')") from None


def batch_size_arg(value: str) -> str:
    """'auto' or a whole number >= 1."""
    return _auto_or_int(value, 1, "--batch-size")


def patience_arg(value: str) -> str:
    """'auto' or a whole number >= 0."""
    return _auto_or_int(value, 0, "--patience")


def time_budget_arg(value: str) -> str:
    """'auto' or a duration: 90s, 20m, 1.5h, or seconds."""
    from components.train.time_budget import check_budget

    try:
        return check_budget(value.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("time_budget", "--time-budget")) from None


def tune_trials_arg(value: str) -> str:
    """'auto' or a whole number >= 0."""
    return _auto_or_int(value, 0, "--tune-trials")


def open_fraction(value: str) -> float:
    """A number in (0, 1)."""
    return _float_in(value, 0.0, 1.0, True, "a number between 0 and 1 (both excluded)", high_open=True)


def warm_start_arg(value: str) -> str:
    """auto, never or a registry version (v3)."""
    from components.model_registry.warm_source import check_request

    try:
        return check_request(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def image_size_arg(value: str) -> str:
    """'auto' or a whole number of pixels >= 32."""
    return _auto_or_int(value, 32, "--image-size")


def export_formats_arg(value: str) -> str:
    """saved_model,tflite,... (file_formats.parse_formats), kept as a string (the pipeline parameter's type)."""
    from components.export.file_formats import parse_formats

    try:
        return ",".join(parse_formats(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def tile_arg(value: str) -> str:
    """auto, none or SIZE[:OVERLAP] (tile_choice.parse_tile), kept as a string (the pipeline parameter's type)."""
    from components.detector.tile_choice import parse_tile

    try:
        parse_tile(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


class DetpipeHelpFormatter(argparse.HelpFormatter):
    """argparse's help, with a switch shown as `--ema [true|false], --no-ema` (params.Switch)."""

    def _format_action_invocation(self, action):
        negated = getattr(action, "negated", None)
        if negated:
            shown = [o for o in action.option_strings if o not in negated]
            return ", ".join([f"{o} [{action.metavar}]" for o in shown] + negated)
        return super()._format_action_invocation(action)


class DetpipeParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the command, the problem, where help is), and
    a guess for a mistyped command or option (Python 3.11's argparse makes none), pointing at
    the help of the subcommand that was run."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DetpipeHelpFormatter)  # subcommands' parsers too
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        import sys

        self._given = list(sys.argv[1:] if args is None else args)  # for `error`'s guesses
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        parser, guess = self._guess(message)
        self.exit(2, f"{parser.prog}: error: {message}{guess} (see `{parser.prog} --help`)\n")

    def _command(self) -> "DetpipeParser":
        """The (sub)command the given arguments run: this parser, or the subparser they name."""
        parser, tokens = self, getattr(self, "_given", [])
        while parser._subparsers is not None:
            choices = next(a.choices for a in parser._subparsers._group_actions if a.choices)
            chosen = next((t for t in tokens if t in choices), None)
            if chosen is None:
                break
            tokens = tokens[tokens.index(chosen) + 1:]
            parser, parser._given = choices[chosen], tokens
        return parser

    def _guess(self, message: str) -> tuple["DetpipeParser", str]:
        """The parser to point at, and " (did you mean X?)" for a close command or option name."""
        import difflib

        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if wrong:
            close = difflib.get_close_matches(wrong.group(1), re.findall(r"'([^']*)'", wrong.group(2)), n=1)
            return self, f" (did you mean {close[0]}?)" if close else ""
        parser = self._command()
        known = [option for action in parser._actions for option in action.option_strings]
        for token in getattr(parser, "_given", []):
            name = token.split("=", 1)[0]
            if name.startswith("--") and name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                if close:
                    return parser, f" ({name}: did you mean {close[0]}?)"
        return parser, ""


def fraction_arg(value: str) -> float:
    """A number in [0, 1)."""
    return _float_in(value, 0.0, 1.0, False, "a number in [0, 1)", high_open=True)


def non_negative_int(value: str) -> int:
    return _int_at_least(value, 0, "value")


_CPU = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_MEMORY = re.compile(r"^\d+(\.\d+)?(K|M|G|T|Ki|Mi|Gi|Ti)?$")


def cpu_arg(value: str) -> str:
    """A Kubernetes CPU quantity: 4, 0.5 or 500m."""
    if not _CPU.match(value) or float(value.rstrip("m") or 0) <= 0:
        raise argparse.ArgumentTypeError(f"must be a CPU count such as 4, 0.5 or 500m, got {value!r}")
    return value


def _matching(pattern: re.Pattern, what: str):
    """An argument type that accepts strings matching `pattern` ("must be WHAT" otherwise)."""
    def check(value: str) -> str:
        if not pattern.match(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}")
        return value
    return check


# A Kubernetes memory quantity.
memory_arg = _matching(_MEMORY, "a memory size such as 16G, 512M or 32Gi")
gs_uri = _matching(re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$"), "a gs://BUCKET/PATH URI")
kfp_repo = _matching(REPO_PATTERN, "like https://REGION-kfp.pkg.dev/PROJECT/REPO")


def _local(value: str) -> bool:
    return "://" not in value


def _existing(value: str, folder: bool | None) -> str:
    """A local path that exists (a folder, a file, or either when `folder` is None); a URI
    (gs://...) is checked later, by what reads it."""
    if _local(value):
        if not os.path.exists(value):
            raise argparse.ArgumentTypeError(f"{value} does not exist")
        if folder is not None and folder != os.path.isdir(value):
            raise argparse.ArgumentTypeError(f"{value} is a {'file' if folder else 'folder'}, not a "
                                             f"{'folder' if folder else 'file'}")
    return value


def existing_path(value: str) -> str:
    return _existing(value, folder=None)


def existing_file(value: str) -> str:
    return _existing(value, folder=False)


def optional_existing_file(value: str) -> str:
    """"" (none), or an existing file."""
    return value and existing_file(value)


def existing_dir(value: str) -> str:
    return _existing(value, folder=True)


def output_dir(value: str) -> str:
    """A folder to write into: new, or an existing folder (not a file, not under a file)."""
    if _local(value):
        path = os.path.abspath(value)
        if os.path.exists(path) and not os.path.isdir(path):
            raise argparse.ArgumentTypeError(f"{value} is a file, not a folder")
        parent = os.path.dirname(path)
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.path.isdir(parent):
            raise argparse.ArgumentTypeError(f"cannot make {value}: {parent} is a file")
    return value


def output_file(value: str) -> str:
    """A file to write: not a folder, and its folder is (or can be made) a folder."""
    if _local(value):
        if os.path.isdir(value):
            raise argparse.ArgumentTypeError(f"{value} is a folder, not a file")
        output_dir(os.path.dirname(os.path.abspath(value)))
    return value


def key_value(value: str) -> str:
    key, sep, _ = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {value!r}")
    return value


_DURATION = re.compile(r"^(\d+)([smhd])$")


def duration_arg(value: str) -> int:
    """A duration such as 3600s, 90m, 24h or 2d, in seconds."""
    found = _DURATION.match(value.strip())
    if not found or int(found.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"must be a duration such as 90m, 24h or 2d, got {value!r}")
    return int(found.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]


def cron_arg(value: str) -> str:
    from pipeline.vertex_jobs import validate_cron

    try:
        return validate_cron(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _float_in(value: str, low: float, high: float, low_open: bool, what: str, high_open: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}") from None
    if not (low < number if low_open else low <= number) or not (number < high if high_open else number <= high):
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return number


def unit_float(value: str) -> float:
    """A number in [0, 1]."""
    return _float_in(value, 0.0, 1.0, False, "a number in [0, 1]")


def positive_float(value: str) -> float:
    return _float_in(value, 0.0, float("inf"), True, "a number > 0")


def non_negative_float(value: str) -> float:
    return _float_in(value, 0.0, float("inf"), False, "a number >= 0")


def error_line(err: Exception) -> str:
    """One line for an error: an OS error names its file; other messages keep their first
    line (multi-line messages of detpipe's own errors are printed line by line elsewhere)."""
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror}"
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # kfp colours its messages
    return text.splitlines()[0] if text else type(err).__name__


def tensorflow_error_line(err: Exception) -> str | None:
    """tf.errors.* (a missing gs:// object, a corrupt record): their message, first line."""
    if not type(err).__module__.startswith("tensorflow"):
        return None
    text = getattr(err, "message", None) or str(err)
    return f"{type(err).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"


def _int_range(value: str, minimum: int, unit: str, example: str) -> tuple[int, int]:
    """`MIN-MAX` or `N` (both >= `minimum`, MIN <= MAX)."""
    low, _, high = value.partition("-")
    try:
        pair = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN-MAX or N {unit}, e.g. {example}, got {value!r}") from None
    if pair[0] < minimum or pair[0] > pair[1]:
        raise argparse.ArgumentTypeError(f"expected {minimum} <= MIN <= MAX {unit}, got {value!r}")
    return pair


def pixel_range(value: str) -> tuple[int, int]:
    """`MIN-MAX` or `N` pixels (both >= 2, MIN <= MAX)."""
    return _int_range(value, 2, "in pixels", "9-22")


def count_range(value: str) -> tuple[int, int]:
    """`MIN-MAX` or `N` objects (both >= 1, MIN <= MAX)."""
    return _int_range(value, 1, "objects", "100-150")


def _checked_dir(problem):
    """An argument type: an existing folder (or a URI) that `problem` (pipeline/preflight.py) accepts."""
    def check(value: str) -> str:
        existing_dir(value)
        found = problem(value)
        if found:
            raise argparse.ArgumentTypeError(found)
        return value
    return check


# Folders whose kind is checked at once, before any heavy import (pipeline/preflight.py).
images_dir = _checked_dir(preflight.images_problem)


def optional_images_dir(value: str) -> str:
    """"" (none), or a folder of images."""
    return value and images_dir(value)


def optional_existing_path(value: str) -> str:
    """"" (none), or an existing file or folder."""
    return value and existing_path(value)


shards_dir = _checked_dir(preflight.shards_problem)
trained_model_dir = _checked_dir(preflight.trained_model_problem)
saved_model_dir = _checked_dir(preflight.saved_model_problem)
