"""A `detpipe` command run in the pytest process, as the console script runs it (the CLI's
`main`): no process start and no second TensorFlow import. Shared by the tests that stop and
resume training or a search in this process (test_checkpoints.py, test_tuning.py)."""

from __future__ import annotations

import contextlib
import io
import logging


def run_here(argv: list[str]) -> tuple[int, str]:
    """`main(argv)`'s exit code, and what it said: its stderr and its log records at INFO and above
    (under pytest the CLI's own logging set-up leaves the root logger as pytest has it)."""
    from pipeline.cli import main

    root, said = logging.getLogger(), io.StringIO()
    handler, level = logging.StreamHandler(said), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stderr(said):
            code = main(argv)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return code, said.getvalue()
