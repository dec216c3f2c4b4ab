"""`detpipe predict --images DIR|gs://PREFIX|GLOB --output DIR`: detections for a folder or a
bucket of images as a Beam job, locally on every usable core (worker processes, as
Dataflow runs it) or on Dataflow (`--runner DataflowRunner` and Beam's options).

The model runs through Beam's `RunInference` (it batches the images, loads the model once
per worker process and shares it between threads); `DetectorHandler` is the small part
Beam cannot know: the `Predictor` that `detpipe serve` answers with, so every image is
checked, turned upright by its EXIF orientation and preprocessed exactly as `serve` does.

Output, in OUTPUT:
  predictions-SSSSS-of-NNNNN.jsonl  one JSON line per predicted image: {"image": path,
                                    "model": folder, "model_version", "detection_boxes",
                                    "detection_scores", "detection_classes",
                                    "detection_class_names", "num_detections"}
  rejects-SSSSS-of-NNNNN.jsonl      one line per file that is not a usable image:
                                    {"image", "reason", "message"}
  summary.json                      images in = predicted + rejected, and where they came from
  drawn/                            with `draw`: copies with the boxes drawn (small local runs)
"""

from __future__ import annotations

import collections
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.options.pipeline_options import DirectOptions

from beam.contract.images import FileTooLarge, read_image_file
from beam.contract.rejects import IMAGE_TOO_LARGE
from beam.data_workers import default_workers, usable_cpu_count
from beam.local_worker import failing_when_a_worker_dies
from beam.runner import runner_and_options
from components.export.export_files import LABEL_MAP_FILE
from components.export.file_formats import export_folder, is_model_file
from components.serve.batch_workers import IMAGES_PER_WORKER, image_pattern

logger = logging.getLogger(__name__)

PREDICTIONS = "predictions"
REJECTS = "rejects"
# The rejects rows' reasons: a file that cannot be read, one that is no image (or in a format the
# model does not take), an image the model cannot take (corrupt, refused by its decoder); and one
# over the pixel or byte limit every image reader shares, IMAGE_TOO_LARGE, the data step's reason.
UNREADABLE, NOT_AN_IMAGE, BAD_IMAGE = "unreadable", "not_an_image", "bad_image"
SUMMARY_FILE = "summary.json"
DRAWN_DIR = "drawn"
SUFFIX = ".jsonl"
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
BATCH = 16  # images per model call (RunInference's largest batch)


@dataclass(frozen=True)
class BatchOptions:
    model_dir: str  # output of `detpipe export`
    images: str  # a folder, a gs:// prefix or a glob
    output: str
    model_version: str = ""  # e.g. the registry version it came from
    score_threshold: float | None = None  # None: the export's
    draw: bool = False
    runner: str = "DirectRunner"
    beam_args: tuple[str, ...] = ()
    num_workers: int | None = None  # local worker processes; None: one per IMAGES_PER_WORKER, at most the CPUs


@dataclass(frozen=True)
class BatchSummary:
    """`summary.json`: counts that reconcile, read back from the files the job wrote."""

    images_in: int
    predicted: int
    rejected: int
    rejects_by_reason: dict[str, int]
    images: str
    model: str
    model_version: str
    workers: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, output: str) -> "BatchSummary":
        with FileSystems.open(f"{output.rstrip('/')}/{SUMMARY_FILE}") as handle:
            return cls(**json.loads(handle.read()))


def list_images(images: str) -> list[str]:
    """Every file `images` names, sorted (`listed_images`)."""
    return listed_images(images)[0]


def listed_images(images: str) -> tuple[list[str], int]:
    """Every file `images` names, sorted (FileSystems: local paths and gs://): a glob's
    matches, else the folder's (the prefix's) own files; and how many files its subfolders
    hold, which are left out (`--images 'DIR/**'` takes them), from the same one listing."""
    pattern = image_pattern(images)
    if pattern == images:
        return sorted(_matched_files(pattern)), 0
    folder = images.rstrip("/") + "/"
    everything = _matched_files(folder + "**")
    own = sorted(path for path in everything if "/" not in path[len(folder):])
    return own, len(everything) - len(own)


