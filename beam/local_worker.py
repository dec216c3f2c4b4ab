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
glibc settings) without touching the driver's environment, and name modules the worker is
to do without (`skip_imports`): Beam imports its BigQuery and Pub/Sub connectors and pandas
at start where they are installed, ~0.7 of a worker's ~2.3 CPU-seconds of start here, and
skips them where they are not (its imports of them are guarded); the data job uses none.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys


SKIP_IMPORTS_FLAG = "--skip-imports"


def worker_command(env: dict[str, str] | None = None, skip_imports: tuple[str, ...] = ()) -> str:
    """The shell command Beam's runner starts a worker with: this module under this Python,
    with `env`'s variables, except those the user's environment already sets (theirs win),
    and without the modules `skip_imports` names.

    >>> command = worker_command({"A_NAME_NOBODY_SETS": "2"}, ("pandas", "google.cloud.pubsub")).split()
    >>> command[0], command[2:]
    ('A_NAME_NOBODY_SETS=2', ['-m', 'beam.local_worker', '--skip-imports', 'pandas,google.cloud.pubsub'])
    """
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items() if name not in os.environ]
    skipped = [SKIP_IMPORTS_FLAG, ",".join(skip_imports)] if skip_imports else []
    return " ".join([*assignments, shlex.quote(sys.executable), "-m", __name__, *map(shlex.quote, skipped)])


def skip_imports(names: list[str]) -> None:
    """Make these modules fail to import in this process, as if not installed (Python's own
    way: None in sys.modules). Only before anything has imported them."""
    for name in names:
        if name in sys.modules:
            raise RuntimeError(f"{name} is imported already: it cannot be skipped")
        sys.modules[name] = None


def main(argv: list[str]) -> None:
    if SKIP_IMPORTS_FLAG in argv:
        skip_imports(argv[argv.index(SKIP_IMPORTS_FLAG) + 1].split(","))
    from apache_beam.runners.worker import sdk_worker_main

    logging.getLogger().setLevel(logging.INFO)  # as sdk_worker_main does when run as a module
    sdk_worker_main.main(argv)  # it reads its settings from the environment, not from argv
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the harness is done; skip the interpreter's teardown (see above)


if __name__ == "__main__":
    main(sys.argv)
