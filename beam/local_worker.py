"""The worker processes of a local multi-process Beam job (the data job, the predict job).

Beam's own multi-process mode starts each worker as `python -m
apache_beam.runners.worker.sdk_worker_main`; a local job here starts it as `python -m
beam.local_worker`, which runs that same SDK harness and, once the harness has returned (the
runner closed the worker after its last bundle: every output written and closed, the log
flushed), leaves without Python's interpreter teardown. That teardown (gRPC's threads, a
large heap) took ~0.5 s a worker, and Beam's runner closes its workers one after another
and waits for each to exit: ~1.1 s of a two-worker job's ~4.5 s on 2,000 small images
(benchmarks/convert.py). A harness that fails exits as Python does, with its traceback and
a non-zero status.

The command can also give the workers environment variables of their own (the data job's
glibc settings) without touching the driver's environment.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys


def worker_command(env: dict[str, str] | None = None) -> str:
    """The shell command Beam's runner starts a worker with: this module under this Python,
    with `env`'s variables, except those the user's environment already sets (theirs win).

    >>> worker_command({"A_NAME_NOBODY_SETS": "2"}).split()[0]
    'A_NAME_NOBODY_SETS=2'
    """
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items() if name not in os.environ]
    return " ".join([*assignments, shlex.quote(sys.executable), "-m", __name__])


def main() -> None:
    from apache_beam.runners.worker import sdk_worker_main

    logging.getLogger().setLevel(logging.INFO)  # as sdk_worker_main does when run as a module
    sdk_worker_main.main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the harness is done; skip the interpreter's teardown (see above)


if __name__ == "__main__":
    main()
