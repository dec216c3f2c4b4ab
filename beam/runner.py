"""How a Beam job of this project runs: locally on Beam's FnApiRunner in worker processes
(beam/local_worker.py), or on any runner Beam has (a pipeline step on Dataflow: `step_beam_args`).
The data job and the batch prediction job (components/serve/batch_job.py) both start here."""

from __future__ import annotations

import logging

from apache_beam.options.pipeline_options import PipelineOptions


def step_beam_args(beam_options: str, runner: str, image: str, dataflow: dict, cloud=None) -> tuple[str, ...]:
    """A pipeline step's Beam arguments: its Dataflow settings (`dataflow_*` parameters, checked:
    ValueError, one line a problem) with, on Dataflow, the step's own image for the workers
    (they run the same code), the job's labels (`cloud`, components.cloud's CloudSettings: the
    run's, the user's and detpipe's) and key, then its `beam_options` string split as a shell does.

    >>> step_beam_args("--disk_size_gb=50", "DataflowRunner", "img:1", {"dataflow_project": "my-proj",
    ...                "dataflow_region": "r", "dataflow_temp_location": "gs://b/t"})
    ('--project=my-proj', '--region=r', '--temp_location=gs://b/t', '--sdk_container_image=img:1', '--disk_size_gb=50')
    """
    import shlex

    from beam.dataflow import DATAFLOW_RUNNER, pipeline_settings

    settings, problems = pipeline_settings(dataflow, runner, image, beam_options)
    if problems:
        raise ValueError("\n".join(problems))
    given = ()
    if cloud is not None and runner == DATAFLOW_RUNNER:
        given = tuple(f"--labels={key}={value}" for key, value in cloud.resource_labels().items())
        given += (f"--dataflow_kms_key={cloud.kms_key}",) if cloud.kms_key else ()
    return settings.beam_args() + given + tuple(shlex.split(beam_options))


def runner_and_options(runner: str, beam_args: tuple[str, ...], workers: int, worker_env: dict[str, str] | None = None,
                       worker_skips: tuple[str, ...] = ()) -> tuple[object, PipelineOptions]:
    """The runner and its options. Locally (DirectRunner) a job runs on Beam's FnApiRunner
    (DirectRunner would first try the Prism runner, which downloads a binary), in `workers`
    worker processes as Dataflow runs it: every function pickled, nothing shared with the
    driver. The worker processes run `beam.local_worker` (Beam's SDK harness, a faster exit),
    with `worker_env` in their environment and without the modules `worker_skips` names.
    One worker runs in-process.
    `--direct_num_workers` / `--direct_running_mode` among the Beam arguments win (with the
    latter, Beam starts its own workers). Any other runner is Beam's."""
    args = list(beam_args)
    if runner != "DirectRunner":
        return runner, PipelineOptions(args, runner=runner)
    from apache_beam.options.pipeline_options import DirectOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    from beam.local_worker import worker_command

    if any(a == "--direct_num_workers" or a.startswith("--direct_num_workers=") for a in args):
        workers = PipelineOptions(args).view_as(DirectOptions).direct_num_workers  # Beam's parser: either spelling
    else:
        args.append(f"--direct_num_workers={workers}")
    if any(a.startswith("--direct_running_mode") for a in args) or workers <= 1:
        return FnApiRunner(), PipelineOptions(args)
    # Beam's "multi_processing" mode would start its own worker command; the runner's own
    # environment argument starts ours, in its default running mode, which Beam then says
    # gives no parallelism: that note is dropped, it is not so here.
    logging.getLogger(_FN_RUNNER_LOGGER).addFilter(_not_the_running_mode_note)
    environment = SubprocessSDKEnvironment.from_command_string(worker_command(worker_env, worker_skips))
    return FnApiRunner(default_environment=environment), PipelineOptions(args)


_FN_RUNNER_LOGGER = "apache_beam.runners.portability.fn_api_runner.fn_runner"


def _not_the_running_mode_note(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("If direct_num_workers is not equal to 1, direct_running_mode")
