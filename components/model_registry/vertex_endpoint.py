"""The champion behind a Vertex AI endpoint: deploy a Model Registry version to a named
endpoint (created when missing), move all traffic to it, and only then undeploy what the
endpoint served before.

Vertex AI's `DeployModel` operation finishes when the new deployed model is ready, i.e. its
container answers the health route (`detpipe serve`'s /health answers 200 once the model has
loaded); the traffic split of the request moves traffic to it at that moment. Until then
the previous deployment keeps serving; if the deployment fails, it keeps serving for good.
The requests are built here with the Vertex AI API types and sent with its GAPIC client
(`EndpointServiceClient`): the high-level `aiplatform.Endpoint.deploy` fetches the model and
the endpoint first and has no single request one could check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from components.cloud.resources import CloudSettings
from components.model_registry.vertex_model import DEFAULT_MACHINE_TYPE, label_value, regional_client

logger = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 3600  # a GPU machine and the image can take a while to come up


def parse_accelerator(value: str) -> tuple[str, int]:
    """TYPE[:COUNT] (count 1 when left out) or "" for none.

    >>> parse_accelerator("NVIDIA_TESLA_T4:2"), parse_accelerator("NVIDIA_L4"), parse_accelerator("")
    (('NVIDIA_TESLA_T4', 2), ('NVIDIA_L4', 1), ('', 0))
    """
    if not value:
        return "", 0
    kind, _, count = value.partition(":")
    return kind, int(count or 1)


def accelerator_problems(kind: str, count: int) -> list[str]:
    """What is wrong with an accelerator setting (type and count go together)."""
    return [] if bool(kind) == bool(count) else ["give both an accelerator type and a count, or neither"]


@dataclass(frozen=True)
class EndpointSpec:
    endpoint: str  # display name of the endpoint (created when there is none)
    machine_type: str = DEFAULT_MACHINE_TYPE
    accelerator_type: str = ""  # e.g. NVIDIA_TESLA_T4; "" for none
    accelerator_count: int = 0
    min_replicas: int = 1
    max_replicas: int = 1

    @classmethod
    def parse(cls, endpoint: str, machine_type: str, accelerator: str, min_replicas: int,
              max_replicas: int) -> "EndpointSpec | None":
        """The spec from the pipeline's parameters (`accelerator` TYPE:COUNT or ""); None
        when no endpoint is named.

        >>> EndpointSpec.parse("det", "g2-standard-4", "NVIDIA_L4:1", 1, 2).accelerator_count
        1
        """
        if not endpoint:
            return None
        return cls(endpoint, machine_type, *parse_accelerator(accelerator), min_replicas, max_replicas)

    def problems(self) -> list[str]:
        found = []
        if not self.endpoint:
            found.append("no endpoint name")
        found += accelerator_problems(self.accelerator_type, self.accelerator_count)
        if not 1 <= self.min_replicas <= self.max_replicas:
            found.append(f"replicas must satisfy 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})")
        return found


def deploy_request(endpoint: str, model: str, spec: EndpointSpec, registry_version: str = ""):
    """The DeployModelRequest: `model` (a model resource name, with @version or @alias) on
    dedicated machines, all traffic to it once it is ready ("0" is the model being deployed)."""
    from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint
    from google.cloud.aiplatform_v1.types import endpoint_service, machine_resources

    machine = machine_resources.MachineSpec(machine_type=spec.machine_type)
    if spec.accelerator_type:
        machine.accelerator_type = spec.accelerator_type
        machine.accelerator_count = spec.accelerator_count
    deployed = gca_endpoint.DeployedModel(
        model=model, display_name=label_value(f"detpipe-{registry_version or 'champion'}"),
        dedicated_resources=machine_resources.DedicatedResources(
            machine_spec=machine, min_replica_count=spec.min_replicas, max_replica_count=spec.max_replicas))
    return endpoint_service.DeployModelRequest(endpoint=endpoint, deployed_model=deployed, traffic_split={"0": 100})


def undeploy_requests(endpoint: str, previous: list[str], new_id: str) -> list:
    """One UndeployModelRequest per earlier deployed model, the traffic staying on `new_id`."""
    from google.cloud.aiplatform_v1.types import endpoint_service

    return [endpoint_service.UndeployModelRequest(endpoint=endpoint, deployed_model_id=old,
                                                  traffic_split={new_id: 100}) for old in previous if old != new_id]


def endpoint_api(location: str, credentials=None):
    from google.cloud.aiplatform_v1.services.endpoint_service import EndpointServiceClient

    return regional_client(EndpointServiceClient, location, credentials)


def find_endpoint(client, project: str, location: str, name: str):
    """The newest endpoint with display name `name`, or None."""
    found = list(client.list_endpoints(request={"parent": f"projects/{project}/locations/{location}",
                                                "filter": f'display_name="{name}"', "order_by": "create_time desc"}))
    return found[0] if found else None


def find_or_create_endpoint(client, project: str, location: str, name: str, cloud: CloudSettings = CloudSettings()):
    """The newest endpoint with display name `name`, created when there is none (with `cloud`'s
    labels and key)."""
    from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint

    found = find_endpoint(client, project, location, name)
    if found is not None:
        return found
    parent = f"projects/{project}/locations/{location}"
    logger.info("creating Vertex AI endpoint %s", name)
    return client.create_endpoint(parent=parent, endpoint=gca_endpoint.Endpoint(
        display_name=name, labels=cloud.resource_labels(), encryption_spec=cloud.encryption_spec())
    ).result(timeout=DEPLOY_TIMEOUT_S)


def serving_spec(endpoint, name: str) -> EndpointSpec | None:
    """The machines of the deployment that takes most of `endpoint`'s traffic (what a
    roll-back keeps unless told otherwise), or None when nothing is deployed there."""
    if not endpoint.deployed_models:
        return None
    split = dict(endpoint.traffic_split)
    serving = max(endpoint.deployed_models, key=lambda d: split.get(d.id, 0))
    resources = serving.dedicated_resources
    machine = resources.machine_spec
    kind = machine.accelerator_type.name if machine.accelerator_count else ""
    low = resources.min_replica_count or 1
    return EndpointSpec(name, machine.machine_type or EndpointSpec.machine_type, kind, machine.accelerator_count,
                        low, max(low, resources.max_replica_count))


class Deployed(NamedTuple):
    endpoint: str  # the endpoint's resource name, projects/P/locations/L/endpoints/ID
    deployed_model_id: str


def deploy_to_endpoint(model: str, spec: EndpointSpec, project: str, location: str, registry_version: str = "",
                       credentials=None, client=None, cloud: CloudSettings = CloudSettings()) -> Deployed:
    """Deploy `model` to the endpoint of `spec` and undeploy the endpoint's earlier models
    once it serves; returns the endpoint and the new deployed model's id. A failed deployment
    raises and leaves the earlier ones serving."""
    problems = spec.problems()
    if problems:
        raise ValueError("; ".join(problems))
    client = client or endpoint_api(location, credentials)
    endpoint = find_or_create_endpoint(client, project, location, spec.endpoint, cloud)
    previous = [d.id for d in endpoint.deployed_models]
    operation = client.deploy_model(request=deploy_request(endpoint.name, model, spec, registry_version))
    new_id = operation.result(timeout=DEPLOY_TIMEOUT_S).deployed_model.id
    logger.info("deployed %s to %s as %s; undeploying %s", model, endpoint.name, new_id, previous or "nothing")
    for request in undeploy_requests(endpoint.name, previous, new_id):
        client.undeploy_model(request=request).result(timeout=DEPLOY_TIMEOUT_S)
    return Deployed(endpoint.name, new_id)