def _matched_files(pattern: str) -> list[str]:
    return [m.path for m in FileSystems.match([pattern])[0].metadata_list if not m.path.endswith("/")]


class _ReadAndCheck(beam.DoFn):
    """A path → (path, the bytes the model gets) or, tagged `rejected`, why not."""

    def process(self, path: str):
        from components.export.predictor import BadImage, NotAnImage, TooLarge, model_image_bytes

        try:
            with FileSystems.open(path, compression_type="uncompressed") as handle:
                data = read_image_file(handle)
        except FileTooLarge as err:
            yield beam.pvalue.TaggedOutput(REJECTS, {"image": path, "reason": IMAGE_TOO_LARGE, "message": str(err)})
            return
        except OSError as err:
            yield beam.pvalue.TaggedOutput(REJECTS, {"image": path, "reason": UNREADABLE,
                                                     "message": str(err).splitlines()[0]})
            return
        try:
            yield path, model_image_bytes(data)
        except BadImage as err:
            reason = (NOT_AN_IMAGE if isinstance(err, NotAnImage) else IMAGE_TOO_LARGE if isinstance(err, TooLarge)
                      else BAD_IMAGE)
            yield beam.pvalue.TaggedOutput(REJECTS, {"image": path, "reason": reason, "message": str(err)})


def limit_tf_threads(threads: int) -> None:
    """TensorFlow's thread pools in this worker process at `threads` each. Each worker
    process's TensorFlow would otherwise start a pool as wide as the machine; with one
    worker per core they contend, and the second thread of a pool mostly spins on a model
    this small (measured: 2 threads do 1.5x the work of 1 for 2x the CPU). A no-op once this
    process has run TensorFlow (the pools exist by then)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TensorFlow already ran here (e.g. one worker in the driver's process)
        logger.info("TensorFlow already initialised in this process: its thread pools stay as they are")


def tf_threads_per_worker(runner: str, workers: int, cpus: int) -> int:
    """Threads for each worker's TensorFlow pools: the CPUs shared out between the local
    worker processes; 1 on other runners (Dataflow runs one SDK process per vCPU); 0 (as
    TensorFlow chooses) for one local worker.

    >>> tf_threads_per_worker("DirectRunner", 1, 8), tf_threads_per_worker("DirectRunner", 2, 2), \
tf_threads_per_worker("DirectRunner", 3, 8), tf_threads_per_worker("DataflowRunner", 1, 2)
    (0, 1, 2, 1)
    """
    if runner != "DirectRunner":
        return 1
    return 0 if workers <= 1 else max(1, cpus // workers)


class DetectorHandler(ModelHandler):
    """RunInference's model: the exported SavedModel behind `Predictor` (as `serve`), or a
    converted file (TFLite, ONNX) behind `FilePredictor` (as `predict --model FILE`).
    Elements are (path, image bytes); results are (prediction line, image bytes)."""

    def __init__(self, model_dir: str, score_threshold: float | None, model_version: str, tf_threads: int = 0):
        super().__init__(min_batch_size=1, max_batch_size=BATCH)
        self._model_dir, self._threshold, self._version = model_dir, score_threshold, model_version
        self._tf_threads = tf_threads

    def load_model(self):
        from components.export.predictor import Predictor

        if self._tf_threads:
            limit_tf_threads(self._tf_threads)
        if is_model_file(self._model_dir):
            from components.export.file_predictor import FilePredictor

            return FilePredictor.load(self._model_dir)
        return Predictor.load(self._model_dir)

    def run_inference(self, batch: Sequence[tuple[str, bytes]], model, inference_args=None) -> Iterable:
        """A prediction line and the image's bytes for each image; for one the model cannot
        decode (it fails alone: `Predictor.predict_each`), its rejects row and None."""
        answers = model.predict_each([data for _, data in batch], self._threshold)
        return [({"image": path, "reason": BAD_IMAGE, "message": str(answer)}, None) if isinstance(answer, Exception)
                else ({"image": path, "model": self._model_dir, "model_version": self._version, **answer}, data)
                for (path, data), answer in zip(batch, answers)]


def _rejected_by_model(element):
    """RunInference's outputs: the predictions as they are, a rejects row (no image bytes) tagged."""
    line, data = element
    if data is None:
        yield beam.pvalue.TaggedOutput(REJECTS, line)
    else:
        yield element


