"""The detpipe DAG: validate-and-convert → probe → train → evaluate.

Linear on purpose: kfp's local runner has no dsl.If/ParallelFor/ExitHandler, and a
gate is a component that fails (evaluate's `min_map`).
"""

from kfp import dsl

from components.kfp_steps import make_steps

PIPELINE_NAME = "detpipe"
# The project image (infra/Dockerfile); set the pushed tag with `detpipe compile --image`.
DEFAULT_IMAGE = "detpipe:latest"


def make_pipeline(image: str = DEFAULT_IMAGE):
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
        epochs: int = 10,
        batch_size: str = "auto",
        image_size: int = 128,
        model_size: str = "tiny",
        min_map: float = 0.0,
        require_gpu: bool = False,
    ):
        data = steps.validate_and_convert(images=images, annotations=annotations, data_format=data_format,
                                          val_fraction=val_fraction, seed=seed,
                                          max_reject_fraction=max_reject_fraction,
                                          allow_anomalies=allow_anomalies)
        data.set_display_name("validate-and-convert")
        probe = steps.probe(data=data.outputs["dataset"], require_gpu=require_gpu, image_size=image_size,
                            model_size=model_size, batch_size=batch_size)
        probe.set_caching_options(False)  # the machine may differ from one run to the next
        trained = steps.train(data=data.outputs["dataset"], probe_verdict=probe.outputs["verdict"],
                              probe_safe_batch=probe.outputs["largest_safe_batch"],
                              probe_precision=probe.outputs["mixed_precision"],
                              probe_parallelism=probe.outputs["input_parallelism"],
                              epochs=epochs, batch_size=batch_size, image_size=image_size,
                              model_size=model_size, seed=seed)
        steps.evaluate(model=trained.outputs["model"], data=data.outputs["dataset"], min_map=min_map)

    return detpipe
