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

Workers can also be started before the job exists (`prestarted`): a command that knows the
job's size starts them before its own heavy imports (TensorFlow's ~3.5 s on one core while
the other idles), so their ~1.3 CPU-seconds each of Beam's import are paid there and not
when the job's first stage waits for them. Each one imports, then waits at a socket in a
folder of its own; Beam's runner then starts, as usual, one command per worker, but that
command (`--attach`) only claims a waiting worker (an atomic rename), hands it Beam's
environment (the runner's addresses, the pipeline's options) and waits for it to finish,
passing on its exit status. A command that finds no worker waiting or starting becomes a
plain worker (the same command without `--attach`). Unclaimed workers leave when the folder is closed, or when
the process that started them is gone.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path


MODULE = "beam.local_worker"  # what a worker process runs (`python -m`); __name__ there is "__main__"
SKIP_IMPORTS_FLAG = "--skip-imports"
PRELOAD_FLAG = "--preload"  # a started-early worker: modules to import while it waits
WAIT_FLAG = "--wait-at"  # a started-early worker: its socket's path
ATTACH_FLAG = "--attach"  # Beam's worker command: the folder of started-early workers to claim one of
# A started-early worker's files in its folder, by its index I: I.sock (its socket), and one
# marker that names its state: I.starting (importing), I.ready (waiting), I.claimed / I.closed.
STARTING, READY, CLAIMED, CLOSED = ".starting", ".ready", ".claimed", ".closed"
ATTACH_WAIT_S = 60.0  # how long a command waits for a worker still importing (a busy machine)
_pools: dict[tuple, str] = {}  # (env, skip_imports) -> the folder of this process's started-early workers


def worker_command(env: dict[str, str] | None = None, skip_imports: tuple[str, ...] = ()) -> str:
    """The shell command Beam's runner starts a worker with: this module under this Python,
    with `env`'s variables, except those the user's environment already sets (theirs win),
    and without the modules `skip_imports` names.

    >>> command = worker_command({"A_NAME_NOBODY_SETS": "2"}, ("pandas", "google.cloud.pubsub")).split()
    >>> command[0], command[2:]
    ('A_NAME_NOBODY_SETS=2', ['-m', 'beam.local_worker', '--skip-imports', 'pandas,google.cloud.pubsub'])
    """
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items() if name not in os.environ]
    folder = _pools.get(_pool_key(env, skip_imports))
    attach = [ATTACH_FLAG, folder] if folder else []
    return " ".join([*assignments, shlex.quote(sys.executable), "-m", MODULE,
                     *map(shlex.quote, _skip_args(skip_imports) + attach)])


def _skip_args(skip_imports: tuple[str, ...]) -> list[str]:
    return [SKIP_IMPORTS_FLAG, ",".join(skip_imports)] if skip_imports else []


def _pool_key(env: dict[str, str] | None, skip_imports: tuple[str, ...]) -> tuple:
    return tuple(sorted((env or {}).items())), tuple(skip_imports)


def prestarted_for_job(runner: str, beam_args, listed: str, workers, env: dict[str, str] | None = None,
                       skip_imports: tuple[str, ...] = (), preload: tuple[str, ...] = ()):
    """`prestarted` for a local job whose inputs are listed from `listed`: with `workers()`
    processes (a callable: it lists that folder), or, a context that starts nothing, for
    another runner, for Beam's own --direct_* options (Beam then starts its workers), for a
    `listed` with a scheme (gs://: its listing is the job's), or for one worker (in-process)."""
    import contextlib

    if runner != "DirectRunner" or "://" in listed or any(arg.startswith("--direct_") for arg in beam_args):
        return contextlib.nullcontext()
    count = workers()
    return prestarted(count, env, skip_imports, preload) if count > 1 else contextlib.nullcontext()


