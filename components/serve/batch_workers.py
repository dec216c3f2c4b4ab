"""The predict job's local worker processes: how many, and starting them early. This module
imports neither Beam nor TensorFlow, so that `detpipe predict --images` can start the
workers (`prestarted_predict_workers`) before its own imports (~7 s on one core here, with the
other idle): each worker's own start (Beam, TensorFlow: ~5 CPU-seconds) then overlaps them.
"""

from __future__ import annotations

import glob

# A second worker process costs ~5 s more to start (Beam, TensorFlow, the model) on 2 cores
# and paid from ~4,000-5,500 photos there (benchmarks/batch_predict.py --images 4000 and 20000).
IMAGES_PER_WORKER = 2_500

# What the job's stages import in a worker: a worker started early imports them while it
# waits. None of them runs TensorFlow (its thread pools are set when the model loads).
JOB_MODULES = ("tensorflow", "components.serve.batch_job", "components.export.predictor")


def image_pattern(images: str) -> str:
    """The file pattern of `images`: a glob as it is, else every file in the folder or under the prefix.

    >>> image_pattern("photos/"), image_pattern("gs://b/cam/*.jpg")
    ('photos/*', 'gs://b/cam/*.jpg')
    """
    return images if any(c in images for c in "*?[") else images.rstrip("/") + "/*"


def prestarted_predict_workers(images: str, runner: str, beam_args: tuple[str, ...] | list[str],
                               num_workers: int | None):
    """A context in which the predict job over local images finds its worker processes
    started (`beam.local_worker.prestarted_for_job`): as many as it will run (`num_workers`,
    else one per IMAGES_PER_WORKER files, at most the usable CPUs)."""
    from beam.data_workers import default_workers, usable_cpu_count
    from beam.local_worker import prestarted_for_job

    def workers() -> int:  # the job lists the same pattern (batch_job.list_images)
        return num_workers or default_workers(len(glob.glob(image_pattern(images))), usable_cpu_count(),
                                              IMAGES_PER_WORKER)

    return prestarted_for_job(runner, beam_args, images, workers, preload=JOB_MODULES)
