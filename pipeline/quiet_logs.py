"""What the `detpipe` command keeps out of its output: the libraries' start-up chatter and
Beam's own notes (a local job's worker lines are kept, rewritten to the worker's message)."""

import logging
import os


def quiet_libraries() -> None:
    """TensorFlow's C++ start-up chatter (no CUDA here, duplicate factory registration) and
    google-api-core's Python 3.11 notice bury the output people need to read."""
    import os
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore", category=FutureWarning, module="google.api_core")
    # aiplatform's notice that it will want google-cloud-storage 3 (a pin of uv.lock, not the user's)
    warnings.filterwarnings("ignore", category=FutureWarning, module="google.cloud.aiplatform.models")
    # The same for the processes this one starts (a local Beam job's workers print it once
    # for each Google library they import).
    os.environ.setdefault("PYTHONWARNINGS", f"ignore::FutureWarning:{PYTHON_VERSION_NOTICE}")


PYTHON_VERSION_NOTICE = "google.api_core._python_version_support"  # the module that warns
BEAM_WORKER_RELAY = "apache_beam.runners.portability.local_job_service"  # re-logs worker processes' lines


def not_beam_chatter(record: logging.LogRecord) -> bool:
    """False for Beam's own INFO/WARNING notes: those it logs straight on the root logger
    ("BatchElements statistics", "Resource module is not available") and those its worker
    processes send to the driver ("No semi_persistent_directory found"). The job's own
    lines (e.g. "checked N records on worker P", relayed from a worker) and errors pass;
    a relayed line is rewritten to the worker's own message on the way (`_as_worker_line`)."""
    where = record.pathname
    if record.name == BEAM_WORKER_RELAY:
        where = _as_worker_line(record)
    if record.levelno >= logging.ERROR:
        return True
    return f"{os.sep}apache_beam{os.sep}" not in where


def _as_worker_line(record: logging.LogRecord) -> str:
    """A worker's line as Beam relays it ("Worker: %s" with the whole LogEntry as text:
    severity, timestamp, instruction and transform ids, ...) turned into "worker: MESSAGE"
    (and its traceback), in place; returns where the worker logged it."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from google.protobuf import text_format

    if not (record.msg == "Worker: %s" and len(record.args or ()) == 1):
        return ""
    entry = beam_fn_api_pb2.LogEntry()
    try:
        text_format.Parse(str(record.args[0]), entry)
    except text_format.ParseError:
        return ""  # not a LogEntry after all: left as Beam wrote it
    record.msg, record.args = "worker: %s", (entry.message + (f"\n{entry.trace}" if entry.trace else ""),)
    return entry.log_location


def quiet_beam() -> None:
    """Beam's chatter off (without --verbose), but not the Dataflow runner's INFO (the job's
    console URL and state) nor worker lines the job logs; idempotent."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    for name in ("apache_beam.runners.dataflow", BEAM_WORKER_RELAY):
        logging.getLogger(name).setLevel(logging.INFO)
    for logger in (logging.getLogger(), logging.getLogger(BEAM_WORKER_RELAY)):
        if not_beam_chatter not in logger.filters:
            logger.addFilter(not_beam_chatter)