@contextmanager
def prestarted(count: int, env: dict[str, str] | None = None, skip_imports: tuple[str, ...] = (),
               preload: tuple[str, ...] = ()):
    """Start `count` worker processes now, each importing Beam's harness and `preload`,
    for the jobs this process runs while in the block with workers of the same `env` and
    `skip_imports` (`worker_command` then claims them); yields their process ids. At the
    end of the block those no job claimed are stopped and the folder removed."""
    import shutil
    import subprocess

    folder = _workers_folder(count) if count >= 1 else None
    if folder is None:
        yield []
        return
    key = _pool_key(env, skip_imports)
    environment = {**(env or {}), **os.environ}  # the user's own values win, as in worker_command
    processes = []
    try:
        for index in range(count):
            Path(folder, f"{index}{STARTING}").touch()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", MODULE, *_skip_args(skip_imports), PRELOAD_FLAG, ",".join(preload),
                 WAIT_FLAG, os.path.join(folder, str(index))], env=environment, stdin=subprocess.DEVNULL))
        _pools[key] = folder
        yield [process.pid for process in processes]
    finally:
        _pools.pop(key, None)
        for index, process in enumerate(processes):
            for state in (STARTING, READY):  # not claimed: take it, so no command can
                try:
                    os.rename(os.path.join(folder, f"{index}{state}"), os.path.join(folder, f"{index}{CLOSED}"))
                    process.kill()
                except OSError:
                    pass
        for process in processes:
            try:
                process.wait(timeout=30)  # a claimed one has finished with its job's end
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)


# A Unix socket's path is at most 107 bytes on Linux (103 on macOS): a folder in a long TMPDIR
# (a test runner's, a CI's) cannot hold them.
SOCKET_PATH_MAX = 100


def _workers_folder(count: int) -> str | None:
    """A new private folder for `count` started-early workers' sockets: in the temporary
    folder (TMPDIR), or in /tmp where TMPDIR's path is too long for a socket; None when
    neither will do (the job then starts its workers itself)."""
    import tempfile

    for where in (None, "/tmp"):
        try:
            folder = tempfile.mkdtemp(prefix="detpipe-workers-", dir=where)
        except OSError:
            continue
        if len(os.path.join(folder, f"{count}.sock")) <= SOCKET_PATH_MAX:
            return folder
        os.rmdir(folder)
    return None


class WorkerDied(RuntimeError):
    """A local worker process ended in the middle of the job (killed: out of memory?)."""


# The thread Beam's runner watches each worker process from (fn_api_runner/worker_handlers.py),
# and what it raises there when the process ends with a non-zero status.
_BEAM_WORKER_THREAD, _BEAM_WORKER_EXIT = "run_worker", "Worker subprocess exited with return code"


