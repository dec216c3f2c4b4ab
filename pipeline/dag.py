"""The detpipe DAG: fingerprint-source → validate-and-convert → probe → tune → train →
evaluate → review → export → register → report (review: the val labels most likely wrong,
from evaluation's detections; it decides nothing, so export and register do not wait for it).

Linear on purpose: kfp's local runner has no dsl.If/ParallelFor/ExitHandler, so the
promotion decision is made inside the evaluate step and acted on inside register, and a
gate is a component that fails (register's `min_map`, after recording the version). So the tune step is always
there; when `tune_trials` is 0 or `auto` decides against a search it only writes the given hyperparameters. Machine resources are
compile-time options (`StepResources`); the local runner ignores them.
"""

import contextlib
import json
from dataclasses import asdict, dataclass, field, replace
from types import SimpleNamespace

from kfp import dsl

from components.cloud.resources import CloudSettings
from pipeline.kfp_steps import make_steps
from components.train.tensorboard_upload import TENSORBOARD_ENV, tensorboard_parts
from components.tune.vertex_job import TrialMachine
from pipeline.params import DATAFLOW, EXPORT, RULE, TRAINING, in_signature_order, pipeline_docstring, pipeline_signature
from pipeline.vertex_jobs import EMAIL, MAX_NOTIFY

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
    # "task": tune and train are plain pipeline tasks on one VM (the default; the local runner
    # needs it). "customjob": each runs as a Vertex AI custom job (google-cloud-pipeline-
    # components): several replicas, spot VMs, a timeout, restarts; the step's code is the same.
    train_runner: str = "task"
    train_replicas: int = 1  # customjob: 1 chief + (replicas - 1) workers on the same machine type
    train_machine_type: str = "n1-standard-8"
    spot: bool = False
    train_timeout_s: int = 7 * 24 * 3600
    restart_on_worker_restart: bool = False
    # A Vertex AI TensorBoard resource name: a custom job streams the curves there; a train task
    # uploads them when training ends (components/train/tensorboard_upload.py).
    tensorboard: str = ""
    # customjob: the gs:// folder under which Vertex AI writes the jobs' outputs (their
    # base_output_directory); Vertex sets AIP_TENSORBOARD_LOG_DIR, where the trainer writes its
    # curves, only for a job that has one.
    job_output_dir: str = ""
    service_account: str = ""  # "" : the run's service account
    # Who is told by email how each run ended, failed ones included: the Vertex DAG runs inside
    # an exit handler whose exit task is GCPC's email notification (Vertex AI only; the local
    # runner has no exit handler, and `run --local` never sets this).
    notify: tuple[str, ...] = ()
    # Labels, key and network of everything a run creates on Google Cloud: the custom jobs here,
    # and inside the steps the Dataflow job, tuning job, models, endpoints and batch jobs.
    cloud: CloudSettings = field(default_factory=CloudSettings)

    def __post_init__(self):
        bad = [email for email in self.notify if not EMAIL.fullmatch(email)]
        if bad:
            raise ValueError(f"--notify takes email addresses, got {', '.join(map(repr, bad))}")
        if len(self.notify) > MAX_NOTIFY:
            raise ValueError(f"--notify: at most {MAX_NOTIFY} addresses (Vertex AI's email notification), got "
                             f"{len(self.notify)}")
        if self.train_runner not in TRAIN_RUNNERS:
            raise ValueError(f"train_runner must be one of {', '.join(TRAIN_RUNNERS)}, got {self.train_runner!r}")
        if self.train_runner == "task" and (self.train_replicas != 1 or self.spot or self.job_output_dir):
            raise ValueError("--train-replicas, --spot and --job-output-dir need --train-runner customjob")
        if self.tensorboard:
            tensorboard_parts(self.tensorboard)  # ValueError naming the expected form
        if self.tensorboard and self.train_runner == "customjob" and not self.job_output_dir:
            raise ValueError("--tensorboard needs --job-output-dir gs://BUCKET/PATH: Vertex AI streams a job's "
                             "curves to its TensorBoard only from a job with a base output directory")
        if self.job_output_dir and not self.job_output_dir.startswith("gs://"):
            raise ValueError(f"--job-output-dir must be a gs:// folder, got {self.job_output_dir!r}")


