"""The search on Vertex AI: a hyperparameter tuning job (Vizier) whose trials run on machines
of their own, `parallel` at once, each a `detpipe tune-trial` custom job on the project image.

The tune step (which runs on Vertex as a pipeline task) carves the tuning split and plans
the trials as a local search does (search.py), writes the plan beside them, and submits the
job; each trial trains the plan's regime with the values Vizier proposes (passed as
`--NAME=VALUE` arguments, Vertex's convention), scores every rung on the held-out images and
reports it through cloudml-hypertune (what the service reads). Trials on Vertex run to their
end: the SDK's job has no early-stopping setting (the local search prunes). The step waits for the job, reads the best trial back and writes
`best_hparams.json` like a local search. A restarted step finds its job again
(`vertex_job.json`) instead of starting another.

Tested on the requests it builds (tests/test_tuning_vertex.py): nothing here runs without Google Cloud.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.cloud.resources import CloudSettings
from components.tune.budget import SearchBudget
from components.tune.hparams_file import DEFAULTS, SEARCH_SPACE, BestHparams
from components.tune.trials import (METRIC, PLAN_FILE, TRIALS_DIR, TrialRecord, TrialRegime, search_record,
                                    train_rungs)

if TYPE_CHECKING:
    from components.detector.holdout import TuningSplit

logger = logging.getLogger(__name__)

METRIC_ID = "tuning_map"  # what each trial reports: mAP@[.5:.95] on the tuning split
JOB_FILE = "vertex_job.json"  # the submitted job's resource name, for a restarted step
DEFAULT_PARALLEL = 4  # trials at once on Vertex when tune_parallel_trials is 0
BACKENDS = ("auto", "local", "vertex")


def gcs_uri(path: str) -> str:
    """A path as a Vertex job's machines reach it: the pipeline's /gcs/BUCKET/... mount as gs://.

    >>> gcs_uri("/gcs/bucket/root/x"), gcs_uri("gs://b/y")
    ('gs://bucket/root/x', 'gs://b/y')
    """
    return "gs://" + path[len("/gcs/"):] if path.startswith("/gcs/") else path


def fuse_path(path: str) -> str:
    """A gs:// path as the machines of a Vertex job open it as a file (Cloud Storage FUSE at /gcs/).

    >>> fuse_path("gs://bucket/x"), fuse_path("/gcs/bucket/x")
    ('/gcs/bucket/x', '/gcs/bucket/x')
    """
    return "/gcs/" + path[len("gs://"):] if path.startswith("gs://") else path


def choose_backend(requested: str, output_dir: str) -> str:
    """Where the trials run: as asked, or (`auto`) on Vertex when the step itself runs on Vertex
    AI Pipelines (its output is on Cloud Storage, mounted at /gcs/ or given as gs://), else here.

    >>> choose_backend("auto", "/gcs/b/run/tune"), choose_backend("auto", "/tmp/run"), choose_backend("local", "gs://b")
    ('vertex', 'local', 'local')
    """
    if requested not in BACKENDS:
        raise ValueError(f"tune_backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested != "auto":
        return requested
    return "vertex" if gcs_uri(output_dir).startswith("gs://") else "local"


@dataclass(frozen=True)
class TrialMachine:
    """The machine of each trial: the training's (StepResources at compile time)."""

    image: str
    machine_type: str = "n1-standard-8"
    accelerator_type: str = ""
    accelerator_count: int = 0
    spot: bool = False

    @classmethod
    def from_json(cls, text: str) -> "TrialMachine":
        return cls(**json.loads(text))


def parameter_spec() -> dict:
    """Vizier's search space: SEARCH_SPACE, log-scaled where it is searched on a log scale."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt

    return {name: hpt.DoubleParameterSpec(min=low, max=high, scale="log" if log else "linear")
            for name, (low, high, log) in SEARCH_SPACE.items()}


def tuning_job(plan_uri: str, output_uri: str, machine: TrialMachine, trials: int, parallel: int, region: str,
               project: str | None = None, credentials=None, seed: int = 0, cloud: CloudSettings = CloudSettings()):
    """The (unsubmitted) `aiplatform.HyperparameterTuningJob`: its trial job runs
    `detpipe tune-trial --plan PLAN --output OUTPUT` on `machine`; both carry `cloud`'s labels
    (with the run's) and key."""
    from google.cloud import aiplatform

    pool = {"machine_spec": {"machine_type": machine.machine_type}, "replica_count": 1,
            "container_spec": {"image_uri": machine.image,
                               "command": ["detpipe", "tune-trial"],
                               "args": ["--plan", plan_uri, "--output", output_uri]}}
    if machine.accelerator_type and machine.accelerator_count:
        pool["machine_spec"].update(accelerator_type=machine.accelerator_type,
                                    accelerator_count=machine.accelerator_count)
    trial_job = aiplatform.CustomJob(display_name="detpipe-tune-trial", worker_pool_specs=[pool],
                                     base_output_dir=gcs_uri(output_uri), staging_bucket=gcs_uri(output_uri),
                                     project=project, location=region,
                                     credentials=credentials, labels=cloud.resource_labels(),
                                     encryption_spec_key_name=cloud.kms_key or None)
    return aiplatform.HyperparameterTuningJob(
        display_name="detpipe-tune", custom_job=trial_job, metric_spec={METRIC_ID: "maximize"},
        parameter_spec=parameter_spec(), max_trial_count=trials, parallel_trial_count=max(1, min(parallel, trials)),
        max_failed_trial_count=max(1, trials // 2), search_algorithm=None, measurement_selection="last",
        project=project, location=region, credentials=credentials,
        labels=cloud.resource_labels({"seed": str(seed)}), encryption_spec_key_name=cloud.kms_key or None)


ENDED_BY_A_STOP = ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")  # a stopped step's job: start another


def submit(job, output_dir: str, spot: bool, timeout_s: int | None = None, network: str = ""):
    """Start the job, its trials on spot VMs when `spot` (Vertex restarts a preempted trial,
    which resumes from its checkpoints under the output), and return it without waiting; or
    the job an earlier try of this step started (named in OUTPUT/JOB_FILE) unless a stop of
    that try cancelled it."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform.compat.types import custom_job as gca_custom_job

    record = os.path.join(output_dir, JOB_FILE)
    if os.path.exists(record):
        with open(record) as handle:
            name = json.load(handle)["resource_name"]
        earlier = aiplatform.HyperparameterTuningJob.get(name)
        if earlier.state.name not in ENDED_BY_A_STOP:
            logger.info("tune: taking up %s, started by an earlier try of this step", name)
            return earlier
        logger.info("tune: %s was cancelled when an earlier try stopped: starting another", name)
    job.run(network=network or None, sync=False, timeout=timeout_s, restart_job_on_worker_restart=False,
            scheduling_strategy=gca_custom_job.Scheduling.Strategy.SPOT if spot else None)
    job.wait_for_resource_creation()
    with open(record, "w") as handle:
        json.dump({"resource_name": job.resource_name}, handle)
    logger.info("tune: Vertex AI hyperparameter tuning job %s", job.resource_name)
    return job


def best_of(trials) -> tuple[dict[str, float], float, list[dict]]:
    """The finished trials of a job (the service's Trial messages): the best one's values and
    score, and every trial as a trials.jsonl row."""
    rows = []
    for trial in trials:
        metrics = {m.metric_id: m.value for m in trial.final_measurement.metrics} if trial.final_measurement else {}
        rows.append({"number": int(trial.id), "state": trial.state.name,
                     "hparams": {p.parameter_id: float(p.value) for p in trial.parameters},
                     "score": metrics.get(METRIC_ID), "error": trial.infeasible_reason or None})
    finished = [r for r in rows if r["state"] == "SUCCEEDED" and r["score"] is not None]
    if not finished:
        raise RuntimeError("tune: no Vertex AI trial finished: "
                           + "; ".join(f"trial {r['number']}: {r['state']} {r['error'] or ''}" for r in rows))
    best = max(finished, key=lambda r: r["score"])
    return best["hparams"], best["score"], rows


def search_on_vertex(out: str, budget: SearchBudget, split: TuningSplit, regime: TrialRegime,
                     first: dict[str, float], trial_machine: str, region: str, parallel: int,
                     seed: int, cloud: str = "", gcp_resources: str = "") -> tuple[BestHparams, list[TrialRecord]]:
    """The trials but the defaults as a Vertex AI tuning job (vertex_job.py), the defaults
    trained here meanwhile (this step runs on the training machine; Vizier has no way to be
    given a first trial), the winner the best of them. The job is the step's `gcp_resources`
    (the console links it), and a SIGTERM (the run cancelled) cancels it, while the defaults
    train (the trainer checkpoints and stops) or while the step waits for it."""
    from components.cloud.job_cancel import TUNING_JOB, cancelled_on_sigterm, vertex_uri, write_gcp_resources

    started = time.monotonic()
    if not trial_machine or not region:
        raise ValueError("tune_backend vertex needs the trials' machine and region (the compiled pipeline gives both: "
                         "run it on Vertex AI, or use tune_backend local)")
    machine = TrialMachine.from_json(trial_machine)
    settings = CloudSettings.from_json(cloud)
    parallel = parallel or DEFAULT_PARALLEL
    job = submit(tuning_job(fuse_path(f"{out}/{PLAN_FILE}"), fuse_path(f"{out}/vertex_trials"), machine,
                            budget.trials - 1, parallel, region, seed=seed, cloud=settings), out, machine.spot,
                 network=settings.network)
    write_gcp_resources(gcp_resources, TUNING_JOB, vertex_uri(job.resource_name))
    logger.info("tune: the defaults train here while Vertex AI runs %d trial(s), %d at once", budget.trials - 1,
                parallel)
    with cancelled_on_sigterm(job.cancel, f"Vertex AI tuning job {job.resource_name}") as stop:
        try:
            defaults = train_rungs(regime, f"{out}/{TRIALS_DIR}/defaults/model", first, {}, lambda step, score: False)
        except BaseException:  # the trainer stopped on the SIGTERM (Preempted), or failed: the trials go too
            stop.now()
            raise
        job.wait()
    hparams, score, rows = best_of(job.trials)
    records = [TrialRecord(0, "COMPLETE", dict(first), defaults, {}, regime.stops[-1], 0.0)] + [
        TrialRecord(r["number"], r["state"], r["hparams"], r["score"], {}, regime.stops[-1], 0.0, r["error"])
        for r in rows]
    better = score > defaults
    chosen = BestHparams({**first, **hparams} if better else dict(first), max(score, defaults), defaults, METRIC,
                         len(records), budget.reason,
                         search_record(split, budget.trial_epochs, regime, regime.stops[-1] * len(records),
                                       time.monotonic() - started,
                                       next(r.number for r in records[1:] if r.hparams == hparams) if better else 0,
                                       backend="vertex", job=job.resource_name, parallel=parallel))
    return chosen, records


def vertex_trial(plan_path: str, output: str, hparams: dict[str, float]) -> float:
    """One trial of a Vertex AI tuning job (`detpipe tune-trial`): the plan's regime with
    these values, every rung's score reported to the service (cloudml-hypertune), in a folder
    of its own under OUTPUT (Vertex's trial id), so a restarted trial resumes from its checkpoints."""
    import hypertune

    with open(plan_path) as handle:
        regime = TrialRegime.from_dict(json.load(handle)["regime"])
    reporter = hypertune.HyperTune()

    def report(step: int, score: float) -> bool:
        logger.info("tune-trial: step %d: %s %.4f", step, METRIC, score)
        reporter.report_hyperparameter_tuning_metric(hyperparameter_metric_tag=METRIC_ID, metric_value=score,
                                                     global_step=step)
        return False  # the service's stopping rule ends a poor trial

    trial = os.environ.get("CLOUD_ML_TRIAL_ID", "0")
    return train_rungs(regime, f"{output.rstrip('/')}/trial-{trial}/model", {**DEFAULTS, **hparams}, {}, report)