class _Draw(beam.DoFn):
    def __init__(self, folder: str, num_classes: int):
        self._folder, self._num_classes = folder, num_classes

    def process(self, element):
        from components.serve.drawing import draw_detections

        line, data = element
        draw_detections(data, line, Path(self._folder) / f"{Path(line['image']).stem}.jpg", self._num_classes)
        yield line


def _json(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def predict_images(options: BatchOptions) -> BatchSummary:
    """Run the job; returns the summary (also written to OUTPUT/summary.json). Raises
    ValueError when `images` names no file."""
    import time

    from components.export.model_files import check_model_dir

    if is_model_file(options.model_dir):  # a converted file: it and the label map beside it
        for path in (options.model_dir, f"{export_folder(options.model_dir)}/{LABEL_MAP_FILE}"):
            if not FileSystems.exists(path):
                raise FileNotFoundError(f"{path} not found: pass a file of `detpipe export` (label_map.json beside it)")
    else:
        check_model_dir(options.model_dir)
    paths, nested = listed_images(options.images)
    recursive = f"--images '{options.images.rstrip('/')}/**'"
    if not paths:
        raise ValueError(f"no files match {image_pattern(options.images)}"
                         + (f"; its subfolders hold {nested}: {recursive} reads them" if nested else ""))
    if nested:
        logger.warning("predict: %d file(s) in subfolders of %s are not read (%s reads them too)",
                       nested, options.images, recursive)
    out = options.output.rstrip("/")
    earlier = [m.path for prefix in (PREDICTIONS, REJECTS)
               for m in FileSystems.match([f"{out}/{prefix}-*"])[0].metadata_list]
    if earlier:
        raise ValueError(f"{out} already holds predictions ({Path(earlier[0]).name}, ...): give a new or empty --output")
    if not FileSystems.exists(out):
        FileSystems.mkdirs(out)
    cpus = usable_cpu_count()
    workers = options.num_workers or default_workers(len(paths), cpus, IMAGES_PER_WORKER)
    runner, pipeline_options = runner_and_options(options.runner, options.beam_args, workers)
    if options.runner == "DirectRunner":  # Beam's --direct_num_workers among the arguments wins
        workers = pipeline_options.view_as(DirectOptions).direct_num_workers
    started = time.monotonic()
    logger.info("predict: %d files from %s with %s, %d worker process(es)", len(paths), options.images,
                options.model_dir, workers)
    try:
        _run_job(options, paths, out, workers, cpus, runner, pipeline_options)
    except BaseException:  # a failed or interrupted job: its sinks' temporary folders out of OUTPUT
        try:
            remove_sink_temporaries(out)
        except Exception as err:  # the job's own error is the one to see
            logger.warning("predict: could not remove the job's temporary folders in %s: %s", out, err)
        raise
    predicted_count = sum(1 for _ in read_lines(out, PREDICTIONS))
    rejects = [json.loads(line) for line in read_lines(out, REJECTS)]
    by_reason = collections.Counter(row["reason"] for row in rejects)
    summary = BatchSummary(images_in=len(paths), predicted=predicted_count, rejected=len(rejects),
                           rejects_by_reason=dict(sorted(by_reason.items())), images=options.images,
                           model=options.model_dir, model_version=options.model_version, workers=workers,
                           seconds=round(time.monotonic() - started, 1))
    if summary.predicted + summary.rejected != summary.images_in:
        raise RuntimeError(f"counts do not reconcile: {summary.images_in} in, {summary.predicted} predicted, "
                           f"{summary.rejected} rejected")
    with FileSystems.create(f"{out}/{SUMMARY_FILE}") as handle:
        handle.write((json.dumps(summary.to_dict(), indent=2) + "\n").encode())
    return summary


def _run_job(options: BatchOptions, paths: list[str], out: str, workers: int, cpus: int, runner,
             pipeline_options) -> None:
    with failing_when_a_worker_dies(), beam.Pipeline(runner=runner, options=pipeline_options) as p:
        checked = (p | "Images" >> beam.Create(paths, reshuffle=True)
                   | "ReadAndCheck" >> beam.ParDo(_ReadAndCheck()).with_outputs(REJECTS, main="ok"))
        answered = (checked.ok | "Detect" >> RunInference(
            DetectorHandler(options.model_dir, options.score_threshold, options.model_version,
                            tf_threads_per_worker(options.runner, workers, cpus)))
                    | "RejectedByModel" >> beam.ParDo(_rejected_by_model).with_outputs(REJECTS, main="ok"))
        predicted = answered.ok
        if options.draw:
            lines = predicted | "Draw" >> beam.ParDo(_Draw(f"{out}/{DRAWN_DIR}", _num_classes(options.model_dir)))
        else:
            lines = predicted | "Lines" >> beam.Map(lambda element: element[0])
        (lines | "PredictionJson" >> beam.Map(_json)
         | "WritePredictions" >> beam.io.WriteToText(f"{out}/{PREDICTIONS}", file_name_suffix=SUFFIX,
                                                     shard_name_template=SHARD_TEMPLATE))
        ((checked[REJECTS], answered[REJECTS]) | "AllRejects" >> beam.Flatten() | "RejectJson" >> beam.Map(_json)
         | "WriteRejects" >> beam.io.WriteToText(f"{out}/{REJECTS}", file_name_suffix=SUFFIX,
                                                 shard_name_template=SHARD_TEMPLATE))


def remove_sink_temporaries(out: str) -> list[str]:
    """Remove OUTPUT/beam-temp-{predictions,rejects}-*: the folders where Beam's text sinks
    write before moving their files into place, left behind by a job that did not finish.
    Returns what it removed."""
    import glob

    patterns = [f"{out}/beam-temp-{prefix}-*" for prefix in (PREDICTIONS, REJECTS)]
    # Beam's match lists files (on GCS there are no folders): the folders of their files,
    # and locally also a folder that is empty yet.
    found = {m.path.rsplit("/", 1)[0]
             for pattern in patterns for m in FileSystems.match([pattern + "/*"])[0].metadata_list}
    if "://" not in out:
        found |= {path for pattern in patterns for path in glob.glob(pattern)}
    found = sorted(path + "/" if "://" in out else path for path in found)  # GCS: everything under the prefix
    if found:
        FileSystems.delete(found)
    return found


def read_lines(output: str, prefix: str) -> Iterable[str]:
    """The lines of every OUTPUT/PREFIX-*.jsonl shard, shard by shard."""
    found = FileSystems.match([f"{output.rstrip('/')}/{prefix}-*-of-*{SUFFIX}"])[0].metadata_list
    for metadata in sorted(found, key=lambda m: m.path):
        with FileSystems.open(metadata.path, compression_type="uncompressed") as handle:
            for line in handle.read().decode().splitlines():
                if line.strip():
                    yield line


def _num_classes(model_dir: str) -> int:
    with FileSystems.open(f"{export_folder(model_dir)}/{LABEL_MAP_FILE}") as handle:
        return len(json.loads(handle.read()))