TRAIN_RUNNERS = ("task", "customjob")


def as_custom_job(component, resources: StepResources, display_name: str):
    """`component` wrapped as a Vertex AI custom job with the machines of `resources`."""
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    return create_custom_training_job_from_component(
        component, display_name=display_name, replica_count=resources.train_replicas,
        machine_type=resources.train_machine_type, accelerator_type=resources.accelerator_type,
        accelerator_count=resources.accelerator_count, timeout=f"{resources.train_timeout_s}s",
        restart_job_on_worker_restart=resources.restart_on_worker_restart,
        service_account=resources.service_account, tensorboard=resources.tensorboard,
        base_output_directory=resources.job_output_dir, network=resources.cloud.network,
        encryption_spec_key_name=resources.cloud.kms_key, labels=resources.cloud.resource_labels(environ={}),
        strategy="SPOT" if resources.spot else "STANDARD")


def _on_accelerator(task, resources: StepResources):
    return (task.set_cpu_limit(resources.train_cpu).set_memory_limit(resources.train_memory)
            .set_accelerator_type(resources.accelerator_type).set_accelerator_limit(resources.accelerator_count))


def call_with_params(step, p, inputs_of=None, **wired):
    """`step` with the `wired` inputs (other steps' outputs, placeholders, compile-time values)
    and every other input of its function (`inputs_of`, default `step`) that is named for a
    pipeline parameter, from `p`: a setting reaches each step that takes it by its name alone,
    so the DAG passes none by hand."""
    names = (inputs_of or step).component_spec.inputs
    return step(**wired, **{name: getattr(p, name) for name in names if name not in wired and hasattr(p, name)})


def _data_steps(steps, p, image: str, resources: StepResources):
    """fingerprint-source and validate-and-convert, given the pipeline's parameters `p`."""
    source = call_with_params(steps.fingerprint_source, p, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER)
    source.set_caching_options(False)  # it exists to look at the files again on every run
    data = call_with_params(steps.validate_and_convert, p, source_fingerprint=source.outputs["fingerprint"],
                            registry=source.outputs["registry"], sdk_container_image=image,
                            cloud=resources.cloud.to_json())
    data.set_display_name("validate-and-convert")
    data.set_cpu_limit(resources.data_cpu).set_memory_limit(resources.data_memory)
    return source, data


def _release_steps(steps, p, source, dataset, advice, tuned, model, image: str, resources: StepResources,
                   local: bool) -> None:
    """evaluate, review, export, register and report, after training `model`."""
    registry = source.outputs["registry"]
    evaluated = call_with_params(steps.evaluate, p, model=model, data=dataset, registry=registry,
                                 champion=source.outputs["champion"])
    if resources.evaluate_on_gpu:
        _on_accelerator(evaluated, resources)
    reviewed = call_with_params(steps.review, p, model=model, data=dataset,
                                evaluation=evaluated.outputs["evaluation"])
    exported = call_with_params(steps.export, p, model=model, metrics_json=evaluated.outputs["metrics_json"],
                                data=dataset)
    registered = call_with_params(
        steps.register, p, saved_model=exported.outputs["saved_model"], model=model,
        metrics_json=evaluated.outputs["metrics_json"], decision=evaluated.outputs["decision"], data=dataset,
        source=source.outputs["source"], registry=registry, serving_image=image,
        run_id=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        pipeline_job="" if local else dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER, cloud=resources.cloud.to_json())
    registered.set_caching_options(False)  # the registry may have moved since a cached run
    reported = call_with_params(
        steps.report, p, data=dataset, probe_json=advice, hparams=tuned.outputs["hparams"], model=model,
        evaluation=evaluated.outputs["evaluation"], label_review=reviewed.outputs["label_review"],
        decision=evaluated.outputs["decision"], saved_model=exported.outputs["saved_model"],
        version=registered.outputs["version"], status=registered.outputs["status"],
        champion=registered.outputs["champion"], run_id=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)
    reported.set_caching_options(False)  # it names this run


