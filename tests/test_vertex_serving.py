"""Vertex AI batch prediction and the champion's endpoint, at request level: the real
Vertex AI client builds each request; a recording fake at the GAPIC method keeps it and
refuses it (nothing pretends a job ran or a model was deployed)."""

from unittest import mock

import google.api_core.exceptions as gexc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.endpoint_service import EndpointServiceClient
from google.cloud.aiplatform_v1.services.job_service import JobServiceClient
from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient
from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint
from google.cloud.aiplatform_v1.types import machine_resources
from google.cloud.aiplatform_v1.types import model as gca_model

from components.model_registry.vertex_batch import BatchPredictionSpec, champion_of, submit_batch_prediction
from components.register.register import register_run
from components.model_registry.registry import Registry
from components.model_registry.rollback import VertexPromotion, promote_on_vertex
from components.model_registry.vertex_endpoint import EndpointSpec, deploy_to_endpoint, serving_spec, undeploy_requests
from pipeline.cli import main
from tests.test_registry import _decision, _run_files

REFUSED = "recorded by the test, not sent"
MODEL = "projects/proj/locations/europe-west4/models/1234"
WHERE = {"project": "proj", "location": "europe-west4", "credentials": AnonymousCredentials()}


def _recording(calls):
    def refuse(self, *args, **kwargs):
        calls.append(kwargs)
        raise gexc.ServiceUnavailable(REFUSED)
    return refuse


