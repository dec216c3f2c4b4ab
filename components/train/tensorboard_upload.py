"""Training curves in a Vertex AI TensorBoard from a train step that runs as a plain pipeline
task. A custom job with a TensorBoard has Vertex AI set AIP_TENSORBOARD_LOG_DIR, where the
trainer writes them as it goes (curve.py); a pipeline task gets no such variable, so the step
uploads the event files it wrote once training ends, with aiplatform's TensorBoard uploader.
The DAG names the TensorBoard in the task's environment (`TENSORBOARD_ENV`)."""

from __future__ import annotations

import logging
import re
import time

logger = logging.getLogger(__name__)

TENSORBOARD_ENV = "DETPIPE_TENSORBOARD"  # projects/P/locations/L/tensorboards/ID
_RESOURCE = re.compile(r"projects/([^/]+)/locations/([^/]+)/tensorboards/([^/]+)")


def tensorboard_parts(resource: str) -> tuple[str, str, str]:
    """(project, location, id) of a TensorBoard's resource name.

    >>> tensorboard_parts("projects/p/locations/europe-west4/tensorboards/42")
    ('p', 'europe-west4', '42')
    """
    found = _RESOURCE.fullmatch(resource)
    if not found:
        raise ValueError(f"not a Vertex AI TensorBoard: {resource!r} (projects/P/locations/L/tensorboards/ID)")
    return found.group(1), found.group(2), found.group(3)


def upload_curves(tensorboard: str, logdir: str, experiment: str) -> str | None:
    """Upload the event files under `logdir` to `tensorboard`, as runs of its experiment
    `experiment` (created when missing), each run named with this upload's time first.

    None when uploaded; else why not, in one line, also logged as a warning: the curves come
    after the training, and a refused upload (credentials, permission, quota) must not fail
    the step that holds the trained model. A malformed resource name raises ValueError (the
    DAG is compiled with it: a mistake to fix, not a service's answer)."""
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import aiplatform

    project, location, board = tensorboard_parts(tensorboard)
    try:
        aiplatform.upload_tb_log(tensorboard_experiment_name=experiment, logdir=logdir, tensorboard_id=board,
                                 project=project, location=location,
                                 run_name_prefix=time.strftime("%Y%m%d-%H%M%S-", time.gmtime()))
    except (GoogleAPIError, GoogleAuthError, OSError) as err:
        line = f"training curves not uploaded to {tensorboard}: {type(err).__name__}: {str(err).splitlines()[0]}"
        logger.warning("%s (the event files stay in %s)", line, logdir)
        return line
    return None