def _exit_handler(notify: tuple[str, ...]):
    """The steps' context: inside an exit handler that emails `notify` when the run ends, or
    none (a linear DAG)."""
    if not notify:
        return contextlib.nullcontext()
    from google_cloud_pipeline_components.v1.vertex_notification_email import VertexNotificationEmailOp

    return dsl.ExitHandler(VertexNotificationEmailOp(recipients=list(notify)), name="detpipe-steps")


def make_pipeline(image: str = DEFAULT_IMAGE, resources: StepResources = StepResources(), local: bool = False):
    """The @dsl.pipeline function with every step on `image`. Its parameters are
    `pipeline.params.PARAMS` (kfp reads the signature and the docstring). `local`: for kfp's
    local runner, which resolves no pipeline job resource name (the register step then gets
    none: the local run joins no Vertex AI experiment) and has no exit handler."""
    if local and resources.notify:
        raise ValueError("the local runner has no exit handler: --notify is for Vertex AI")
    steps = make_steps(image, TRAINING, DATAFLOW, EXPORT, RULE)
    custom = resources.train_runner == "customjob"
    # The tuner scores every trial between trials, on one machine: it runs on the chief alone
    # (several replicas would train each short trial together and then all evaluate it).
    tune_step = as_custom_job(steps.tune_hyperparameters, replace(resources, train_replicas=1), "detpipe-tune") \
        if custom else steps.tune_hyperparameters
    train_step = as_custom_job(steps.train, resources, "detpipe-train") if custom else steps.train
    names = [p.name for p in in_signature_order()]
    # A Vertex AI tuning job's trials run on the training's machine and image (components/tune/vertex_job.py).
    trial_machine = json.dumps(asdict(TrialMachine(
        image=image, machine_type=resources.train_machine_type, accelerator_type=resources.accelerator_type,
        accelerator_count=resources.accelerator_count, spot=resources.spot)), sort_keys=True)

    def detpipe(*values):
        p = SimpleNamespace(**dict(zip(names, values)))
        with _exit_handler(resources.notify):
            _steps_of(p)

    def _steps_of(p):
        source, data = _data_steps(steps, p, image, resources)
        dataset, registry = data.outputs["dataset"], source.outputs["registry"]
        probe = call_with_params(steps.probe, p, data=dataset)
        probe.set_caching_options(False)  # the machine may differ from one run to the next
        _on_accelerator(probe, resources)
        advice = probe.outputs["probe_json"]
        tuned = call_with_params(tune_step, p, steps.tune_hyperparameters, data=dataset, probe_json=advice,
                                 trial_machine=trial_machine, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
                                 cloud=resources.cloud.to_json())
        tuned.set_display_name("tune")
        trained = call_with_params(train_step, p, steps.train, data=dataset, hparams=tuned.outputs["hparams"],
                                   probe_json=advice, registry=registry)
        if not custom:  # a custom job's machines are in its worker pool specs
            _on_accelerator(tuned, resources)
            _on_accelerator(trained, resources)
            if resources.tensorboard:
                trained.set_env_variable(TENSORBOARD_ENV, resources.tensorboard)
        for step in (tuned, trained):  # a preempted search or training goes on from its checkpoints
            step.set_retry(num_retries=resources.train_retries, backoff_duration="60s", backoff_factor=2)
        _release_steps(steps, p, source, dataset, advice, tuned, trained.outputs["model"], image, resources, local)

    detpipe.__signature__ = pipeline_signature()
    detpipe.__doc__ = pipeline_docstring(
        "Train and evaluate an object detector on a labelled image dataset, compare it with the champion "
        "and register it.")
    return dsl.pipeline(
        name=PIPELINE_NAME,
        description="Validate and convert a labelled image dataset, probe the training machine, train a "
                    "KerasHub RetinaNet, evaluate it against the champion and register it.",
    )(detpipe)
