"""The batch-predict pipeline: predictions for every image under a folder or gs:// prefix
with the registry's champion, resolved when each run starts (so a schedule always uses the
model in use). One step; `detpipe compile --pipeline batch-predict` writes its template."""

from kfp import dsl

from components.kfp_batch_steps import batch_predict
from pipeline.dag import DEFAULT_IMAGE

BATCH_PIPELINE_NAME = "detpipe-batch-predict"


def make_batch_pipeline(image: str = DEFAULT_IMAGE):
    """The @dsl.pipeline function with its step on `image`."""
    step = dsl.component(batch_predict, base_image=image, install_kfp_package=False)

    @dsl.pipeline(name=BATCH_PIPELINE_NAME,
                  description="Predict every image under a folder or gs:// prefix with the registry's champion.")
    def detpipe_batch_predict(images: str, registry: str = "", model_name: str = "detpipe", version: str = "",
                              score_threshold: float = -1.0, runner: str = "DirectRunner", beam_options: str = ""):
        """Predict every image under a folder or gs:// prefix with the registry's champion.

        Args:
            images: Folder, gs:// prefix or glob of the images to predict.
            registry: Model registry folder (local or gs://); empty: the registry under the pipeline root.
            model_name: Name of the model in the registry.
            version: A registry version to predict with (e.g. v3); empty: the champion when the run starts.
            score_threshold: Keep detections scoring at least this; below 0: the export's threshold.
            runner: DirectRunner (inside the step) or DataflowRunner (the step launches a Dataflow job).
            beam_options: Extra Beam options for Dataflow, e.g. "--project=P --region=R --temp_location=gs://b/tmp".
        """
        task = step(images=images, registry=registry, model_name=model_name, version=version,
                    pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, score_threshold=score_threshold, runner=runner,
                    beam_options=beam_options, sdk_container_image=image)
        task.set_display_name("batch-predict")
        task.set_caching_options(False)  # new images arrive under the same prefix, and the champion moves

    return detpipe_batch_predict
