"""The data job's local worker processes: how many (from the CPUs this process may use, which
the probe reports too), with what settings, and starting them early. This module imports
neither Beam nor TensorFlow, so that a command can start the workers (`prestarted_data_workers`)
before its own imports of them (~4.5 s on one core, with the job's other cores idle), and the
job's first stage does not wait ~1 s for them.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
from pathlib import Path

logger = logging.getLogger(__name__)

# A worker process cost ~1.2-1.6 CPU-seconds to start (Beam's import) before it checked a
# record when this was measured, before the checks decoded with TensorFlow (JOB_MODULES: its
# import is now a worker's largest start cost), and Beam's portable runner moves each stage's
# output through the driver: on the 2-core machine a second worker paid from ~2,400
# photo-sized (480-640 px) and ~12,000 small (128 px) images (each one's start and rate from
# 2,000 and 20,000 images), so below this many records per worker the job runs in fewer.
# Set for photos, what real datasets hold: 8,000 small images take ~10% longer with two.
RECORDS_PER_WORKER = 4_000

# glibc malloc settings for the data job's local worker processes (read by glibc when a
# process starts; other C libraries ignore them). Beam's local runner hands each worker one
# bundle per stage, its share of the whole stage's input, which arrives and leaves as buffers
# of many MiB: with glibc's defaults (an arena per thread, a large-allocation threshold that
# rises to the largest buffer freed) those buffers' memory stayed in the process. With these,
# a worker's peak (2 workers, 128 px) was 217 / 260 / 329-339 MiB at 2,000 / 20,000 / 60,000
# images, against 223 / 283-289 / 379-492 without, in the same time (benchmarks/convert.py).
# Not for the predict job's workers, which run TensorFlow (its allocations not measured so).
WORKER_MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}

# What the data job's local workers do without (beam/local_worker.py): Beam's BigQuery and
# Pub/Sub connectors and pandas, which it imports at start if installed; ~0.7 of a worker's
# ~2.3 CPU-seconds of start here. No stage of the job uses them (tests/test_job_workers.py
# runs it so). GCS's client (~0.2 more) only when no path is on gs:// (`worker_skips`).
WORKER_SKIPPED_IMPORTS = ("pandas", "google.cloud.bigquery", "google.cloud.bigquery_storage_v1",
                          "google.cloud.pubsub", "google.cloud.pubsub_v1")

# What the job's stages import in a worker (unpickled, and their own lazy imports): a worker
# started early imports them while it waits. beam.contract.decoding imports TensorFlow (~3.5
# CPU-seconds): the checks decode every JPEG and PNG with TensorFlow's own decoders, which
# disagree with Pillow on some damaged files (beam/contract/decoding.py). Measured with it
# (benchmarks/convert.py, 8,000 demo images, 2 cores): each worker's peak ~645 MiB (~220-260
# before); 2 workers 3.5 s of the job's own time against 5.0 s for one, 9.5 s against 9.0 s as
# whole processes (the workers' imports overlap the driver's). RECORDS_PER_WORKER is kept.
JOB_MODULES = ("beam.job_transforms", "beam.example_codec", "beam.feature_batches", "beam.contract.files",
               "beam.split", "PIL.JpegImagePlugin", "PIL.PngImagePlugin", "beam.contract.decoding")


def default_workers(records: int, usable_cpus: int, per_worker: int = RECORDS_PER_WORKER) -> int:
    """Worker processes for a local job of `records` records: one per `per_worker`
    (RECORDS_PER_WORKER for the data job), at most one per usable CPU.

    >>> default_workers(2_304, 8), default_workers(7_000, 2), default_workers(8_000, 2), default_workers(10**6, 16)
    (1, 1, 2, 16)
    """
    return max(1, min(usable_cpus, records // per_worker))


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> dict:
    """CPUs this process may really use: affinity, then any cgroup v2/v1 CPU quota."""
    visible = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else visible
    quota = None
    v2 = cgroup_root / "cpu.max"
    v1_quota, v1_period = cgroup_root / "cpu" / "cpu.cfs_quota_us", cgroup_root / "cpu" / "cpu.cfs_period_us"
    try:
        if v2.exists():
            limit, period = v2.read_text().split()[:2]
            if limit != "max":
                quota = int(limit) / int(period)
        elif v1_quota.exists() and v1_period.exists():
            limit = int(v1_quota.read_text())
            if limit > 0:
                quota = limit / int(v1_period.read_text())
    except (OSError, ValueError) as err:
        logger.debug("cgroup cpu quota unreadable: %s", err)
    usable = affinity if quota is None else max(1, min(affinity, math.floor(quota)))
    return {"visible": visible, "affinity": affinity, "cgroup_quota": quota, "usable": usable}


def usable_cpu_count() -> int:
    """The CPUs this process may use (`usable_cpus`): what the probe reports and every local
    Beam job sizes its workers by."""
    return usable_cpus()["usable"]


def worker_skips(paths: tuple[str | None, ...]) -> tuple[str, ...]:
    """The modules the data job's workers do without: WORKER_SKIPPED_IMPORTS, and GCS's
    client when none of the job's `paths` is on gs:// (a path not given, "" or None, is none).

    >>> worker_skips(("imgs", "gs://b/out"))[-1], worker_skips(("imgs", "out", None, ""))[-1]
    ('google.cloud.pubsub_v1', 'google.cloud.storage')
    >>> worker_skips(("imgs", "ann", "out", "gs://b/val.json", None))[-1]
    'google.cloud.pubsub_v1'
    """
    local = not any(path and path.startswith("gs://") for path in paths)
    return WORKER_SKIPPED_IMPORTS + (("google.cloud.storage",) if local else ())


def prestarted_data_workers(data_format: str, images: str, annotations: str, output: str, runner: str,
                            beam_args: tuple[str, ...] | list[str], num_workers: int | None,
                            val_annotations: str = "", val_images: str = ""):
    """A context in which the data job over a local VOC folder (and the val split's, when
    the dataset comes split) finds its worker processes started
    (`beam.local_worker.prestarted_for_job`): as many as it will run (`num_workers`, else
    `default_workers` of the folders' *.xml files). Nothing is started for a COCO/CSV file,
    whose records are only counted by reading it, nor where `prestarted_for_job` says."""
    if data_format != "voc":
        return contextlib.nullcontext()
    from beam.local_worker import prestarted_for_job

    def workers() -> int:  # the job's own listing (beam/voc_reader.py) globs the same pattern
        xml_files = [path for folder in (annotations, val_annotations) if folder
                     for path in glob.glob(os.path.join(folder.rstrip("/"), "*.xml"))]
        return num_workers or default_workers(len(xml_files), usable_cpu_count())

    return prestarted_for_job(runner, beam_args, annotations, workers, WORKER_MALLOC_ENV,
                              worker_skips((images, annotations, output, val_annotations, val_images)), JOB_MODULES)
