"""Vertex AI Model Registry: one model version per pipeline run, served by the project image.

A blessed version becomes the default version and carries the `champion` alias (Vertex
moves an alias to the newest version that claims it); a rejected one is uploaded too, for
audit, without either. The container is the project image running `detpipe serve` on
Vertex's custom-container contract (components/serve/app.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.cloud.resources import CloudSettings

CHAMPION_ALIAS = "champion"
# Where a command or the pipeline talks to Vertex AI unless told otherwise, and the machines it
# asks for to serve or predict (an endpoint, a batch prediction job).
DEFAULT_REGION = "us-central1"
DEFAULT_MACHINE_TYPE = "n1-standard-4"
SERVING_PORT = 8080
PREDICT_ROUTE = "/predict"
HEALTH_ROUTE = "/health"
REGISTRY_VERSION_LABEL = "registry_version"  # the detpipe registry version a Vertex AI version was uploaded for


class NotOnVertex(LookupError, ValueError):
    """A model or version Vertex AI does not have (a ValueError: the CLI prints it in one line)."""


def label_value(text: str) -> str:
    """A Google Cloud label value: lowercase letters, digits, '_' and '-', at most 63.

    >>> label_value("detpipe-20261121.Run_7")
    'detpipe-20261121-run_7'
    """
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


@dataclass(frozen=True)
class ModelVersion:
    display_name: str
    artifact_uri: str  # gs:// folder of the SavedModel
    serving_image: str
    blessed: bool
    run_id: str
    data_fingerprint: str
    map: float
    registry_version: str
    description: str = ""

    def labels(self) -> dict[str, str]:
        return {"app": "detpipe", "run_id": label_value(self.run_id),
                "data_fingerprint": self.data_fingerprint[:32],
                "map": label_value(f"{self.map:.4f}"), REGISTRY_VERSION_LABEL: label_value(self.registry_version),
                "verdict": "blessed" if self.blessed else "rejected"}


def find_parent_model(display_name: str, project: str | None, location: str | None, credentials=None) -> str | None:
    """The resource name of the newest model with this display name, or None."""
    from google.cloud import aiplatform

    models = aiplatform.Model.list(filter=f'display_name="{display_name}"', order_by="create_time desc",
                                   project=project, location=location, credentials=credentials)
    return models[0].resource_name if models else None


def model_resource(model: str, project: str | None, location: str | None, credentials=None) -> str:
    """`model` as projects/P/locations/L/models/ID: a resource name as it is, a display name
    looked up (its newest model). Raises NotOnVertex when there is no such model."""
    if model.startswith("projects/"):
        return model
    found = find_parent_model(model, project, location, credentials)
    if not found:
        raise NotOnVertex(f"no Vertex AI model named {model!r} in {project}/{location}")
    return found


def upload_version(version: ModelVersion, project: str | None = None, location: str | None = None,
                   credentials=None, parent_model: str | None = None, cloud: CloudSettings = CloudSettings()):
    """Upload one version (`aiplatform.Model.upload`); `parent_model` None: a new model."""
    from google.cloud import aiplatform

    if not version.artifact_uri.startswith("gs://"):
        raise ValueError(f"Vertex AI serves models from gs:// only; the registry version is at "
                         f"{version.artifact_uri} (give the pipeline a gs:// registry)")
    return aiplatform.Model.upload(
        display_name=version.display_name, parent_model=parent_model, is_default_version=version.blessed,
        version_aliases=[CHAMPION_ALIAS] if version.blessed else None,
        version_description=version.description[:1000] or None, description=version.description[:1000] or None,
        artifact_uri=version.artifact_uri, serving_container_image_uri=version.serving_image,
        serving_container_command=["detpipe"], serving_container_args=["serve"],
        serving_container_ports=[SERVING_PORT], serving_container_predict_route=PREDICT_ROUTE,
        serving_container_health_route=HEALTH_ROUTE, labels=cloud.resource_labels(version.labels()),
        encryption_spec_key_name=cloud.kms_key or None,
        project=project, location=location, credentials=credentials, sync=True)


def resource_parts(name: str, collection: str, what: str) -> tuple[str, str]:
    """(project, location) of a Vertex AI resource name, projects/P/locations/L/COLLECTION/ID;
    ValueError naming the form (`what`: the resource, in words) for any other.

    >>> resource_parts("projects/p/locations/europe-west4/models/12", "models", "model")
    ('p', 'europe-west4')
    """
    parts = name.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" or parts[4] != collection:
        raise ValueError(f"not a Vertex AI {what}: {name!r} (projects/P/locations/L/{collection}/ID)")
    return parts[1], parts[3]


def resource_uri(resource_name: str) -> str:
    """The REST address of a Vertex AI resource (projects/P/locations/L/...), the `uri` GCPC
    gives its google.VertexModel and google.VertexEndpoint artifacts.

    >>> resource_uri("projects/p/locations/europe-west4/models/12@3")
    'https://europe-west4-aiplatform.googleapis.com/v1/projects/p/locations/europe-west4/models/12@3'
    """
    location = resource_name.split("/")[3]
    return f"https://{location}-aiplatform.googleapis.com/v1/{resource_name}"


def regional_client(client_class, location: str, credentials=None):
    """A Vertex AI GAPIC client (`client_class`, e.g. EndpointServiceClient) for the
    regional endpoint of `location`."""
    from google.api_core.client_options import ClientOptions

    return client_class(credentials=credentials,
                        client_options=ClientOptions(api_endpoint=f"{location}-aiplatform.googleapis.com"))


def model_api(location: str, credentials=None):
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    return regional_client(ModelServiceClient, location, credentials)


def versions_request(model: str, registry_version: str):
    """The ListModelVersionsRequest for the Vertex AI versions of `model` (a resource name
    without @) that the pipeline uploaded for registry version `registry_version` (its label)."""
    from google.cloud.aiplatform_v1.types import model_service

    return model_service.ListModelVersionsRequest(
        name=model, filter=f'labels.{REGISTRY_VERSION_LABEL}="{label_value(registry_version)}"')


def alias_request(version_name: str):
    """The MergeVersionAliasesRequest that makes `version_name` (MODEL@ID) the champion and
    the default version: an alias names one version of a model, so Vertex AI takes both
    from the version that had them."""
    from google.cloud.aiplatform_v1.types import model_service

    return model_service.MergeVersionAliasesRequest(name=version_name, version_aliases=["default", CHAMPION_ALIAS])


def vertex_version_of(model: str, registry_version: str, location: str, credentials=None, client=None) -> str:
    """MODEL@ID of the newest Vertex AI version uploaded for `registry_version`. Raises
    NotOnVertex when there is none (a run without vertex_model, or another model)."""
    client = client or model_api(location, credentials)
    found = list(client.list_model_versions(request=versions_request(model, registry_version)))
    if not found:
        raise NotOnVertex(f"{model} has no version labelled {REGISTRY_VERSION_LABEL}={label_value(registry_version)} "
                          "(was that run uploaded to Vertex AI, with this --vertex-model?)")
    newest = max(found, key=lambda m: m.version_create_time.timestamp() if m.version_create_time else 0)
    return f"{model}@{newest.version_id}"


def make_champion(version_name: str, location: str, credentials=None, client=None) -> None:
    """Move the `champion` and `default` aliases to `version_name` (MODEL@ID)."""
    client = client or model_api(location, credentials)
    client.merge_version_aliases(request=alias_request(version_name))
