"""The `detpipe` command line: thin adapters over the step functions.

Exit codes: 0 success, 1 a failed check (reason on stderr, one line a problem),
2 bad usage.
"""

import argparse
import logging
import sys

from pipeline.cli_types import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CheckFailed, DetpipeParser, UsageError, error_line
from pipeline.cli_types import tensorflow_error_line
from pipeline.compile_cli import add_compile_command
from pipeline.data_cli import add_data_commands, add_demo_data_command
from pipeline.evaluate_cli import add_evaluate_command
from pipeline.interrupt import EXIT_INTERRUPTED, handle_interrupts, was_interrupted
from pipeline.model_cli import add_model_commands
from pipeline.probe_cli import add_probe_command
from pipeline.quiet_logs import quiet_beam, quiet_libraries
from pipeline.registry_cli import add_registry_commands
from pipeline.review_cli import add_review_command
from pipeline.run_cli import add_run_command
from pipeline.step_exit import leave_now
from pipeline.train_cli import add_train_command
from pipeline.tune_cli import add_tune_commands
from pipeline.vertex_cli import add_vertex_commands, cloud_error_line

logger = logging.getLogger("detpipe")

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "build_parser", "main", "run"]  # what callers import from here


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detpipe")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = DetpipeParser(
        prog="detpipe",
        description="Train object detectors on GPUs without the usual cloud failures: "
                    "validate data, probe the machine, train, evaluate.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"detpipe {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")

    add_demo_data_command(sub)
    data = add_data_commands(sub)
    add_probe_command(sub)
    add_train_command(sub)
    add_tune_commands(sub)
    add_evaluate_command(sub)
    add_review_command(sub)

    add_compile_command(sub)
    add_run_command(sub)
    add_registry_commands(sub)
    add_model_commands(sub)
    add_vertex_commands(sub)
    parser.epilog = f"The documentation: {DOCS}/index.md (`make docs` builds it as a site)."
    for name, command in [*sub.choices.items(), ("data build", data.choices["build"])]:
        if name in DOCS_PAGE:
            command.epilog = f"More in {DOCS}/{DOCS_PAGE[name]}."
    return parser


DOCS = "docs"  # the documentation's pages (mkdocs.yml), named at the end of each command's --help
DOCS_PAGE = {
    "demo-data": "getting-started.md", "data build": "data.md#what-data-build-checks",
    "probe": "training.md#what-probe-checks", "train": "training.md#how-training-chooses-its-settings",
    "tune": "training.md#hyperparameter-search", "tune-trial": "training.md#hyperparameter-search", "evaluate": "promotion.md", "review": "promotion.md#label-review", "compile": "vertex.md",
    "run": "getting-started.md", "registry": "promotion.md", "export": "serving.md", "predict": "serving.md",
    "serve": "serving.md", "submit": "vertex.md", "schedule": "vertex.md", "batch-predict": "serving.md",
    "deploy": "serving.md", "upload": "vertex.md",
}


def run() -> None:
    """The `detpipe` command (the console script): `main`, leaving at once after a command
    that allows it (`exits_at_once`); a Ctrl-C stops it and every process it started, with
    one line and exit status 130 (pipeline/interrupt.py)."""
    handle_interrupts()
    try:
        code = main(exit_at_once=True)
    except KeyboardInterrupt:
        _exit_at_once(EXIT_INTERRUPTED)  # its own clean-up has run; the libraries' teardown need not
    sys.exit(code)


def _exit_at_once(code: int) -> None:
    """Leave now, without Python's interpreter teardown (`leave_now`): with TensorFlow and Beam
    loaded it took ~1-1.5 s after a `data build` or a `predict` whose work was done. Only for
    commands whose every file is written and closed when they return."""
    leave_now(code)


def main(argv: list[str] | None = None, exit_at_once: bool = False) -> int:
    """Run one `detpipe` command; its exit status. `exit_at_once`: after a command that
    allows it, leave the process at once (`_exit_at_once`), as the console script does."""
    quiet_libraries()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_beam_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    code = _visibly(_logged_command, args, extra)
    if was_interrupted():  # a library that swallowed the Ctrl-C's KeyboardInterrupt and went on
        code = EXIT_INTERRUPTED
    if exit_at_once and getattr(args, "exits_at_once", False):
        _exit_at_once(code)
    return code


def _visibly(command, *args) -> int:
    """`command(*args)` with this process's console streams showing a dataset's control and bidi
    characters as text (`VisibleStream`): every line a command prints, logs included."""
    from pipeline.console import VisibleStream

    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = VisibleStream(sys.stdout), VisibleStream(sys.stderr)
    try:
        return command(*args)
    finally:
        sys.stdout, sys.stderr = streams


def _logged_command(args, extra: list[str]) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        quiet_beam()
    return _run_command(args, extra)


def _run_command(args, extra: list[str]) -> int:
    try:
        return args.func(args, extra) if getattr(args, "takes_beam_args", False) else args.func(args)
    except Exception as err:
        if was_interrupted():  # a library's own error around the Ctrl-C's KeyboardInterrupt (Beam's)
            return EXIT_INTERRUPTED
        return _reported(err)


def _reported(err: Exception) -> int:
    """One line (or the check's lines) for a command's error; its exit status."""
    if isinstance(err, UsageError):
        for line in str(err).splitlines() or [""]:  # one line a problem
            print(f"detpipe: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(err, CheckFailed):
        for line in str(err).splitlines():
            print(f"detpipe: {line}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(err, (OSError, ValueError, RuntimeError, NotImplementedError)):
        print(f"detpipe: error: {error_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    line = cloud_error_line(err) or tensorflow_error_line(err)  # TensorFlow's and Google Cloud's: a line
    if line is None:
        raise err
    print(f"detpipe: error: {line}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    run()
