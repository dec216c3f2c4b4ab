"""A job a step starts on Google Cloud (a Dataflow job, a Vertex AI tuning job): written as
the step's `gcp_resources` output, which is how Vertex AI Pipelines links a task to the job it
runs in the console (GCPC's launchers write the same `GcpResources` message), and cancelled
when the step is stopped.

Vertex AI stops a task of a cancelled run with SIGTERM; a step that only waited for its job
would die and leave the job running and billing. `cancelled_on_sigterm` holds the wait: on
SIGTERM it cancels the job once, says so in one line, and ends the step (exit status 143,
128 + SIGTERM), as GCPC's `ExecutionContext` does for its own jobs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from typing import Callable, ContextManager, Iterator

logger = logging.getLogger(__name__)

DATAFLOW_JOB = "DataflowJob"
TUNING_JOB = "HyperparameterTuningJob"
EXIT_STOPPED = 128 + signal.SIGTERM


def dataflow_uri(project: str, region: str, job_id: str) -> str:
    """A Dataflow job as GCPC's Dataflow launcher links it.

    >>> dataflow_uri("p", "europe-west4", "2026-12-02_01_02_03-123")
    'https://dataflow.googleapis.com/v1b3/projects/p/locations/europe-west4/jobs/2026-12-02_01_02_03-123'
    """
    return f"https://dataflow.googleapis.com/v1b3/projects/{project}/locations/{region}/jobs/{job_id}"


def vertex_uri(resource_name: str) -> str:
    """A Vertex AI resource as GCPC's launchers link it (its region's endpoint).

    >>> vertex_uri("projects/p/locations/us-central1/hyperparameterTuningJobs/42")
    'https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/hyperparameterTuningJobs/42'
    """
    region = resource_name.split("/")[3]
    return f"https://{region}-aiplatform.googleapis.com/v1/{resource_name}"


def gcp_resources_json(resource_type: str, uri: str) -> str:
    """GCPC's `GcpResources` message naming one job, in its JSON form. Written as JSON here: the
    steps' logic imports no kfp or GCPC (the pipeline's adapters do); tests/test_vertex_cloud.py
    parses it with GCPC's own proto.

    >>> gcp_resources_json("DataflowJob", "https://x")
    '{"resources": [{"resourceType": "DataflowJob", "resourceUri": "https://x"}]}'
    """
    return json.dumps({"resources": [{"resourceType": resource_type, "resourceUri": uri}]})


def write_gcp_resources(path: str, resource_type: str, uri: str) -> None:
    """Write the step's `gcp_resources` output (nothing when the step has none: `path` empty)."""
    if not path:
        return
    import tensorflow as tf  # a /gcs/ or gs:// output on Vertex, a local one elsewhere

    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(gcp_resources_json(resource_type, uri))


def no_gcp_resources(path: str) -> None:
    """The step's `gcp_resources` when it started nothing on Google Cloud: an empty message."""
    if path:
        with open(path, "w") as handle:
            handle.write("{}")


class Stopped(SystemExit):
    """The step was stopped (SIGTERM) and cancelled what it started."""


class JobStop:
    """Cancels one job once, and says so in one line."""

    def __init__(self, cancel: Callable[[], None], what: str):
        self._cancel, self.what, self.done = cancel, what, False

    def now(self) -> None:
        """Cancel the job (once: later calls do nothing), and print the line."""
        if self.done:
            return
        self.done = True
        try:
            self._cancel()
            line = f"detpipe: stopped: cancelled {self.what}"
        except Exception as err:  # noqa: BLE001 - said, and the step still stops
            line = f"detpipe: stopped: could not cancel {self.what}: {type(err).__name__}: {err}"
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def cancelled_on_sigterm(cancel: Callable[[], None], what: str) -> Iterator[JobStop]:
    """Inside: a SIGTERM cancels the job once (`JobStop.now`: `detpipe: stopped: cancelled
    WHAT`) and raises Stopped(143) in the waiting (main) thread. The previous handler comes
    back after. Code inside that takes SIGTERM for itself (the trainer checkpoints on it) calls
    the yielded `JobStop.now()` when it stops."""
    stop = JobStop(cancel, what)

    def on_term(signum, frame):
        if stop.done:
            return  # a second SIGTERM while cancelling: the first one's cancel is under way
        stop.now()
        raise Stopped(EXIT_STOPPED)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def held_dataflow_job(gcp_resources: str, project: str, region: str) -> Callable[[object], ContextManager]:
    """The data step's `hold_job` (beam/convert_job.py) on Dataflow: given the started job's
    result, write it as the step's `gcp_resources` and cancel it on SIGTERM while it is waited for."""

    def hold(result) -> ContextManager:
        job_id = result.job_id()
        write_gcp_resources(gcp_resources, DATAFLOW_JOB, dataflow_uri(project, region, job_id))
        logger.info("validate-and-convert: Dataflow job %s", job_id)
        return cancelled_on_sigterm(result.cancel, f"Dataflow job {job_id}")

    return hold
