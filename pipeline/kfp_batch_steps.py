"""The KFP component of the batch-predict pipeline (pipeline/batch_dag.py): a thin adapter
over components/serve/batch_job.py, with the model resolved from the registry at run time."""

from typing import NamedTuple

from kfp.dsl import Dataset, Output


def batch_predict(images: str, registry: str, model_name: str, version: str, pipeline_root: str,
                  score_threshold: float, runner: str, dataflow: dict, beam_options: str,
                  sdk_container_image: str, cloud: str, predictions: Output[Dataset]) -> NamedTuple(
        "BatchOutputs", [("version", str), ("images_in", int), ("predicted", int), ("rejected", int)]):
    """Predict every image under `images` with the registry's champion (or `version`),
    looked up when the run starts; predictions, rejects and summary.json in `predictions`.
    `score_threshold` below 0: the export's. On Dataflow the job carries `cloud`'s labels (CloudSettings,
    with the run's) and key."""
    import logging
    from collections import namedtuple

    from beam.runner import step_beam_args
    from components.cloud.resources import CloudSettings
    from components.model_registry.registry import SAVED_MODEL_DIR, Registry, RegistryError, resolve_registry
    from components.serve.batch_job import BatchOptions, predict_images

    logging.basicConfig(level=logging.INFO)
    models = Registry.open(resolve_registry(registry, pipeline_root), model_name)
    if version:
        models.version(version)  # RegistryError (one line) when there is no such version
    chosen = version or models.champion_version()
    if not chosen:
        raise RegistryError(f"no champion in {models.uri} and no version given: nothing to predict with")
    # The model is read where the registry keeps it (Dataflow's workers cannot see this step's disk).
    summary = predict_images(BatchOptions(
        model_dir=models.path(chosen, SAVED_MODEL_DIR), images=images, output=predictions.path, model_version=chosen,
        score_threshold=None if score_threshold < 0 else score_threshold, runner=runner,
        beam_args=step_beam_args(beam_options, runner, sdk_container_image, dataflow, CloudSettings.from_json(cloud))))
    predictions.metadata.update({"model_version": chosen, "images_in": summary.images_in,
                                 "predicted": summary.predicted, "rejected": summary.rejected,
                                 "registry": models.uri})
    return namedtuple("BatchOutputs", ["version", "images_in", "predicted", "rejected"])(
        chosen, summary.images_in, summary.predicted, summary.rejected)
