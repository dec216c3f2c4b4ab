"""The Vertex AI Model Registry upload of the register step, at request level: the real
aiplatform client builds the request; a recording fake at the GAPIC method keeps it and
refuses it (nothing pretends the upload succeeded)."""

from unittest import mock

import google.api_core.exceptions as gexc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient
from google.cloud.aiplatform_v1.types import model as gca_model

from components.model_registry.vertex_model import ModelVersion, find_parent_model, label_value, upload_version

REFUSED = "recorded by the test, not sent"
PARENT = "projects/proj/locations/europe-west4/models/1234"
WHERE = {"project": "proj", "location": "europe-west4", "credentials": AnonymousCredentials()}


def _version(blessed: bool) -> ModelVersion:
    return ModelVersion(display_name="detpipe-shapes", artifact_uri="gs://bucket/registry/detpipe/versions/v7/saved_model",
                        serving_image="europe-docker.pkg.dev/proj/repo/detpipe:v1", blessed=blessed,
                        run_id="detpipe-20261121-030000", data_fingerprint="ab" * 32, map=0.3521,
                        registry_version="v7", description="ΔmAP +0.011 (95% CI -0.004 .. +0.027): not worse")


@pytest.fixture
def uploads():
    calls = []

    def refuse(self, *args, **kwargs):
        calls.append(kwargs["request"])
        raise gexc.ServiceUnavailable(REFUSED)

    with mock.patch.object(ModelServiceClient, "upload_model", refuse):
        yield calls


@pytest.mark.parametrize("blessed", [True, False])
def test_upload_request_for_a_blessed_and_a_rejected_version(uploads, blessed):
    with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
        upload_version(_version(blessed), parent_model=PARENT, **WHERE)
    (request,) = uploads
    assert request.parent == "projects/proj/locations/europe-west4"
    assert request.parent_model == PARENT
    model = request.model
    assert model.display_name == "detpipe-shapes"
    assert model.artifact_uri == "gs://bucket/registry/detpipe/versions/v7/saved_model"
    # The default version and the champion alias go to a blessed version only.
    assert sorted(model.version_aliases) == (["champion", "default"] if blessed else [])
    assert dict(model.labels) == {"app": "detpipe", "run_id": "detpipe-20261121-030000", "data_fingerprint": "ab" * 16,
                                  "map": "0-3521", "registry_version": "v7",
                                  "verdict": "blessed" if blessed else "rejected"}
    spec = model.container_spec
    assert spec.image_uri == "europe-docker.pkg.dev/proj/repo/detpipe:v1"
    assert list(spec.command) == ["detpipe"] and list(spec.args) == ["serve"]
    assert [p.container_port for p in spec.ports] == [8080]
    assert spec.predict_route == "/predict" and spec.health_route == "/health"
    assert model.version_description.startswith("ΔmAP +0.011")


def test_first_upload_has_no_parent_model(uploads):
    with pytest.raises(gexc.ServiceUnavailable):
        upload_version(_version(True), parent_model=None, **WHERE)
    assert not uploads[0].parent_model


def test_parent_model_is_found_by_display_name():
    requests = []

    def listing(self, *args, **kwargs):
        requests.append(kwargs["request"])
        return [gca_model.Model(name=PARENT, display_name="detpipe-shapes")]

    with mock.patch.object(ModelServiceClient, "list_models", listing):
        assert find_parent_model("detpipe-shapes", **WHERE) == PARENT
    assert requests[0]["filter"] == 'display_name="detpipe-shapes"'
    with mock.patch.object(ModelServiceClient, "list_models", lambda self, *a, **k: []):
        assert find_parent_model("new-model", **WHERE) is None


def test_a_local_registry_cannot_be_served_by_vertex():
    local = ModelVersion(**{**_version(True).__dict__, "artifact_uri": "/tmp/registry/v1/saved_model"})
    with pytest.raises(ValueError, match="gs:// only"):
        upload_version(local, **WHERE)


def test_label_values_follow_google_cloud_rules():
    assert label_value("Detpipe Run 2026.11.21") == "detpipe-run-2026-11-21"
    assert len(label_value("x" * 100)) == 63
