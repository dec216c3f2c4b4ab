"""KFP Lightweight Python components: thin adapters over the plain step functions.

Each component runs inside the project image (or, locally, the project venv), where
detpipe is installed, so nothing is pip-installed at run time. Components are made by
`make_steps(image, training)` rather than at import, so the image is a compile-time option,
the training settings come from their declaration (kfp_settings.py), and importing this
module has no side effects.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple

from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel
from kfp import dsl
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

from components.train.refit_choice import REFIT_NOTE
from components.train.stopped_short import SHORT_OF_PLATEAU
from pipeline.kfp_settings import with_settings

# What each finished step shows on its console line (`detpipe run --local`), from its output
# parameters ({"Output": return value, or the named outputs}); declared after each step.
KEY_FIGURES: dict[str, Callable[[dict], str]] = {}


def fingerprint_source(images: str, annotations: str, split_file: str, val_annotations: str, val_images: str,
                       registry: str, model_name: str, pipeline_root: str, source: Output[Artifact]) -> NamedTuple(
        "SourceOutputs", [("fingerprint", str), ("registry", str), ("champion", str), ("unchanged", str)]):
    """List the dataset's files (never cached): their fingerprint is in the data step's
    cache key, so new images retrain. Also resolves the registry and its champion now, and
    says (`unchanged`) when the files are the ones the champion was trained on."""
    import json
    import logging
    from collections import namedtuple

    from components.fingerprint.fingerprint import fingerprint_source as fingerprint
    from components.fingerprint.fingerprint import unchanged_data_line
    from components.model_registry.registry import Registry, resolve_registry
    from pipeline.step_exit import start_step

    start_step()
    found = fingerprint(images, annotations, split_file=split_file, val_annotations=val_annotations,
                        val_images=val_images)
    registry = resolve_registry(registry, pipeline_root)
    opened = Registry.open(registry, model_name)
    champion = opened.champion_version()
    unchanged = unchanged_data_line(champion, opened.version(champion).get("fingerprint") or {}, found.sha256) \
        if champion else ""
    if unchanged:
        logging.warning("%s", unchanged)
    with open(source.path, "w") as handle:
        given = {"val_annotations_path": val_annotations, "val_images_path": val_images or images} \
            if val_annotations else {}
        json.dump({**found.to_dict(), "images_path": images, "annotations_path": annotations, **given}, handle,
                  indent=2)
    source.metadata.update({**found.to_dict(), "registry": registry, "champion": champion or "none"})
    return namedtuple("SourceOutputs", ["fingerprint", "registry", "champion", "unchanged"])(
        found.sha256, registry, champion, unchanged)


KEY_FIGURES["fingerprint-source"] = lambda out: f"champion {out.get('champion') or 'none'}" + (
    f"; unchanged data ({out['champion']}'s files)" if out.get("unchanged") else "")


def validate_and_convert(
        images: str, annotations: str, source_fingerprint: str, registry: str, model_name: str, data_format: str,
        val_fraction: float, split_file: str, val_annotations: str, val_images: str, bad_box: str, seed: int,
        max_reject_fraction: float, allow_anomalies: bool, allow_new_classes: bool, drift_threshold: float, exif: str,
        tile: str, data_runner: str, dataflow: dict, beam_options: str, sdk_container_image: str, cloud: str,
        dataset: Output[Dataset], stats_html: Output[HTML], gcp_resources: dsl.OutputPath(str),
) -> NamedTuple("ConvertOutputs", [("records_in", int), ("written", int), ("rejected", int)]):
    """Check every record, write rejects, TFDV stats/schema/anomalies and sharded TFRecords;
    with a champion, validate against its schema and check drift against its statistics.
    The champion is looked up here, not passed in: the cache key is the source fingerprint
    and the options, so unchanged data is not converted (and retrained) again only because
    the champion moved. On Dataflow (`data_runner`), the job is the step's `gcp_resources` (the
    console links it) and a stopped step cancels it; `cloud` (CloudSettings) labels and keys it."""
    import tempfile
    from collections import namedtuple
    from functools import partial

    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions, GateOptions, with_champion
    from beam.runner import step_beam_args
    from components.cloud.job_cancel import held_dataflow_job, no_gcp_resources
    from components.cloud.resources import CloudSettings
    from components.detector.tile_counts import count_tiles
    from components.model_registry.registry import Registry
    from components.report.run_report import write_dataset_page
    from pipeline.step_exit import start_step

    start_step()
    no_gcp_resources(gcp_resources)  # replaced by the job's when one starts
    settings = CloudSettings.from_json(cloud)
    hold = None if data_runner == "DirectRunner" else held_dataflow_job(
        gcp_resources, dataflow["dataflow_project"], dataflow["dataflow_region"])
    gates = GateOptions(max_reject_fraction=max_reject_fraction, drift_threshold=drift_threshold,
                        allow_new_classes=allow_new_classes)
    with tempfile.TemporaryDirectory() as tmp:
        champion, files, base = Registry.open(registry, model_name).champion_data(tmp)
        result = build_dataset(ConvertOptions(
            images=images, annotations=annotations, output=dataset.path, data_format=data_format,
            val_fraction=val_fraction, split_file=split_file or None, val_annotations=val_annotations or None,
            val_images=val_images or None, bad_box=bad_box, seed=seed,
            allow_anomalies=allow_anomalies, exif=exif,
            overwrite=True,  # the step's own artifact folder: a retry replaces the failed attempt's files
            base_label_map=base, gates=with_champion(gates, files, champion) if champion else gates,
            runner=data_runner,
            beam_args=step_beam_args(beam_options, data_runner, sdk_container_image, dataflow, settings)),
            count_tiles=partial(count_tiles, mode=tile), hold_job=hold)
    m = result.manifest
    dataset.metadata.update({"records_in": m.records_in, "written": m.written_total, "rejected": m.rejected,
                             "boxes_written": sum(c.written for c in m.boxes.values()),
                             "boxes_rejected": sum(c.rejected for c in m.boxes.values()),
                             "num_classes": m.num_classes, "source_fingerprint": source_fingerprint,
                             "checked_against": champion or "none"})
    if not result.ok:
        raise RuntimeError("dataset anomalies (feature | problem | detail):\n" + "\n".join(result.anomalies))
    write_dataset_page(dataset.path, stats_html.path)  # self-contained; TFDV's page stays in the dataset folder
    return namedtuple("ConvertOutputs", ["records_in", "written", "rejected"])(m.records_in, m.written_total, m.rejected)


KEY_FIGURES["validate-and-convert"] = lambda out: (f"{out.get('written', '?')} written, "
                                                   f"{out.get('rejected', '?')} rejected")


def probe(data: Input[Dataset], require_gpu: bool, probe_dry_run: bool, settings: dict, report: Output[Markdown],
          probe_json: Output[Artifact]) -> str:
    """Check the training machine (and read speed of the shards), and run a few steps of the
    real training there (the dry run, with the training settings; not with `probe_dry_run`
    false); fails the run on FAIL.
    `probe_json` tells tune and train a starting batch, the precision and the parallelism.
    Returns the verdict."""
    from pathlib import Path

    from components.probe.probe_report import probe_with_data, write_probe
    from components.train.config import TrainConfig
    from pipeline.step_exit import start_step

    start_step()
    dry_run = TrainConfig(data_dir=data.path, output_dir="", **settings)
    result = probe_with_data(data.path, settings, dry_run=dry_run,
                             dry_run_off="" if probe_dry_run else "probe_dry_run false", require_gpu=require_gpu,
                             output_dir=str(Path(report.path).parent))
    write_probe(result, Path(probe_json.path), Path(report.path))
    if result.verdict == "FAIL":
        raise RuntimeError("probe FAIL: " + "; ".join(f"{c.reason} -> {c.fix}" for c in result.checks
                                                       if c.status == "FAIL"))
    return result.verdict


KEY_FIGURES["probe"] = lambda out: str(out.get("Output", ""))


def tune_hyperparameters(data: Input[Dataset], probe_json: Input[Artifact], tune_trials: str, tune_trial_epochs: int,
                         tune_parallel_trials: int, tune_backend: str, trial_machine: str,
                         vertex_region: str, pipeline_root: str, cloud: str, settings: dict, hparams: Output[Artifact],
                         report: Output[Markdown], gcp_resources: dsl.OutputPath(str)
                         ) -> NamedTuple("TuneOutputs", [("tuning_map", float), ("summary", str)]):
    """Search learning rate, weight decay and augmentation strength with trials scored on images
    held out of train (components/tune), each trial the training of `settings` shortened, their
    `base_lr_per_64`, `weight_decay` and `augment_strength` the first trial (`tune_trials` 0, or `auto` deciding against a search:
    those values). `tune_backend` vertex (or auto on Vertex AI): the trials as a Vertex AI tuning
    job on `trial_machine` (the training's, JSON) in `vertex_region`. The search's study and trials
    are kept under `pipeline_root` (search.WORK_DIR): a run stopped in this step and run again
    continues the search. A Vertex AI tuning job is the step's `gcp_resources` (the console links
    it), cancelled when the step is stopped, and carries `cloud`'s labels and key. Returns the winner's mAP on the
    tuning split (-1 without a search: KFP metadata and outputs cannot hold NaN) and a line saying
    what the search decided, cost and gained."""
    import math
    import shutil
    from collections import namedtuple

    from components.cloud.job_cancel import no_gcp_resources
    from components.train.config import ProbeAdvice  # no TensorFlow: without trials the step only writes the defaults
    from components.tune.hparams_file import SEARCH_SPACE
    from components.tune.search import WORK_DIR, TuneConfig, tune
    from components.tune.tune_report import REPORT_FILE
    from components.tune.vertex_job import fuse_path
    from pipeline.step_exit import start_step

    start_step()
    no_gcp_resources(gcp_resources)  # replaced by the tuning job's when one starts
    advice = ProbeAdvice.from_probe_file(probe_json.path)
    result = tune(TuneConfig(data_dir=data.path, output_dir=hparams.path, trials=tune_trials,
                             trial_epochs=tune_trial_epochs, parallel=tune_parallel_trials,
                             backend=tune_backend, trial_machine=trial_machine, vertex_region=vertex_region,
                             cloud=cloud, gcp_resources=gcp_resources, seed=settings["seed"],
                             work_dir=fuse_path(f"{pipeline_root.rstrip('/')}/{WORK_DIR}"),
                             train={**settings, "probe": advice},
                             start={name: settings[name] for name in SEARCH_SPACE}))
    best = result.best
    score = best.score if best.score is not None and math.isfinite(best.score) else -1.0
    hparams.metadata.update({**best.hparams, "tuning_map": score, "trials": best.trials, "decision": best.decision,
                             **({"gain_over_defaults": round(best.gain, 4)} if best.gain is not None else {})})
    shutil.copyfile(f"{hparams.path}/{REPORT_FILE}", report.path)
    # One console line (the report has the rest): what the search cost and gained, or why none ran.
    summary = (f"{best.trials} trials ({best.search['cost']:.1f}x): "
               f"{'n/a' if best.gain is None else f'{best.gain:+.3f}'} vs defaults"
               if best.trials else f"defaults ({result.budget.short})")
    return namedtuple("TuneOutputs", ["tuning_map", "summary"])(score, summary)


KEY_FIGURES["tune-hyperparameters"] = lambda out: str(out.get("summary", ""))


def train(data: Input[Dataset], hparams: Input[Artifact], probe_json: Input[Artifact], registry: str, model_name: str,
          warm_start: str, settings: dict, model: Output[Model], report: Output[Markdown]) -> NamedTuple(
        "TrainOutputs", [("images_per_second", float), ("started_from", str), ("length", str)]):
    """Train the detector with the training `settings`, the tune step's hyperparameters over
    theirs, in the time budget the search left; with `warm_start` auto (or a
    version) from the champion's (that version's) weights when they can be continued.
    Returns training images per second, the version it started from ("" for scratch) and how
    long it trained and why it stopped (one line).
    The champion is looked up here, not passed in (as in the data step): the cache key is
    the data and the options, so unchanged data is not retrained only because the
    champion moved."""
    import os
    import shutil
    import tempfile
    from collections import namedtuple

    from components.detector.artifacts import REPORT_FILE, TENSORBOARD_DIR
    from components.model_registry.registry import Registry
    from components.model_registry.vertex_experiment import experiment_name
    from components.model_registry.warm_source import warm_source
    from components.train.tensorboard_upload import TENSORBOARD_ENV, upload_curves
    from components.train.time_budget import budget_after
    from components.train.refit import train_and_refit
    from components.train.trainer import ProbeAdvice, TrainConfig
    from components.tune.hparams_file import BEST_FILE, load_hparams, search_seconds
    from pipeline.step_exit import start_step

    start_step()
    advice = ProbeAdvice.from_probe_file(probe_json.path)
    with tempfile.TemporaryDirectory() as fetched:
        models = Registry.open(registry, model_name)
        source = warm_source(warm_start, models, models.champion_version(), fetched)
        settings.update(load_hparams(f"{hparams.path}/{BEST_FILE}"))  # the tune step's values win
        # The search and the training share the time budget: the training gets what the search left.
        settings["time_budget"] = budget_after(settings["time_budget"], search_seconds(f"{hparams.path}/{BEST_FILE}"),
                                               bool(advice.gpus))
        result = train_and_refit(TrainConfig(data_dir=data.path, output_dir=model.path, probe=advice,
                                             init_from=source.folder, init_name=source.name,
                                             init_champion=warm_start == "auto", init_note=source.note, **settings))
    started_from = source.version if result.warm_start["used"] else ""
    outputs = namedtuple("TrainOutputs", ["images_per_second", "started_from", "length"])(
        result.images_per_second, started_from, result.length_line)
    if not result.is_chief:  # another replica of a custom job: the chief's files are not there yet
        return outputs
    if os.environ.get(TENSORBOARD_ENV):  # a task (a custom job's curves went to AIP_TENSORBOARD_LOG_DIR)
        upload_curves(os.environ[TENSORBOARD_ENV], f"{model.path}/{TENSORBOARD_DIR}", experiment_name(model_name))
    model.metadata.update({"images_per_second": result.images_per_second, "train_seconds": result.seconds,
                           "epochs": result.epochs, "batch_size": result.batch_size,
                           "micro_batch_size": result.micro_batch_size,
                           "warm_start": result.warm_start["line"],
                           **{f"shape/{k}": v for k, v in result.shape.items()},
                           **{f"decision/{k}": v for k, v in result.decisions.items()}})
    shutil.copyfile(f"{model.path}/{REPORT_FILE}", report.path)
    return outputs


def _train_figure(out: dict) -> str:
    """The train step's console phrase: images/s, how long it trained and why it stopped (from
    TrainResult.length_line, in a few words), where it started: `123.1 images/s, 24 epochs: plateau`,
    `143.5 images/s, 1 epoch: budget, from v1` (short enough for an 80-column line)."""
    rate, source = f"{out.get('images_per_second', 0):.1f} images/s", out.get("started_from", "")
    if not out.get("length"):  # a run of an earlier version
        return f"{rate}, " + (f"warm start from {source}" if source else "from scratch")
    trained, _, why = out["length"].partition(", stopped: ")
    return (f"{rate}, {trained.split(' (')[0]}: {why.split(':')[0]}" + (", refit" if REFIT_NOTE in why else "")
            + (", short" if why.endswith(SHORT_OF_PLATEAU) else "")
            + (f", from {source}" if source else ""))


KEY_FIGURES["train"] = _train_figure


def evaluate(model: Input[Model], data: Input[Dataset], registry: str, model_name: str, champion: str,
             rule: dict, seed: int, metrics: Output[Metrics],
             confusion_matrix: Output[ClassificationMetrics], report: Output[Markdown],
             metrics_json: Output[Artifact], decision: Output[Artifact], evaluation: Output[Artifact]) -> float:
    """COCO metrics on the val split; the champion's SavedModel re-scored on the same images,
    a bootstrap interval of the difference and the promotion decision. Returns mAP@[.5:.95].
    `metrics` carries the figures Vertex AI Experiments compares runs by (with the training's
    cost, from the model's metadata), `confusion_matrix` the matrix its console draws. `rule`:
    the promotion rule's parameters (PromotionRule)."""
    import shutil

    from components.evaluate.champion import evaluate_against_champion
    from components.evaluate.evaluator import REPORT_FILE
    from components.evaluate.metrics_file import METRICS_FILE
    from components.evaluate.pictures import CONFUSION_DATA_FILE, read_confusion
    from components.model_registry.decision import DECISION_FILE, PromotionRule
    from pipeline.step_exit import start_step

    start_step()
    out = evaluation.path  # metrics, report, pictures, decision
    result, record = evaluate_against_champion(
        model.path, data.path, out, PromotionRule(**rule), registry=registry,
        model_name=model_name, champion=champion, seed=seed)
    for key, value in result.metrics.items():
        metrics.log_metric(key, value)
    for key, value in (record.delta or {}).get("mAP", {}).items():
        metrics.log_metric(f"vs_champion/mAP_{key}", value)
    metrics.log_metric("blessed", 1.0 if record.blessed else 0.0)
    for key in ("train_seconds", "images_per_second"):  # what the training cost
        if key in model.metadata:
            metrics.log_metric(f"train/{key}", float(model.metadata[key]))
    confusion_matrix.log_confusion_matrix(*read_confusion(f"{out}/{CONFUSION_DATA_FILE}"))
    decision.metadata.update({"verdict": record.verdict, "reason": record.reason,
                              "champion": (record.champion or {}).get("version", "none")})
    shutil.copyfile(f"{out}/{REPORT_FILE}", report.path)
    shutil.copyfile(f"{out}/{METRICS_FILE}", metrics_json.path)
    shutil.copyfile(f"{out}/{DECISION_FILE}", decision.path)
    return result.metrics["mAP"]


KEY_FIGURES["evaluate"] = lambda out: f"mAP {out.get('Output', 0):.3f}"


def review(model: Input[Model], data: Input[Dataset], evaluation: Input[Artifact], label_review: Output[Artifact],
           review_page: Output[HTML]) -> str:
    """The val labels most likely wrong (missing, wrong-class, misplaced, duplicate boxes), from
    the detections evaluation made (no second prediction pass): label_review.jsonl and
    label_review.html in `label_review`, the page again as `review_page` (the console shows it).
    Returns the summary line."""
    import shutil

    from components.review.review import PAGE_FILE, review_model
    from pipeline.step_exit import start_step

    start_step()
    result = review_model(model.path, data.path, label_review.path, evaluation_dir=evaluation.path)
    shutil.copyfile(f"{label_review.path}/{PAGE_FILE}", review_page.path)
    label_review.metadata.update({"flagged": result.flagged, "images": result.images, "confident": result.confident,
                                  "judged_ap50": result.ap50, "too_weak": result.weak})
    return result.summary


KEY_FIGURES["review"] = lambda out: str(out.get("Output", "")).split(":")[0]


def export(model: Input[Model], metrics_json: Input[Artifact], data: Input[Dataset], settings: dict,
           saved_model: Output[Model]) -> NamedTuple("ExportOutputs", [("threshold", float), ("formats", str)]):
    """A SavedModel with an image-bytes signature, the evaluation's F1-best score threshold
    as its default; beside it, each file `export_formats` asks for, re-scored on the val split
    and kept (so registered) only within its tolerance (export_report.md). Returns that
    threshold and one line on the files. `settings`: the export_* parameters (ExportSettings)."""
    from collections import namedtuple

    from components.export.converted import export_files
    from components.export.file_formats import ExportSettings
    from components.export.rescore import files_line
    from components.evaluate.metrics_file import chosen_threshold
    from components.export.saved_model import export_trained
    from pipeline.step_exit import start_step

    start_step()
    config = export_trained(model.path, saved_model.path, *chosen_threshold(metrics_json.path))
    chosen = ExportSettings.from_parameters(settings)
    converted = chosen.converted()
    scores, errors = ([], {}) if not converted else export_files(model.path, converted, saved_model.path, data.path,
                                                                 chosen)
    saved_model.metadata.update({
        "framework": "tensorflow", "format": "SavedModel", "signature": config.signature,
        "input_name": config.input_name, "score_threshold": config.score_threshold,
        "threshold_source": config.threshold_source, "max_detections": config.max_detections,
        "serving_command": "detpipe serve (AIP_STORAGE_URI names this folder)",
        "converted_files": {score.kind: score.passed for score in scores}})
    outputs = namedtuple("ExportOutputs", ["threshold", "formats"])
    return outputs(config.score_threshold, files_line(scores, errors))


KEY_FIGURES["export"] = lambda out: f"threshold {out.get('threshold', 0):.2f}" + (
    f"; {out['formats']}" if out.get("formats") else "")


def register(saved_model: Input[Model], model: Input[Model], metrics_json: Input[Artifact], decision: Input[Artifact],
             data: Input[Dataset], source: Input[Artifact], registry: str, model_name: str, vertex_model: str,
             vertex_region: str, vertex_endpoint: str, endpoint_machine_type: str, endpoint_accelerator: str,
             endpoint_min_replicas: int, endpoint_max_replicas: int, serving_image: str, run_id: str,
             experiment: str, pipeline_job: str, cloud: str, uploaded_model: Output[VertexModel],
             serving_endpoint: Output[VertexEndpoint]) -> NamedTuple(
        "RegisterOutputs", [("version", str), ("status", str), ("champion", str)]):
    """Record the version in the registry (with the trained weights, for warm starts); the
    champion moves only when blessed. With `vertex_model`, also a Vertex AI Model Registry
    version (`uploaded_model`, GCPC's google.VertexModel, which links the run to it in Vertex
    AI's lineage) and, with `vertex_endpoint` for a blessed one, the endpoint it serves behind
    (`serving_endpoint`, google.VertexEndpoint); without, they name nothing (resourceName "").
    With `experiment`, this run (`pipeline_job`) joins that Vertex AI experiment. What is created
    on Vertex AI carries `cloud`'s labels (CloudSettings, with the run's) and key.
    Fails the run (after recording) when the challenger is below min_map."""
    import json
    from collections import namedtuple

    from components.cloud.resources import CloudSettings
    from components.model_registry.decision import DecisionRecord
    from components.register.register import register_and_upload
    from components.model_registry.vertex_endpoint import EndpointSpec
    from components.model_registry.vertex_model import resource_uri
    from pipeline.step_exit import start_step

    start_step()
    verdict = DecisionRecord.read(decision.path)
    with open(source.path) as handle:
        fingerprint = json.load(handle)
    done = register_and_upload(registry, model_name, saved_model.path, data.path, metrics_json.path, verdict,
                               fingerprint, run_id, train_dir=model.path, vertex_model=vertex_model, vertex_region=vertex_region,
                               serving_image=serving_image, endpoint=EndpointSpec.parse(
                                   vertex_endpoint, endpoint_machine_type, endpoint_accelerator,
                                   endpoint_min_replicas, endpoint_max_replicas), cloud=CloudSettings.from_json(cloud))
    if experiment:
        from components.model_registry.vertex_experiment import join_experiment

        join_experiment(experiment, pipeline_job)
    for artifact, name in ((uploaded_model, done.vertex_model), (serving_endpoint, done.vertex_endpoint)):
        artifact.metadata["resourceName"] = name  # GCPC's key, read by its own components downstream
        if name:
            artifact.uri = resource_uri(name)
    if verdict.below_min_map:
        raise RuntimeError(f"gate failed: {verdict.reason} (recorded as {done.version}, rejected)")
    return namedtuple("RegisterOutputs", ["version", "status", "champion"])(done.version, done.status, done.champion)


KEY_FIGURES["register"] = lambda out: f"{out.get('version', '?')} {out.get('status', '')}"


def report(data: Input[Dataset], probe_json: Input[Artifact], hparams: Input[Artifact], model: Input[Model], evaluation: Input[Artifact],
           label_review: Input[Artifact], decision: Input[Artifact], saved_model: Input[Model], version: str, status: str,
           champion: str, run_id: str, run_report: Output[HTML]):
    """One self-contained HTML page about the run (what the Vertex AI console shows)."""
    from components.report.run_report import RunInputs, write_run_report
    from pipeline.step_exit import start_step

    start_step()
    write_run_report(RunInputs(
        dataset_dir=data.path, probe_json=probe_json.path, tune_dir=hparams.path, train_dir=model.path,
        evaluation_dir=evaluation.path, review_dir=label_review.path, decision_json=decision.path,
        export_dir=saved_model.path, registered={"version": version, "status": status, "champion": champion},
        title=f"detpipe run {run_id}"), run_report.path)


@dataclass(frozen=True)
class Steps:
    fingerprint_source: object
    validate_and_convert: object
    probe: object
    tune_hyperparameters: object
    train: object
    evaluate: object
    review: object
    export: object
    register: object
    report: object


def make_steps(image: str, training: dict[str, type], dataflow: dict[str, type], export_settings: dict[str, type],
               rule: dict[str, type]) -> Steps:
    """The components with `image` as their base image; the probe, tune and train steps take
    the `training` settings (name → type: pipeline/params.py's TRAINING) as their `settings`,
    the data step the Dataflow settings (DATAFLOW) as its `dataflow`, the export step the
    export settings (EXPORT) as its `settings`, the evaluate step the promotion rule's (RULE)
    as its `rule`."""
    def component(func):
        return dsl.component(func, base_image=image, install_kfp_package=False)

    def declared(func):
        if func in (probe, tune_hyperparameters, train):
            return with_settings(func, training)
        if func is export:
            return with_settings(func, export_settings)
        if func is evaluate:
            return with_settings(func, rule, "rule")
        return with_settings(func, dataflow, "dataflow") if func is validate_and_convert else func

    return Steps(*(component(declared(f))
                   for f in (fingerprint_source, validate_and_convert, probe, tune_hyperparameters, train, evaluate,
                             review, export, register, report)))
