"""KFP Lightweight Python components: thin adapters over the plain step functions.

Each component runs inside the project image (or, locally, the project venv), where
detpipe is installed, so nothing is pip-installed at run time. Components are made by
`make_steps(image)` rather than at import, so the image is a compile-time option and
importing this module has no side effects.
"""

from dataclasses import dataclass
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output


def validate_and_convert(
    images: str,
    annotations: str,
    data_format: str,
    val_fraction: float,
    seed: int,
    max_reject_fraction: float,
    allow_anomalies: bool,
    exif: str,
    runner: str,
    beam_options: str,
    sdk_container_image: str,
    dataset: Output[Dataset],
    stats_html: Output[HTML],
) -> NamedTuple("ConvertOutputs", [("records_in", int), ("written", int), ("rejected", int)]):
    """Check every record, write rejects, TFDV stats/schema/anomalies and sharded TFRecords."""
    import logging
    import shlex
    import shutil
    from collections import namedtuple

    from beam.convert_job import ConvertOptions, build_dataset
    from beam.dataset_gates import GateOptions

    logging.basicConfig(level=logging.INFO)
    beam_args = shlex.split(beam_options)
    if runner == "DataflowRunner":  # Dataflow workers run the same image as this step
        beam_args.append(f"--sdk_container_image={sdk_container_image}")
    result = build_dataset(ConvertOptions(
        images=images, annotations=annotations, output=dataset.path, format=data_format,
        val_fraction=val_fraction, seed=seed, allow_anomalies=allow_anomalies, exif=exif,
        gates=GateOptions(max_reject_fraction=max_reject_fraction), runner=runner, beam_args=tuple(beam_args)))
    m = result.manifest
    dataset.metadata.update({"records_in": m["records_in"], "written": m["written_total"],
                             "rejected": m["rejected"], "num_classes": m["num_classes"]})
    if not result.ok:
        raise RuntimeError("dataset anomalies (feature | problem | detail):\n" + "\n".join(result.anomalies))
    shutil.copyfile(f"{dataset.path}/stats.html", stats_html.path)
    return namedtuple("ConvertOutputs", ["records_in", "written", "rejected"])(
        m["records_in"], m["written_total"], m["rejected"])


def probe(data: Input[Dataset], require_gpu: bool, image_size: int, model_size: str, batch_size: str,
          report: Output[Markdown], probe_json: Output[Artifact]) -> NamedTuple(
        "ProbeOutputs", [("verdict", str), ("largest_safe_batch", int), ("mixed_precision", str),
                         ("input_parallelism", int)]):
    """Check the training machine (and read speed of the shards); fails the run on FAIL.
    Its outputs tell the train step a starting batch, the precision and the parallelism."""
    import logging
    from collections import namedtuple
    from pathlib import Path

    from components.probe.checks import Expectations
    from components.probe.probe_report import run_probe, write_probe

    logging.basicConfig(level=logging.INFO)
    expect = Expectations.from_train_options(image_size, model_size, batch_size, data_dir=data.path)
    result = run_probe(require_gpu=require_gpu, data_dir=data.path, output_dir=str(Path(report.path).parent),
                       expect=expect)
    write_probe(result, Path(probe_json.path), Path(report.path))
    if result.verdict == "FAIL":
        raise RuntimeError("probe FAIL: " + "; ".join(f"{c.reason} -> {c.fix}" for c in result.checks
                                                       if c.status == "FAIL"))
    rec = result.recommendations
    return namedtuple("ProbeOutputs", ["verdict", "largest_safe_batch", "mixed_precision", "input_parallelism"])(
        result.verdict, rec["largest_safe_batch"] or 0, rec["mixed_precision"], rec["input_parallelism"])