@contextmanager
def failing_when_a_worker_dies():
    """Within the block, a local job whose worker process dies (the system's out-of-memory
    killer, a crash in a C library) raises `WorkerDied` in this thread at once. Beam's local
    runner only raises in the thread that watches the process, and its driver then waits for
    that worker's bundle for ever (measured: a job with one worker's `os._exit` never ended).
    A no-op outside the main thread, where no signal handler can be set."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    died: list[str] = []
    previous_hook = threading.excepthook

    def hook(args) -> None:
        if (args.thread is not None and args.thread.name == _BEAM_WORKER_THREAD
                and _BEAM_WORKER_EXIT in str(args.exc_value)):
            died.append(str(args.exc_value))
            os.kill(os.getpid(), signal.SIGUSR1)  # a real signal: it wakes the main thread's wait
            return
        previous_hook(args)

    def stop(signum, frame) -> None:
        if died:
            raise WorkerDied(f"a worker process of the job ended in the middle of it ({died[0]}): killed by the "
                             "system for memory? (see `dmesg`; fewer --direct-num-workers use less)")

    previous_handler = signal.signal(signal.SIGUSR1, stop)
    threading.excepthook = hook
    try:
        yield
    finally:
        if threading.excepthook is hook:  # not if something has put its own in since
            threading.excepthook = previous_hook
        signal.signal(signal.SIGUSR1, previous_handler)


def _listen(path: str):
    import socket

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".sock")
    server.listen(1)
    server.settimeout(0.5)
    return server


def _wait_for_job(path: str, parent: int):
    """A started-early worker, imported: listen at PATH.sock, say so (PATH.starting ->
    PATH.ready), and wait for a command to claim it. Returns the connection and the
    environment it sends, or None once the process that started it is gone."""
    import json
    import socket

    server = _listen(path)
    try:
        os.rename(path + STARTING, path + READY)
    except FileNotFoundError:
        return None  # closed while it imported: it is being stopped
    while True:
        try:
            connection, _ = server.accept()
            break
        except socket.timeout:
            if os.getppid() != parent:
                return None
    server.close()
    connection.settimeout(None)
    with connection.makefile("rb") as reader:
        return connection, json.loads(reader.readline())


def _attach(folder: str) -> int | None:
    """Claim a started-early worker in `folder`, hand it this process's environment (Beam's
    addresses and options for the worker) and wait for it: its exit status. None when no
    worker is waiting or still starting: this process is to run the harness itself."""
    import json
    import socket

    deadline = time.monotonic() + ATTACH_WAIT_S
    while True:
        names = os.listdir(folder) if os.path.isdir(folder) else []
        for name in sorted(n for n in names if n.endswith(READY)):
            index = name[:-len(READY)]
            try:
                os.rename(os.path.join(folder, name), os.path.join(folder, index + CLAIMED))
            except OSError:
                continue  # another command claimed it first
            try:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                connection.connect(os.path.join(folder, index + ".sock"))
                connection.sendall(json.dumps(dict(os.environ)).encode() + b"\n")
                status = connection.makefile("rb").read()
            except OSError:
                continue  # it died in between: the next one
            return int(status) if status.strip().isdigit() else 1  # no status: it died in the job
        if not any(n.endswith(STARTING) for n in names) or time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def _run_prestarted(path: str, preload: list[str]) -> None:
    """A started-early worker: import, wait for a job, run its harness, send the status."""
    parent = os.getppid()
    try:
        from apache_beam.runners.worker import sdk_worker_main

        for name in preload:
            __import__(name)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(path + STARTING)  # no command waits for it
        raise
    try:
        claimed = _wait_for_job(path, parent)
    except OSError:
        with suppress(FileNotFoundError):
            os.unlink(path + STARTING)  # its socket failed: no command is to wait for it
        raise
    if claimed is None:
        _leave_folder(path, parent)
        os._exit(0)
    connection, environment = claimed
    os.environ.update(environment)
    status = 1
    try:
        _run_harness(sdk_worker_main)
        status = 0
    finally:
        with suppress(OSError):  # the command that waits for it may be gone (its job stopped)
            connection.sendall(str(status).encode())
        connection.close()
        _leave_folder(path, parent)
    _exit_now()


def _leave_folder(path: str, parent: int) -> None:
    """Once the process that started this worker is gone (killed: its own clean-up did not
    run), take this worker's files out of the folder, and the folder once empty."""
    if os.getppid() == parent:
        return
    for name in os.listdir(os.path.dirname(path)):
        if name.split(".")[0] == os.path.basename(path):
            with suppress(OSError):
                os.unlink(os.path.join(os.path.dirname(path), name))
    with suppress(OSError):
        os.rmdir(os.path.dirname(path))  # the last worker to leave


def _run_harness(sdk_worker_main) -> None:
    logging.getLogger().setLevel(logging.INFO)  # as sdk_worker_main does when run as a module
    sdk_worker_main.main([])  # it reads its settings from the environment, not from argv


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the harness is done; skip the interpreter's teardown (see above)


def skip_imports(names: list[str]) -> None:
    """Make these modules fail to import in this process, as if not installed (Python's own
    way: None in sys.modules). Only before anything has imported them."""
    for name in names:
        if name in sys.modules:
            raise RuntimeError(f"{name} is imported already: it cannot be skipped")
        sys.modules[name] = None


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def main(argv: list[str]) -> None:
    import signal

    # A Ctrl-C at the terminal reaches the workers too: a worker's life is its job's, which
    # the command decides (pipeline/interrupt.py stops its workers), not a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    folder = _flag(argv, ATTACH_FLAG)
    if folder is not None:
        status = _attach(folder)
        if status is not None:
            sys.exit(status)
        # None waiting: become a plain worker (the same command without --attach)
        at = argv.index(ATTACH_FLAG)
        os.execv(sys.executable, [sys.executable, "-m", MODULE, *argv[1:at], *argv[at + 2:]])
    skipped = _flag(argv, SKIP_IMPORTS_FLAG)
    if skipped:
        skip_imports(skipped.split(","))
    path = _flag(argv, WAIT_FLAG)
    if path is not None:
        _run_prestarted(path, [n for n in (_flag(argv, PRELOAD_FLAG) or "").split(",") if n])
    from apache_beam.runners.worker import sdk_worker_main

    _run_harness(sdk_worker_main)
    _exit_now()


if __name__ == "__main__":
    main(sys.argv)
