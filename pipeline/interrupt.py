"""Ctrl-C at the console: one line, every process the command started stopped, and exit
status 130 (128 + SIGINT, what a shell reports for a Ctrl-C).

A Ctrl-C at a terminal reaches every process of its foreground group: the command and each
worker process of its local Beam job. Left to Python's defaults, each printed its own
KeyboardInterrupt traceback (~340 lines for a two-worker `data build`, the workers' relayed
through Beam's log), and a worker blocked in a read (a stalled network mount) kept the
command waiting for it. So the workers ignore SIGINT (`beam/local_worker.py`: their life is
their job's), and the command, on the first Ctrl-C, says so in one line, kills the processes
it started (SIGKILL: a worker's own clean-up is its job's, which is being abandoned), quiets
the libraries' log and their threads' errors about the killed workers, and raises
KeyboardInterrupt in its main thread, so its own clean-up still runs (a data build's
`OUTPUT/_job` removed, started workers' folder removed). A second Ctrl-C stops it at once,
as Python's default would. After a Ctrl-C any error is the interrupt's (`was_interrupted`):
Beam's in-process runner raises one of its own around the KeyboardInterrupt.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextlib import suppress

EXIT_INTERRUPTED = 128 + signal.SIGINT


def stop_child_processes() -> None:
    """Kill every process this one started, and theirs (each worker of a local job and the
    command Beam's runner started it with), and wait until they are dead. Looked for again
    until none is left: the runner's threads may start a worker after the first look, and a
    worker left alive prints its gRPC clients' failures once the job's servers stop."""
    import psutil

    # Gone or a zombie (dead, not yet reaped by its parent) is dead: psutil.wait_procs waits
    # for the zombies of processes that are not this one's children to be reaped (~1 s here).
    deadline = time.monotonic() + 5
    seen: list = []
    while time.monotonic() < deadline:
        found = psutil.Process().children(recursive=True)  # all of them first: a killed parent's orphans escape
        seen += [child for child in found if child not in seen]
        living = [child for child in seen if _alive(child)]
        if not living:
            return
        for child in living:
            with suppress(psutil.NoSuchProcess):
                child.kill()
        time.sleep(0.01)


def _alive(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _quiet(args) -> None:
    """threading.excepthook after a Ctrl-C: the libraries' threads failing over the killed
    workers (Beam's gRPC readers) are not news."""


_interrupted = False


def was_interrupted() -> bool:
    """Whether a Ctrl-C has been handled here: an error raised since may be a library's own
    around its KeyboardInterrupt (Beam's in-process runner raises one of its own)."""
    return _interrupted


def _on_interrupt(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C: at once
    print("detpipe: interrupted: stopping (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)
    logging.disable(logging.CRITICAL)
    threading.excepthook = _quiet
    stop_child_processes()
    raise KeyboardInterrupt


def handle_interrupts() -> None:
    """From now on a SIGINT (Ctrl-C) in this process does what the module says. Only for a
    command run as its own process (the console script): it kills every child process. Not
    where SIGINT was ignored when the process started (`nohup`, `cmd &` in a script), as
    Python itself leaves it then."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_interrupt)
