"""The detpipe DAG: validate-and-convert → probe → tune → train → evaluate → export.

Linear on purpose: kfp's local runner has no dsl.If/ParallelFor/ExitHandler, and a
gate is a component that fails (evaluate's `min_map`). So the tune step is always
there; with `tune_trials` 0 (the default) it only writes the default hyperparameters. Machine resources are
compile-time options (`StepResources`); the local runner ignores them.
"""

from dataclasses import dataclass

from kfp import dsl

from components.kfp_steps import make_steps

PIPELINE_NAME = "detpipe"
# The project image (infra/Dockerfile); set the pushed tag with `detpipe compile --image`.
DEFAULT_IMAGE = "detpipe:latest"


@dataclass(frozen=True)
class StepResources:
    """Machines for the steps on Vertex AI. The probe runs on the training machine type,
    so it checks the machine training will get."""

    data_cpu: str = "4"
    data_memory: str = "16G"
    accelerator_type: str = "NVIDIA_TESLA_T4"
    accelerator_count: int = 1
    train_cpu: str = "8"
    train_memory: str = "32G"
    evaluate_on_gpu: bool = False
    train_retries: int = 2  # safe on preemption: training resumes from its checkpoints


def _on_accelerator(task, resources: StepResources):
    return (task.set_cpu_limit(resources.train_cpu).set_memory_limit(resources.train_memory)
            .set_accelerator_type(resources.accelerator_type).set_accelerator_limit(resources.accelerator_count))


def make_pipeline(image: str = DEFAULT_IMAGE, resources: StepResources = StepResources()):
    """The @dsl.pipeline function with every step on `image`."""
    steps = make_steps(image)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Validate and convert a labelled image dataset, probe the training machine, "
                    "train a KerasHub RetinaNet and evaluate it with COCO metrics.",
    )
    def detpipe(
        images: str,
        annotations: str,
        data_format: str = "voc",
        val_fraction: float = 0.2,
        seed: int = 0,
        max_reject_fraction: float = 0.1,
        allow_anomalies: bool = False,
        exif: str = "auto",
        data_runner: str = "DirectRunner",
        beam_options: str = "",
        epochs: int = 10,
        batch_size: str = "auto",
        image_size: int = 128,
        model_size: str = "tiny",
        min_map: float = 0.0,
        require_gpu: bool = False,
        tune_trials: int = 0,
        tune_trial_steps: int = 100,
    ):
        """Train and evaluate an object detector on a labelled image dataset.

        Args:
            images: Folder of images, local path or gs:// URI.
            annotations: VOC folder of *.xml, COCO instances JSON, or CSV (filename,width,height,class,xmin,ymin,xmax,ymax).
            data_format: voc, coco or csv.
            val_fraction: Share of images for validation (hash of the image id).
            seed: Seed of the split and of training.
            max_reject_fraction: Fail the data step when more records than this are rejected.
            allow_anomalies: Let the data step pass despite dataset anomalies (still reported).
            exif: Photos with an EXIF orientation: auto (the annotated size decides), apply (as displayed) or ignore (as stored).
            data_runner: DirectRunner (inside the step) or DataflowRunner (the step launches a Dataflow job).
            beam_options: Extra Beam options for Dataflow, e.g. "--project=P --region=R --temp_location=gs://b/tmp".
            epochs: Passes over the training split.
            batch_size: Images per step, or auto to size it to the machine.
            image_size: Square model input in pixels.
            model_size: tiny, small or resnet18.
            min_map: Fail the run when mAP@[.5:.95] on validation is below this.
            require_gpu: Fail the probe when no GPU is visible.
            tune_trials: Hyperparameter search before training: 0 (off) or the number of candidates (e.g. 6).
            tune_trial_steps: Training steps of a first-round tuning trial; about 2 x trials x steps in all.
        """
        data = steps.validate_and_convert(images=images, annotations=annotations, data_format=data_format,
                                          val_fraction=val_fraction, seed=seed,
                                          max_reject_fraction=max_reject_fraction,
                                          allow_anomalies=allow_anomalies, exif=exif, runner=data_runner,
                                          beam_options=beam_options, sdk_container_image=image)
        data.set_display_name("validate-and-convert")
        data.set_cpu_limit(resources.data_cpu).set_memory_limit(resources.data_memory)
        probe = steps.probe(data=data.outputs["dataset"], require_gpu=require_gpu, image_size=image_size,
                            model_size=model_size, batch_size=batch_size)
        probe.set_caching_options(False)  # the machine may differ from one run to the next
        _on_accelerator(probe, resources)
        tuned = steps.tune_hyperparameters(
            data=data.outputs["dataset"], probe_safe_batch=probe.outputs["largest_safe_batch"],
            probe_precision=probe.outputs["mixed_precision"], probe_parallelism=probe.outputs["input_parallelism"],
            trials=tune_trials, trial_steps=tune_trial_steps, batch_size=batch_size, image_size=image_size,
            model_size=model_size, seed=seed)
        tuned.set_display_name("tune")
        _on_accelerator(tuned, resources)
        trained = steps.train(data=data.outputs["dataset"], hparams=tuned.outputs["hparams"],
                              probe_verdict=probe.outputs["verdict"],
                              probe_safe_batch=probe.outputs["largest_safe_batch"],
                              probe_precision=probe.outputs["mixed_precision"],
                              probe_parallelism=probe.outputs["input_parallelism"],
                              epochs=epochs, batch_size=batch_size, image_size=image_size,
                              model_size=model_size, seed=seed)
        _on_accelerator(trained, resources)
        trained.set_retry(num_retries=resources.train_retries, backoff_duration="60s", backoff_factor=2)
        evaluated = steps.evaluate(model=trained.outputs["model"], data=data.outputs["dataset"], min_map=min_map)
        if resources.evaluate_on_gpu:
            _on_accelerator(evaluated, resources)
        steps.export(model=trained.outputs["model"], metrics_json=evaluated.outputs["metrics_json"])

    return detpipe
