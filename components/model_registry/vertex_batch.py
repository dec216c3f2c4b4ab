"""Vertex AI batch prediction with a model of the Vertex AI Model Registry (the register
step uploads each version, the champion with the alias `champion`): a BatchPredictionJob
whose machines run the model's serving container, the project image with `detpipe serve`.

Inputs (`instances_format`):
- "file-list": a gs:// text file, one image URI a line; Vertex AI reads each file and sends
  it as {"b64": ...}, which `detpipe serve` takes as it takes {"image_bytes": {"b64": ...}};
- "jsonl": a gs:// JSON Lines file of {"image_bytes": {"b64": ...}} instances.
Output: JSON Lines under the destination prefix, one line per instance with its prediction
(Vertex AI's format: {"instance": ..., "prediction": ...}).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.cloud.resources import CloudSettings
from components.model_registry.vertex_endpoint import accelerator_problems
from components.model_registry.vertex_model import CHAMPION_ALIAS, DEFAULT_MACHINE_TYPE

INSTANCES_FORMATS = ("file-list", "jsonl")


@dataclass(frozen=True)
class BatchPredictionSpec:
    model: str  # a model resource name, projects/P/locations/L/models/ID, with @alias or @version or not
    source: str  # gs:// file: image URIs (file-list) or JSON Lines of instances
    destination: str  # gs:// prefix for the predictions
    instances_format: str = "file-list"
    machine_type: str = DEFAULT_MACHINE_TYPE
    accelerator_type: str = ""  # e.g. NVIDIA_TESLA_T4; "" for none
    accelerator_count: int = 0
    replicas: int = 1  # machines; Vertex AI splits the input between them at the start
    score_threshold: float | None = None  # sent as the requests' parameters; None: the export's
    display_name: str = "detpipe-batch-predict"

    def problems(self) -> list[str]:
        """What is wrong with the spec, one line each (empty when it can be submitted)."""
        found = []
        if self.instances_format not in INSTANCES_FORMATS:
            found.append(f"instances format must be one of {', '.join(INSTANCES_FORMATS)}, got {self.instances_format!r}")
        for name, value in (("source", self.source), ("destination", self.destination)):
            if not value.startswith("gs://"):
                found.append(f"{name} must be a gs:// path (Vertex AI reads and writes Cloud Storage), got {value!r}")
        found += accelerator_problems(self.accelerator_type, self.accelerator_count)
        if self.replicas < 1:
            found.append(f"replicas must be at least 1, got {self.replicas}")
        return found


def champion_of(model: str) -> str:
    """`model` (a resource name) at the champion alias, unless it names a version or alias.

    >>> champion_of("projects/p/locations/l/models/42"), champion_of("projects/p/locations/l/models/42@3")
    ('projects/p/locations/l/models/42@champion', 'projects/p/locations/l/models/42@3')
    """
    return model if "@" in model else f"{model}@{CHAMPION_ALIAS}"


def submit_batch_prediction(spec: BatchPredictionSpec, project: str | None = None, location: str | None = None,
                            credentials=None, sync: bool = False, cloud: CloudSettings = CloudSettings()):
    """Create the job (`aiplatform.BatchPredictionJob.create`); returns it. Raises ValueError
    with one line a problem when the spec cannot be submitted."""
    from google.cloud import aiplatform

    problems = spec.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return aiplatform.BatchPredictionJob.create(
        job_display_name=spec.display_name, model_name=spec.model, instances_format=spec.instances_format,
        predictions_format="jsonl", gcs_source=spec.source, gcs_destination_prefix=spec.destination,
        model_parameters=None if spec.score_threshold is None else {"score_threshold": spec.score_threshold},
        machine_type=spec.machine_type, accelerator_type=spec.accelerator_type or None,
        accelerator_count=spec.accelerator_count or None, starting_replica_count=spec.replicas,
        max_replica_count=spec.replicas, labels=cloud.resource_labels(), encryption_spec_key_name=cloud.kms_key or None,
        project=project, location=location,
        credentials=credentials, sync=sync)
