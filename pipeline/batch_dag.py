"""The batch-predict pipeline: predictions for every image under a folder or gs:// prefix
with the registry's champion, resolved when each run starts (so a schedule always uses the
model in use). One step; `detpipe compile --pipeline batch-predict` writes its template."""

from types import SimpleNamespace

from kfp import dsl

from pipeline.kfp_batch_steps import batch_predict
from pipeline.kfp_settings import with_settings
from components.cloud.resources import CloudSettings
from pipeline.dag import DEFAULT_IMAGE, call_with_params
from pipeline.params import (BY_NAME, DATAFLOW, REQUIRED, Param, in_signature_order, pipeline_docstring,
                             pipeline_signature)

BATCH_PIPELINE_NAME = "detpipe-batch-predict"
# Its parameters; the Dataflow settings and beam_options are the training pipeline's own.
BATCH_PARAMS: tuple[Param, ...] = (
    Param("images", str, REQUIRED, "Folder, gs:// prefix or glob of the images to predict."),
    Param("registry", str, "", "Model registry folder (local or gs://); empty: the registry under the pipeline root."),
    Param("model_name", str, BY_NAME["model_name"].default, "Name of the model in the registry."),
    Param("version", str, "", "A registry version to predict with (e.g. v3); empty: the champion when the run starts."),
    Param("score_threshold", float, -1.0, "Keep detections scoring at least this; below 0: the export's."),
    Param("runner", str, BY_NAME["data_runner"].default, BY_NAME["data_runner"].help,
          choices=BY_NAME["data_runner"].choices),
    *(BY_NAME[name] for name in DATAFLOW),
    BY_NAME["beam_options"],
)


def make_batch_pipeline(image: str = DEFAULT_IMAGE, cloud: CloudSettings = CloudSettings()):
    """The @dsl.pipeline function with its step on `image`, its Dataflow job labelled and keyed
    by `cloud`."""
    step = dsl.component(with_settings(batch_predict, DATAFLOW, "dataflow"), base_image=image,
                         install_kfp_package=False)
    names = [p.name for p in in_signature_order(BATCH_PARAMS)]

    def detpipe_batch_predict(*values):
        p = SimpleNamespace(**dict(zip(names, values)))
        task = call_with_params(step, p, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, sdk_container_image=image,
                                cloud=cloud.to_json())
        task.set_display_name("batch-predict")
        task.set_caching_options(False)  # new images arrive under the same prefix, and the champion moves

    summary = "Predict every image under a folder or gs:// prefix with the registry's champion."
    detpipe_batch_predict.__signature__ = pipeline_signature(BATCH_PARAMS)
    detpipe_batch_predict.__doc__ = pipeline_docstring(summary, BATCH_PARAMS)
    return dsl.pipeline(name=BATCH_PIPELINE_NAME, description=summary)(detpipe_batch_predict)