def test_batch_prediction_job_request_runs_the_champion_on_a_file_list():
    calls = []
    spec = BatchPredictionSpec(champion_of(MODEL), "gs://b/photos/list.txt", "gs://b/predictions",
                               accelerator_type="NVIDIA_TESLA_T4", accelerator_count=1, replicas=3,
                               score_threshold=0.4)
    with mock.patch.object(JobServiceClient, "create_batch_prediction_job", _recording(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            submit_batch_prediction(spec, sync=True, **WHERE)
    (call,) = calls
    assert call["parent"] == "projects/proj/locations/europe-west4"
    job = call["batch_prediction_job"]
    assert job.model == MODEL + "@champion" and job.display_name == "detpipe-batch-predict"
    assert list(job.input_config.gcs_source.uris) == ["gs://b/photos/list.txt"]
    assert job.input_config.instances_format == "file-list"  # Vertex sends each file as {"b64": ...}
    assert job.output_config.gcs_destination.output_uri_prefix == "gs://b/predictions"
    assert job.output_config.predictions_format == "jsonl"
    machine = job.dedicated_resources.machine_spec
    assert machine.machine_type == "n1-standard-4" and machine.accelerator_count == 1
    assert machine.accelerator_type.name == "NVIDIA_TESLA_T4"
    assert job.dedicated_resources.starting_replica_count == 3 == job.dedicated_resources.max_replica_count
    assert dict(job.model_parameters)["score_threshold"] == 0.4  # the requests' parameters
    assert dict(job.labels) == {"app": "detpipe"}


def test_a_batch_spec_vertex_cannot_run_is_refused_before_any_request():
    spec = BatchPredictionSpec(MODEL, "photos/list.txt", "out", instances_format="csv", accelerator_count=1)
    with pytest.raises(ValueError) as err:
        submit_batch_prediction(spec, **WHERE)
    text = str(err.value)
    assert "instances format must be one of file-list, jsonl" in text and "source must be a gs:// path" in text
    assert "destination must be a gs:// path" in text and "accelerator type and a count" in text
    assert champion_of(MODEL + "@7") == MODEL + "@7"


def _endpoint(*deployed: str) -> gca_endpoint.Endpoint:
    return gca_endpoint.Endpoint(name="projects/proj/locations/europe-west4/endpoints/99", display_name="detector",
                                 deployed_models=[gca_endpoint.DeployedModel(id=i) for i in deployed])


def test_deploying_the_champion_moves_all_traffic_and_keeps_the_old_model_until_it_serves():
    listed, deploys, undeploys = [], [], []

    def list_endpoints(self, *args, **kwargs):
        listed.append(kwargs["request"])
        return [_endpoint("111")]  # the endpoint exists and serves the previous champion

    client = EndpointServiceClient(credentials=AnonymousCredentials())
    spec = EndpointSpec("detector", machine_type="g2-standard-4", accelerator_type="NVIDIA_L4", accelerator_count=1,
                        min_replicas=1, max_replicas=3)
    with mock.patch.object(EndpointServiceClient, "list_endpoints", list_endpoints), \
            mock.patch.object(EndpointServiceClient, "deploy_model", _recording(deploys)), \
            mock.patch.object(EndpointServiceClient, "undeploy_model", _recording(undeploys)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            deploy_to_endpoint(MODEL + "@5", spec, "proj", "europe-west4", registry_version="v5", client=client)
    assert listed[0]["filter"] == 'display_name="detector"'
    assert listed[0]["parent"] == "projects/proj/locations/europe-west4"
    request = deploys[0]["request"]
    assert request.endpoint == "projects/proj/locations/europe-west4/endpoints/99"
    assert dict(request.traffic_split) == {"0": 100}  # all traffic to the new model once it is ready
    deployed = request.deployed_model
    assert deployed.model == MODEL + "@5" and deployed.display_name == "detpipe-v5"
    resources = deployed.dedicated_resources
    assert resources.machine_spec.machine_type == "g2-standard-4" and resources.machine_spec.accelerator_count == 1
    assert (resources.min_replica_count, resources.max_replica_count) == (1, 3)
    assert undeploys == []  # the deployment failed: the previous champion keeps serving


def test_a_missing_endpoint_is_created_and_old_models_go_only_after_the_new_one():
    created = []
    client = EndpointServiceClient(credentials=AnonymousCredentials())
    with mock.patch.object(EndpointServiceClient, "list_endpoints", lambda self, **kwargs: []), \
            mock.patch.object(EndpointServiceClient, "create_endpoint", _recording(created)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            deploy_to_endpoint(MODEL, EndpointSpec("detector"), "proj", "europe-west4", client=client)
    assert created[0]["parent"] == "projects/proj/locations/europe-west4"
    assert created[0]["endpoint"].display_name == "detector"
    requests = undeploy_requests("e", ["111", "222", "333"], "333")
    assert [(r.deployed_model_id, dict(r.traffic_split)) for r in requests] == [("111", {"333": 100}),
                                                                              ("222", {"333": 100})]
    with pytest.raises(ValueError, match="min"):
        deploy_to_endpoint(MODEL, EndpointSpec("detector", min_replicas=2, max_replicas=1), "proj", "l", client=client)


def _serving_endpoint() -> gca_endpoint.Endpoint:
    """An endpoint that serves deployed model 111 on one to three L4 machines (all its traffic)."""
    resources = machine_resources.DedicatedResources(
        machine_spec=machine_resources.MachineSpec(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                                                   accelerator_count=1),
        min_replica_count=1, max_replica_count=3)
    return gca_endpoint.Endpoint(name="projects/proj/locations/europe-west4/endpoints/99", display_name="detector",
                                 deployed_models=[gca_endpoint.DeployedModel(id="111", dedicated_resources=resources)],
                                 traffic_split={"111": 100})


def _uploaded_versions(listed):
    """Two Vertex AI versions uploaded for the same registry version (a rerun): the newest counts."""
    def list_model_versions(self, *args, **kwargs):
        listed.append(kwargs["request"])
        return [gca_model.Model(name=MODEL, version_id="4", version_create_time={"seconds": 100}),
                gca_model.Model(name=MODEL, version_id="6", version_create_time={"seconds": 200})]
    return list_model_versions


def test_a_roll_back_redeploys_the_version_on_the_machines_the_endpoint_serves_on():
    listed, deploys, aliases = [], [], []
    promotion = VertexPromotion(MODEL + "@9", "proj", "europe-west4", endpoint="detector", max_replicas=5)
    with mock.patch.object(ModelServiceClient, "list_model_versions", _uploaded_versions(listed)), \
            mock.patch.object(ModelServiceClient, "merge_version_aliases", _recording(aliases)), \
            mock.patch.object(EndpointServiceClient, "list_endpoints", lambda self, **kw: [_serving_endpoint()]), \
            mock.patch.object(EndpointServiceClient, "deploy_model", _recording(deploys)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            promote_on_vertex(promotion, "v3", credentials=AnonymousCredentials())
    assert listed[0].name == MODEL and listed[0].filter == 'labels.registry_version="v3"'
    request = deploys[0]["request"]
    assert request.deployed_model.model == MODEL + "@6" and request.deployed_model.display_name == "detpipe-v3"
    assert dict(request.traffic_split) == {"0": 100}
    resources = request.deployed_model.dedicated_resources
    assert resources.machine_spec.machine_type == "g2-standard-8"  # as it serves now
    assert resources.machine_spec.accelerator_type.name == "NVIDIA_L4" and resources.machine_spec.accelerator_count == 1
    assert (resources.min_replica_count, resources.max_replica_count) == (1, 5)  # --max-replicas 5
    assert aliases == []  # the deployment failed: the champion alias stays where it was


def test_promoting_on_vertex_moves_the_champion_and_default_aliases():
    aliases = []
    with mock.patch.object(ModelServiceClient, "list_model_versions", _uploaded_versions([])), \
            mock.patch.object(ModelServiceClient, "merge_version_aliases", _recording(aliases)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            promote_on_vertex(VertexPromotion(MODEL, "proj", "europe-west4"), "v3", credentials=AnonymousCredentials())
    request = aliases[0]["request"]
    assert request.name == MODEL + "@6" and sorted(request.version_aliases) == ["champion", "default"]
    with mock.patch.object(ModelServiceClient, "list_model_versions", lambda self, **kw: []):
        with pytest.raises(LookupError, match="no version labelled registry_version=v8"):
            promote_on_vertex(VertexPromotion(MODEL, "proj", "europe-west4"), "v8", credentials=AnonymousCredentials())
    assert serving_spec(gca_endpoint.Endpoint(), "detector") is None  # nothing deployed: the defaults apply
    assert serving_spec(_serving_endpoint(), "detector") == EndpointSpec("detector", "g2-standard-8", "NVIDIA_L4", 1,
                                                                         1, 3)


def test_registry_promote_with_an_endpoint_redeploys_first_and_moves_nothing_when_that_fails(tmp_path, capsys):
    registry = Registry.open(str(tmp_path / "reg"))
    files = _run_files(tmp_path)
    for i in (1, 2):  # v1 and v2, both blessed: v2 is the champion
        (files / "saved_model" / "saved_model.pb").write_bytes(b"model %d" % i)
        register_run(registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"),
                     _decision(True, "v1" if i > 1 else None), {"sha256": f"{i}" * 64}, f"run-{i}")
    where = ["--registry", str(tmp_path / "reg")]
    vertex = ["--vertex-model", MODEL, "--project", "proj", "--region", "europe-west4"]
    listed, deploys, aliases = [], [], []
    with mock.patch("google.auth.default", return_value=(AnonymousCredentials(), "proj")), \
            mock.patch.object(ModelServiceClient, "list_model_versions", _uploaded_versions(listed)), \
            mock.patch.object(ModelServiceClient, "merge_version_aliases", _recording(aliases)), \
            mock.patch.object(EndpointServiceClient, "list_endpoints", lambda self, **kw: [_serving_endpoint()]), \
            mock.patch.object(EndpointServiceClient, "deploy_model", _recording(deploys)):
        code = main(["registry", "promote", "v1", "--reason", "roll back: v2 misses night photos", *where, *vertex,
                     "--endpoint", "detector"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and REFUSED in err[0]
    assert listed[0].filter == 'labels.registry_version="v1"'
    assert deploys[0]["request"].deployed_model.model == MODEL + "@6" and aliases == []
    assert registry.champion_version() == "v2"  # nothing moved: the endpoint still serves v2's model
    assert main(["registry", "promote", "v1", "--reason", "x", *where, "--endpoint", "detector"]) == 1
    assert "--endpoint needs --vertex-model" in capsys.readouterr().err
    assert main(["registry", "promote", "v9", "--reason", "x", *where, *vertex]) == 1  # before any request
    assert "no version v9" in capsys.readouterr().err
    with mock.patch("google.auth.default", return_value=(AnonymousCredentials(), "proj")), \
            mock.patch.object(ModelServiceClient, "list_model_versions", lambda self, **kw: []):
        assert main(["registry", "promote", "v1", "--reason", "x", *where, *vertex]) == 1  # one line, no traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no version labelled registry_version=v1" in err[0]
    assert registry.champion_version() == "v2"


def test_the_examples_in_the_serving_modules_run():
    import doctest

    from components.model_registry import rollback, vertex_endpoint, vertex_model
    from components.serve import batch_job, batch_workers

    for module in (rollback, vertex_endpoint, vertex_model, batch_job, batch_workers):
        assert doctest.testmod(module).failed == 0, module.__name__
