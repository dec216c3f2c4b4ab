"""How a KFP step's process starts and ends: logging at INFO, and no interpreter teardown
once the step's outputs are written.

A step's process (kfp's `executor_main`) ends when its executor has written the executor
output file. Python's teardown after that (module and C++ object destruction with
TensorFlow, Keras and Beam loaded) took 0.3-2.0 s a step, about 9 s of a demo run's ten
steps on 2 cores (validate 1.2, probe 1.75, train 2.0, evaluate 1.35, export 1.4 s), with
nothing left to write. `start_step` registers an exit hook that leaves at once instead,
with the status the process would have ended with:

- the executor output file written and no uncaught exception: 0;
- an uncaught exception (already printed by `sys.excepthook`): 1, as Python would;
- anything else (the output file not written, a `SystemExit` before it, no executor
  arguments at all): the hook does nothing and Python ends as usual, with its own status.

Non-daemon threads are joined before exit hooks run, and the log handlers and standard
streams are flushed here, so nothing written is lost. The hook is registered last, so it runs
first: later hooks of the libraries' (their teardown) are what it skips.

Example (no `--executor_input` on this command line: the hook stays out of the way):
    >>> output_file(["detpipe"]) is None
    True
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time


def start_step() -> None:
    """What every step does first: INFO logging, and leaving at once once its outputs are
    written (the module's docstring)."""
    logging.basicConfig(level=logging.INFO)
    written = output_file(sys.argv)
    if written is None:
        return
    started = time.time()
    failures: list[type] = []
    previous_hook = sys.excepthook

    def note_failure(kind, value, trace) -> None:
        failures.append(kind)
        previous_hook(kind, value, trace)

    def leave() -> None:
        if not failures and not _written_since(written, started):
            return  # not finished (a SystemExit, a failure before the output): Python's own ending
        leave_now(1 if failures else 0)

    sys.excepthook = note_failure
    atexit.register(leave)


def leave_now(code: int) -> None:
    """Leave with `code` without Python's interpreter teardown (the libraries' module and C++
    object destruction), the log handlers and standard streams flushed first. Only for a process
    whose every file is written and closed (a step after its output, a CLI command that allows it)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def output_file(argv: list[str]) -> str | None:
    """The executor output file kfp's `executor_main` writes last, from its `--executor_input`
    argument (`outputs.outputFile`); None when the command line has none."""
    for i, arg in enumerate(argv):
        text = argv[i + 1] if arg == "--executor_input" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--executor_input=") else None)
        if text is None:
            continue
        try:
            found = json.loads(text).get("outputs", {}).get("outputFile")
        except (ValueError, AttributeError):
            return None
        return found if isinstance(found, str) and found else None
    return None


def _written_since(path: str, started: float) -> bool:
    try:
        return os.path.getmtime(path) >= started - 1.0  # a file system's mtime may be coarser than time()
    except OSError:
        return False