def tune_hyperparameters(data: Input[Dataset], probe_safe_batch: int, probe_precision: str, probe_parallelism: int,
                         trials: int, trial_steps: int, batch_size: str, image_size: int, model_size: str, seed: int,
                         hparams: Output[Artifact], report: Output[Markdown]) -> float:
    """Search learning rate, weight decay and augmentation strength on short trials
    (`trials` 0: no search, the defaults). Returns the best val mAP (-1 without a search:
    KFP metadata and outputs cannot hold NaN)."""
    import logging
    import math
    import shutil

    from components.train.trainer import ProbeAdvice
    from components.train.tuning import REPORT_FILE, TuneConfig, tune

    logging.basicConfig(level=logging.INFO)
    advice = ProbeAdvice(safe_batch=probe_safe_batch or None, precision=probe_precision,
                         input_parallelism=probe_parallelism)
    result = tune(TuneConfig(data_dir=data.path, output_dir=hparams.path, trials=trials, trial_steps=trial_steps,
                             seed=seed, train={"batch_size": batch_size, "image_size": image_size,
                                               "model_size": model_size, "probe": advice}))
    best_map = result.best_score if math.isfinite(result.best_score) else -1.0
    hparams.metadata.update({**result.best, "best_map": best_map, "trials": len(result.trials)})
    shutil.copyfile(f"{hparams.path}/{REPORT_FILE}", report.path)
    return best_map


def train(data: Input[Dataset], hparams: Input[Artifact], probe_verdict: str, probe_safe_batch: int,
          probe_precision: str, probe_parallelism: int, epochs: int, batch_size: str, image_size: int,
          model_size: str, seed: int, model: Output[Model], report: Output[Markdown]) -> float:
    """Train the detector with the tune step's hyperparameters; returns training images per second."""
    import logging
    import shutil

    from components.train.trainer import REPORT_FILE, ProbeAdvice, TrainConfig, train_detector
    from components.train.tuning import BEST_FILE, load_hparams

    logging.basicConfig(level=logging.INFO)
    logging.info("probe verdict before training: %s", probe_verdict)
    advice = ProbeAdvice(safe_batch=probe_safe_batch or None, precision=probe_precision,
                         input_parallelism=probe_parallelism)
    result = train_detector(TrainConfig(data_dir=data.path, output_dir=model.path, epochs=epochs,
                                        batch_size=batch_size, image_size=image_size, model_size=model_size,
                                        seed=seed, probe=advice, **load_hparams(f"{hparams.path}/{BEST_FILE}")))
    model.metadata.update({"images_per_second": result.images_per_second, "batch_size": result.batch_size,
                           "micro_batch_size": result.micro_batch_size,
                           **{f"decision/{k}": v for k, v in result.decisions.items()}})
    shutil.copyfile(f"{model.path}/{REPORT_FILE}", report.path)
    return result.images_per_second


def evaluate(model: Input[Model], data: Input[Dataset], min_map: float, metrics: Output[Metrics],
             report: Output[Markdown], metrics_json: Output[Artifact]) -> float:
    """COCO metrics on the val split; fails below `min_map`. Returns mAP@[.5:.95]."""
    import logging
    import os
    import shutil

    from components.evaluate.evaluator import METRICS_FILE, REPORT_FILE, evaluate_detector

    logging.basicConfig(level=logging.INFO)
    out = os.path.dirname(metrics_json.path) + "/evaluation"
    result = evaluate_detector(model.path, data.path, out, min_map=min_map)
    for key, value in result.metrics.items():
        metrics.log_metric(key, value)
    shutil.copyfile(f"{out}/{REPORT_FILE}", report.path)
    shutil.copyfile(f"{out}/{METRICS_FILE}", metrics_json.path)
    return result.metrics["mAP"]


def export(model: Input[Model], metrics_json: Input[Artifact], saved_model: Output[Model]) -> float:
    """A SavedModel with an image-bytes signature, the evaluation's F1-best score threshold
    as its default. Returns that threshold."""
    import logging

    from components.export.saved_model import export_trained

    logging.basicConfig(level=logging.INFO)
    config = export_trained(model.path, saved_model.path, metrics_file=metrics_json.path)
    saved_model.metadata.update({
        "framework": "tensorflow", "format": "SavedModel", "signature": config.signature,
        "input_name": config.input_name, "score_threshold": config.score_threshold,
        "threshold_source": config.threshold_source, "max_detections": config.max_detections,
        "serving_command": "detpipe serve (AIP_STORAGE_URI names this folder)"})
    return config.score_threshold


@dataclass(frozen=True)
class Steps:
    validate_and_convert: object
    probe: object
    tune_hyperparameters: object
    train: object
    evaluate: object
    export: object


def make_steps(image: str) -> Steps:
    """The components with `image` as their base image."""
    def component(func):
        return dsl.component(func, base_image=image, install_kfp_package=False)

    return Steps(*(component(f) for f in (validate_and_convert, probe, tune_hyperparameters, train, evaluate,
                                          export)))
