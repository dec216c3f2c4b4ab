"""Runs side by side in Vertex AI Experiments.

A pipeline run joins an experiment when its run context is a child of the experiment's
context in Vertex ML Metadata: the console then lists it among the experiment's runs with its
parameters and the metrics of its system.Metrics artifacts (the evaluate step's mAP, AP50,
AP75, per-class AP, the champion decision, the training's cost). `detpipe submit` has the
SDK join it (`PipelineJob.submit(experiment=...)`); a schedule's runs are created by Vertex AI,
where the SDK has no such option, so the register step of each run joins its own run here,
with the same metadata calls the SDK makes.
"""

from __future__ import annotations

import re

# Vertex AI's rule for an experiment's name (a Metadata context ID).
EXPERIMENT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


def experiment_name(model_name: str) -> str:
    """The default experiment of a model: its name as Vertex AI accepts it.

    >>> experiment_name("Shapes_v2.detector")
    'shapes-v2-detector'
    """
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")[:128]
    return name or "detpipe"


def experiment_problem(name: str) -> str | None:
    if EXPERIMENT_NAME.fullmatch(name):
        return None
    return (f"experiment names are lower-case letters, digits and hyphens, a letter or digit first, at most 128: "
            f"{name!r}")


def join_request(experiment: str, run_context: str, project: str, location: str):
    """The AddContextChildrenRequest that puts a run's context under the experiment's.

    >>> r = join_request("shapes", "projects/p/locations/l/metadataStores/default/contexts/run-1", "p", "l")
    >>> r.context, list(r.child_contexts)
    ('projects/p/locations/l/metadataStores/default/contexts/shapes', ['projects/p/locations/l/metadataStores/default/contexts/run-1'])
    """
    from google.cloud.aiplatform_v1.types import metadata_service

    return metadata_service.AddContextChildrenRequest(
        context=f"projects/{project}/locations/{location}/metadataStores/default/contexts/{experiment}",
        child_contexts=[run_context])


def join_experiment(experiment: str, pipeline_job: str, credentials=None) -> str:
    """Make the running `pipeline_job` (its resource name) a run of `experiment`, created when
    missing; returns the run's context."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient
    from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

    from components.model_registry.vertex_model import regional_client, resource_parts

    problem = experiment_problem(experiment)
    if problem:
        raise ValueError(problem)
    project, location = resource_parts(pipeline_job, "pipelineJobs", "pipeline job")
    aiplatform.Experiment.get_or_create(experiment, project=project, location=location, credentials=credentials)
    job = regional_client(PipelineServiceClient, location, credentials).get_pipeline_job(name=pipeline_job)
    run_context = job.job_detail.pipeline_run_context.name
    regional_client(MetadataServiceClient, location, credentials).add_context_children(
        request=join_request(experiment, run_context, project, location))
    return run_context
