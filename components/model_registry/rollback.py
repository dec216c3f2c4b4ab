"""A champion chosen by hand (`detpipe registry promote VERSION`, to pin or roll back) on
Vertex AI too, where the pipeline put its champions: the Model Registry's `champion` and
`default` aliases move to the Vertex AI version uploaded for VERSION and, with an endpoint,
that version is deployed behind it.

Order: the endpoint first (a failed deployment leaves the earlier model serving and nothing
else moved), then the aliases; the caller moves the local registry's champion.json last.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from components.model_registry.vertex_endpoint import (
    EndpointSpec,
    deploy_to_endpoint,
    endpoint_api,
    find_endpoint,
    parse_accelerator,
    serving_spec,
)
from components.model_registry.vertex_model import make_champion, model_resource, vertex_version_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VertexPromotion:
    model: str  # display name (the pipeline's vertex_model) or projects/P/locations/L/models/ID
    project: str
    location: str
    endpoint: str = ""  # display name; "" leaves endpoints alone
    machine_type: str | None = None  # None (each of these): as the endpoint serves now
    accelerator: str | None = None  # TYPE[:COUNT], "" for none
    min_replicas: int | None = None
    max_replicas: int | None = None


def endpoint_spec(promotion: VertexPromotion, serving: EndpointSpec | None) -> EndpointSpec:
    """The machines for the redeployment: what is given, else what `serving` (the endpoint's
    current deployment) runs on, else the defaults.

    >>> now = EndpointSpec("det", "g2-standard-4", "NVIDIA_L4", 1, 1, 3)
    >>> endpoint_spec(VertexPromotion("m", "p", "l", "det", max_replicas=5), now)
    EndpointSpec(endpoint='det', machine_type='g2-standard-4', accelerator_type='NVIDIA_L4', accelerator_count=1, \
min_replicas=1, max_replicas=5)
    """
    base = serving or EndpointSpec(promotion.endpoint)
    kind, count = (parse_accelerator(promotion.accelerator) if promotion.accelerator is not None
                   else (base.accelerator_type, base.accelerator_count))
    low = promotion.min_replicas or base.min_replicas
    return EndpointSpec(promotion.endpoint, promotion.machine_type or base.machine_type, kind, count, low,
                        promotion.max_replicas or max(low, base.max_replicas))


def promote_on_vertex(promotion: VertexPromotion, registry_version: str, credentials=None, model_client=None,
                      endpoint_client=None) -> str:
    """Make the Vertex AI version uploaded for `registry_version` the champion (and deploy it
    behind `promotion.endpoint`); returns that version's MODEL@ID. Raises NotOnVertex (a
    LookupError and a ValueError) when the model or version is not on Vertex AI, ValueError
    for machines Vertex AI cannot run."""
    model = model_resource(promotion.model.partition("@")[0], promotion.project, promotion.location, credentials)
    version = vertex_version_of(model, registry_version, promotion.location, credentials, model_client)
    if promotion.endpoint:
        client = endpoint_client or endpoint_api(promotion.location, credentials)
        current = find_endpoint(client, promotion.project, promotion.location, promotion.endpoint)
        spec = endpoint_spec(promotion, serving_spec(current, promotion.endpoint) if current is not None else None)
        logger.info("deploying %s (%s) to endpoint %s", version, registry_version, promotion.endpoint)
        deploy_to_endpoint(version, spec, promotion.project, promotion.location, registry_version=registry_version,
                           credentials=credentials, client=client)
    make_champion(version, promotion.location, credentials, model_client)
    return version
