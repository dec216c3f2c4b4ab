"""Schedules that list and name their release, labels and keys on every resource detpipe
creates, and a stopped step cancelling the job it started: at request level, on the API's own
message types (aiplatform_v1), each filter checked against the fields the API documents for
it. The real clients build every request; a recording fake at the GAPIC method keeps it and
refuses it (nothing pretends a call succeeded)."""

import contextlib
import hashlib
import json
import os
import re
import signal
import threading
from unittest import mock

import google.api_core.exceptions as gexc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient
from google.cloud.aiplatform_v1.types import pipeline_job as gca_pipeline_job
from google.cloud.aiplatform_v1.types import schedule as gca_schedule
from google.cloud.aiplatform_v1.types import schedule_service

from components.cloud import job_cancel, labels, resources
from components.cloud.labels import RUN_LABELS_ENV
from components.cloud.resources import CloudSettings
from pipeline import vertex_jobs
from pipeline.cli import main
from pipeline.compile import compile_pipeline

REFUSED = "recorded by the test, not sent"
KEY = "projects/proj/locations/europe-west4/keyRings/detpipe/cryptoKeys/runs"
NETWORK = "projects/123456/global/networks/ml-vpc"
CLOUD = CloudSettings({"team": "vision", "cost_center": "cc-42"}, KEY, NETWORK)
RUN = {RUN_LABELS_ENV: json.dumps({"vertex-ai-pipelines-run-billing-id": "987", "team": "overridden"})}
WANTED = {"vertex-ai-pipelines-run-billing-id": "987", "team": "vision", "cost_center": "cc-42", "app": "detpipe"}


def documented_filter_fields(request_class) -> set[str]:
    """The fields a List request's `filter` takes, as its own docstring (the API's reference
    text, generated from the proto) lists them: the ``name`` items of its filter paragraph."""
    text = request_class.__doc__
    paragraph = text[text.index("filter (str):"):]
    paragraph = paragraph[:paragraph.index("Examples:")] if "Examples:" in paragraph else paragraph
    return set(re.findall(r"-\s+``([a-z_.]+)``", paragraph))


def filter_fields(expression: str) -> set[str]:
    """The fields an AIP-160 filter names (before a comparison or `:`)."""
    return {name.split(".")[0] if name.startswith("labels.") else name
            for name in re.findall(r"([A-Za-z_][\w.]*)\s*(?:=|!=|<=|>=|<|>|:)", expression)}


def test_the_schedule_list_filter_names_only_fields_the_api_documents():
    documented = documented_filter_fields(schedule_service.ListSchedulesRequest)
    assert {"display_name", "state", "request", "create_time", "next_run_time"} <= documented
    assert "labels" not in documented
    assert not filter_fields('labels.app="detpipe"') <= documented  # the old filter: a real project refuses it
    # `request` is documented as the existence of a request type: create_pipeline_job_request:*
    assert vertex_jobs.SCHEDULES_FILTER.endswith(":*")
    used = filter_fields(vertex_jobs.SCHEDULES_FILTER)
    assert used and all(name in documented or (name.endswith("_request") and name in gca_schedule.Schedule.meta.fields)
                        for name in used)  # each a documented field, or a request type `request` checks for


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "detpipe.yaml"
    compile_pipeline(path, image="us-docker.pkg.dev/p/r/detpipe:v1")
    return str(path)


def _schedule(name: str, job_labels: dict, **kwargs) -> gca_schedule.Schedule:
    job = gca_pipeline_job.PipelineJob(
        labels=job_labels, service_account="runner@proj.iam.gserviceaccount.com", network=NETWORK,
        encryption_spec={"kms_key_name": KEY},
        runtime_config={"gcs_output_directory": "gs://bucket/root",
                        "parameter_values": {"images": "gs://bucket/images", "epochs": 20}})
    return gca_schedule.Schedule(
        name=f"projects/proj/locations/europe-west4/schedules/{name}", display_name=f"nightly-{name}",
        cron="TZ=Europe/Berlin 0 3 * * *", state=gca_schedule.Schedule.State.ACTIVE,
        next_run_time={"seconds": 1_796_000_000}, create_pipeline_job_request={"pipeline_job": job}, **kwargs)


@pytest.fixture
def schedules():
    """The schedule service with two existing schedules, detpipe's (1) and another team's (2):
    lists and gets answer with them; creates and deletes are recorded and refused."""
    from google.cloud.aiplatform import initializer  # the SDK's import (2-4 s) only in the tests that use it

    calls = []
    existing = {"1": _schedule("1", {"app": "detpipe", "team": "vision", vertex_jobs.RELEASE_LABEL: "a" * 16},
                               max_run_count=10, started_run_count=4, max_concurrent_run_count=2),
                "2": _schedule("2", {"app": "forecasting"})}

    def list_schedules(self, request=None, **kwargs):
        calls.append(("list", request))
        return list(existing.values())

    def get_schedule(self, request=None, name=None, **kwargs):
        name = name or request["name"] if isinstance(request, dict) else name or request.name
        calls.append(("get", name))
        return existing[name.rsplit("/", 1)[-1]]

    def refuse(what):
        def fake(self, *args, **kwargs):
            calls.append((what, kwargs))
            raise gexc.ServiceUnavailable(REFUSED)
        return fake

    patches = [mock.patch.object(ScheduleServiceClient, "list_schedules", list_schedules),
               mock.patch.object(ScheduleServiceClient, "get_schedule", get_schedule),
               mock.patch.object(ScheduleServiceClient, "create_schedule", refuse("create")),
               mock.patch.object(ScheduleServiceClient, "delete_schedule", refuse("delete")),
               mock.patch("google.cloud.aiplatform.utils.gcs_utils."
                          "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **kw: None),
               # aiplatform keeps the credentials it found: they go with this test
               mock.patch.object(initializer.global_config, "_credentials", None),
               mock.patch.object(initializer.global_config, "_project", None)]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield calls


TARGET = vertex_jobs.VertexTarget(project="proj", region="europe-west4", pipeline_root="gs://bucket/root",
                                  service_account="runner@proj.iam.gserviceaccount.com", cloud=CLOUD,
                                  credentials=AnonymousCredentials())


def test_schedule_list_shows_detpipes_schedules_with_the_release_each_runs(schedules):
    rows = vertex_jobs.list_schedules(TARGET)
    (kind, request), = schedules
    assert request["filter"] == vertex_jobs.SCHEDULES_FILTER
    assert [r["name"].rsplit("/", 1)[-1] for r in rows] == ["1"]  # the other team's schedule is not detpipe's
    row = rows[0]
    assert row["release"] == "a" * 16 and row["cron"] == "TZ=Europe/Berlin 0 3 * * *" and row["state"] == "ACTIVE"
    assert row["next_run"].startswith("2026-") and row["runs"] == "4"


def test_schedule_create_freezes_the_release_it_names(schedules, template, capsys, monkeypatch):
    monkeypatch.setattr("google.auth.default", lambda *args, **kwargs: (AnonymousCredentials(), "proj"))
    sha = hashlib.sha256(open(template, "rb").read()).hexdigest()
    code = main(["schedule", "create", "--project", "proj", "--region", "europe-west4", "--pipeline-root",
                 "gs://bucket/root", "--cron", "0 3 * * *", "--template", template, "--label", "team=vision",
                 "--kms-key", KEY, "--network", NETWORK, "--no-experiment"])
    captured = capsys.readouterr()
    assert code == 1 and REFUSED in captured.err  # refused by the recorder, said in one line
    assert f"release {sha[:vertex_jobs.RELEASE_CHARS]} (sha256 of {template})" in captured.out
    (kind, request), = [c for c in schedules if c[0] == "create"]
    schedule = request["schedule"]
    assert isinstance(schedule, gca_schedule.Schedule)
    job = schedule.create_pipeline_job_request.pipeline_job
    assert dict(job.labels) == {"team": "vision", "app": "detpipe", vertex_jobs.RELEASE_LABEL: sha[:16]}
    assert job.encryption_spec.kms_key_name == KEY and job.network == NETWORK


def test_schedule_update_recreates_it_on_the_new_release_and_keeps_the_rest(schedules, template):
    with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
        vertex_jobs.update_schedule(TARGET, "1", template)
    kinds = [c[0] for c in schedules]
    assert kinds == ["get", "create"]  # the create was refused: the old schedule is not deleted
    schedule = schedules[1][1]["schedule"]
    assert schedule.cron == "TZ=Europe/Berlin 0 3 * * *" and schedule.display_name == "nightly-1"
    assert schedule.max_run_count == 6 and schedule.max_concurrent_run_count == 2  # 10 runs, 4 done
    job = schedule.create_pipeline_job_request.pipeline_job
    sha = hashlib.sha256(open(template, "rb").read()).hexdigest()
    assert dict(job.labels) == {"team": "vision", "app": "detpipe", vertex_jobs.RELEASE_LABEL: sha[:16]}
    values = dict(job.runtime_config.parameter_values)
    assert values["images"] == "gs://bucket/images" and values["epochs"] == 20
    assert job.runtime_config.gcs_output_directory == "gs://bucket/root"
    assert job.service_account == "runner@proj.iam.gserviceaccount.com"
    assert job.encryption_spec.kms_key_name == KEY and job.network == NETWORK


def test_an_artifact_registry_tag_is_resolved_to_the_version_it_names_now(monkeypatch):
    asked = []

    def fake_request(self, request_url, request_body="", http_request=None, extra_headers=None):
        asked.append(request_url)
        response = mock.Mock()
        response.json.return_value = {"name": "t", "version": "projects/p/locations/l/repositories/r/packages/"
                                                                "detpipe/versions/sha256:" + "c" * 64}
        return response

    monkeypatch.setattr("kfp.registry.registry_client.RegistryClient._request", fake_request)
    release = vertex_jobs.release_of("https://europe-west4-kfp.pkg.dev/proj/templates/detpipe/latest",
                                     auth=AnonymousCredentials())
    assert release.sha256 == "c" * 64 and asked and asked[0].endswith("/packages/detpipe/tags/latest")
    pinned = vertex_jobs.release_of("https://europe-west4-kfp.pkg.dev/proj/templates/detpipe/sha256:" + "d" * 64)
    assert pinned.label == "d" * 16


@pytest.mark.parametrize("given, problem", [
    (["Team=vision"], "label key 'Team'"), (["team=Vision!"], "the value must be"), (["team"], "takes KEY=VALUE"),
    (["app=other"], "detpipe's own"), (["a=1", "a=2"], "given twice")])
def test_labels_are_checked_against_google_clouds_rules(given, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        labels.parse_labels(given)


def test_keys_and_networks_are_checked_in_one_line_each():
    with pytest.raises(ValueError) as err:
        CloudSettings({}, "my-key", "vpc")
    assert str(err.value).splitlines() == [f"--kms-key must be {resources.KMS_KEY_FORM}, got 'my-key'",
                                           f"--network must be {resources.NETWORK_FORM}, got 'vpc'"]
    assert CloudSettings.from_json(CLOUD.to_json()) == CLOUD


def test_the_examples_in_the_cloud_modules_run():
    import doctest

    for module in (labels, resources, job_cancel, vertex_jobs):
        assert doctest.testmod(module).failed == 0, module.__name__


# --- every create request: the user's labels, the run's, detpipe's, and the key ------------------------------


def _refusing(calls):
    def refuse(self, *args, **kwargs):
        calls.append(kwargs)
        raise gexc.ServiceUnavailable(REFUSED)
    return refuse


def test_a_submitted_run_carries_the_labels_the_key_and_the_network(template):
    from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

    calls = []
    with mock.patch.object(PipelineServiceClient, "create_pipeline_job", _refusing(calls)), \
            mock.patch("google.cloud.aiplatform.utils.gcs_utils."
                       "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **kw: None):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            vertex_jobs.submit(TARGET, template, {"images": "gs://b/i"})
    job = calls[0]["pipeline_job"]
    assert isinstance(job, gca_pipeline_job.PipelineJob)
    assert {k: v for k, v in job.labels.items() if k != vertex_jobs.RELEASE_LABEL} == {
        "team": "vision", "cost_center": "cc-42", "app": "detpipe"}
    assert job.encryption_spec.kms_key_name == KEY and job.network == NETWORK


def test_the_tuning_job_and_its_trials_carry_the_labels_and_the_key(monkeypatch):
    from google.cloud.aiplatform_v1.services.job_service import JobServiceClient
    from google.cloud.aiplatform_v1.types import hyperparameter_tuning_job as gca_hpt

    from components.tune.vertex_job import TrialMachine, tuning_job

    monkeypatch.setattr(os, "environ", {**os.environ, **RUN})
    calls = []
    job = tuning_job("/gcs/b/plan.json", "/gcs/b/trials", TrialMachine("img:1"), trials=3, parallel=2,
                     region="europe-west4", project="proj", credentials=AnonymousCredentials(), seed=5, cloud=CLOUD)
    with mock.patch.object(JobServiceClient, "create_hyperparameter_tuning_job", _refusing(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            job.run(sync=True, network=NETWORK)
    sent = calls[0]["hyperparameter_tuning_job"]
    assert isinstance(sent, gca_hpt.HyperparameterTuningJob)
    assert dict(sent.labels) == {**WANTED, "seed": "5"}
    assert sent.encryption_spec.kms_key_name == KEY
    assert sent.trial_job_spec.network == NETWORK


def test_an_uploaded_model_carries_the_labels_and_the_key(monkeypatch):
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    from components.model_registry.vertex_model import ModelVersion, upload_version

    monkeypatch.setattr(os, "environ", {**os.environ, **RUN})
    calls = []
    version = ModelVersion("detector", "gs://b/saved_model", "img:1", True, "run-1", "ab" * 32, 0.5, "v3")
    with mock.patch.object(ModelServiceClient, "upload_model", _refusing(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            upload_version(version, project="proj", location="europe-west4", credentials=AnonymousCredentials(),
                           cloud=CLOUD)
    model = calls[0]["request"].model
    assert {k: model.labels[k] for k in WANTED} == WANTED and model.labels["registry_version"] == "v3"
    assert model.encryption_spec.kms_key_name == KEY


def test_a_created_endpoint_carries_the_labels_and_the_key(monkeypatch):
    from google.cloud.aiplatform_v1.services.endpoint_service import EndpointServiceClient
    from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint

    from components.model_registry.vertex_endpoint import EndpointSpec, deploy_to_endpoint

    monkeypatch.setattr(os, "environ", {**os.environ, **RUN})
    created = []
    client = EndpointServiceClient(credentials=AnonymousCredentials())
    with mock.patch.object(EndpointServiceClient, "list_endpoints", lambda self, **kwargs: []), \
            mock.patch.object(EndpointServiceClient, "create_endpoint", _refusing(created)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            deploy_to_endpoint("projects/proj/locations/europe-west4/models/1", EndpointSpec("detector"), "proj",
                               "europe-west4", client=client, cloud=CLOUD)
    endpoint = created[0]["endpoint"]
    assert isinstance(endpoint, gca_endpoint.Endpoint)
    assert dict(endpoint.labels) == WANTED and endpoint.encryption_spec.kms_key_name == KEY


def test_a_batch_prediction_job_carries_the_labels_and_the_key(monkeypatch):
    from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

    from components.model_registry.vertex_batch import BatchPredictionSpec, submit_batch_prediction

    monkeypatch.setattr(os, "environ", {**os.environ, **RUN})
    calls = []
    spec = BatchPredictionSpec(model="projects/proj/locations/europe-west4/models/1@champion", source="gs://b/list.txt",
                               destination="gs://b/out")
    with mock.patch.object(JobServiceClient, "create_batch_prediction_job", _refusing(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            submit_batch_prediction(spec, project="proj", location="europe-west4", credentials=AnonymousCredentials(),
                                    sync=True, cloud=CLOUD)
    job = calls[0]["batch_prediction_job"]
    assert dict(job.labels) == WANTED and job.encryption_spec.kms_key_name == KEY


def test_the_dataflow_job_gets_the_labels_and_the_key_as_beams_own_options(monkeypatch):
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    from beam.runner import step_beam_args

    monkeypatch.setattr(os, "environ", {**os.environ, **RUN})
    args = step_beam_args("", "DataflowRunner", "img:1", {"dataflow_project": "my-proj", "dataflow_region": "r",
                                                          "dataflow_temp_location": "gs://b/t"}, CLOUD)
    options = PipelineOptions(list(args)).view_as(GoogleCloudOptions)
    assert dict(label.split("=", 1) for label in options.labels) == WANTED
    assert options.dataflow_kms_key == KEY
    assert "--labels" not in " ".join(step_beam_args("", "DirectRunner", "", {}, CLOUD))  # nothing to label locally


def test_the_compiled_custom_jobs_carry_the_labels_the_key_and_the_network(tmp_path):
    import yaml

    from pipeline.dag import StepResources

    compile_pipeline(tmp_path / "p.yaml", resources=StepResources(train_runner="customjob", cloud=CLOUD))
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    for step in ("comp-train", "comp-tune-hyperparameters"):
        inputs = spec["components"][step]["inputDefinitions"]["parameters"]  # GCPC's custom job inputs
        assert inputs["encryption_spec_key_name"]["defaultValue"] == KEY
        assert inputs["network"]["defaultValue"] == NETWORK
        assert inputs["labels"]["defaultValue"] == {"team": "vision", "cost_center": "cc-42", "app": "detpipe"}
    data = spec["root"]["dag"]["tasks"]["validate-and-convert"]["inputs"]["parameters"]
    assert CloudSettings.from_json(data["cloud"]["runtimeValue"]["constant"]) == CLOUD
    compile_pipeline(tmp_path / "b.yaml", resources=StepResources(cloud=CLOUD), pipeline="batch-predict")
    batch = yaml.safe_load((tmp_path / "b.yaml").read_text())["root"]["dag"]["tasks"]["batch-predict"]
    assert CloudSettings.from_json(batch["inputs"]["parameters"]["cloud"]["runtimeValue"]["constant"]) == CLOUD


# --- a stopped step cancels what it started ---------------------------------------------------------------------


class _Job:
    """A started job (Dataflow's result or a Vertex AI job) that records `cancel`; waiting for it
    is when Vertex AI stops the step (a SIGTERM to this process), and it waits until cancelled."""

    def __init__(self):
        self.cancelled = 0
        self._done = threading.Event()
        self.resource_name = "projects/proj/locations/europe-west4/hyperparameterTuningJobs/42"

    def job_id(self):
        return "2026-12-02_03_00_00-77"

    def cancel(self):
        self.cancelled += 1
        self._done.set()

    def wait_until_finish(self):
        os.kill(os.getpid(), signal.SIGTERM)
        self._done.wait(30)

    wait = wait_until_finish


def test_sigterm_during_the_data_step_on_dataflow_cancels_its_job_once(demo_dir, tmp_path, capsys, monkeypatch):
    """The real data job's graph on DataflowRunner, its run replaced by a job that records
    `cancel`: a SIGTERM while the step waits cancels it once, in one line, and the step's
    gcp_resources names it as GCPC's Dataflow launcher does."""
    import apache_beam as beam
    from google.protobuf import json_format
    from google_cloud_pipeline_components.proto.gcp_resources_pb2 import GcpResources

    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions

    job = _Job()
    monkeypatch.setattr(beam.Pipeline, "run", lambda self, test_runner_api="AUTO": job)
    out, record = tmp_path / "dataset", tmp_path / "gcp_resources"
    hold = job_cancel.held_dataflow_job(str(record), "my-proj", "europe-west4")
    options = ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                             output=str(out), runner="DataflowRunner",
                             beam_args=("--project=my-proj", "--region=europe-west4", "--temp_location=gs://bucket/tmp",
                                        "--dry_run=True"))  # Beam's own: no bucket check over the network
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(job_cancel.Stopped) as stopped:
        build_dataset(options, hold_job=hold)
    assert stopped.value.code == 143 and job.cancelled == 1
    assert signal.getsignal(signal.SIGTERM) == previous
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("detpipe:")]
    assert lines == ["detpipe: stopped: cancelled Dataflow job 2026-12-02_03_00_00-77"]
    message = json_format.Parse(record.read_text(), GcpResources())
    (resource,) = message.resources
    assert resource.resource_type == "DataflowJob"
    assert resource.resource_uri == ("https://dataflow.googleapis.com/v1b3/projects/my-proj/locations/europe-west4/"
                                     "jobs/2026-12-02_03_00_00-77")
    assert not (out / "_job").exists()  # the step's own clean-up still ran


def test_sigterm_while_the_tune_step_waits_for_its_vertex_job_cancels_it_once(tmp_path, capsys, monkeypatch):
    """search_on_vertex with a job that records `cancel`: the defaults train (stubbed: the
    trainer's own SIGTERM path is tests/test_checkpoints.py's), then a SIGTERM while the step
    waits for the trials."""
    from google.protobuf import json_format
    from google_cloud_pipeline_components.proto.gcp_resources_pb2 import GcpResources

    from components.tune import vertex_job
    from components.tune.budget import SearchBudget

    job = _Job()
    monkeypatch.setattr(vertex_job, "tuning_job", lambda *args, **kwargs: "its request (tested above)")
    monkeypatch.setattr(vertex_job, "submit", lambda *args, **kwargs: job)
    monkeypatch.setattr(vertex_job, "train_rungs", lambda *args, **kwargs: 0.1)
    record = tmp_path / "gcp_resources"
    budget = SearchBudget(trials=4, trial_epochs=1, cost=1.0, reason="given")
    with pytest.raises(job_cancel.Stopped):
        vertex_job.search_on_vertex(str(tmp_path), budget, None, mock.Mock(stops=[1]), {}, json.dumps(
            {"image": "img:1"}), "europe-west4", 2, 0, CLOUD.to_json(), str(record))
    assert job.cancelled == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("detpipe:")]
    assert lines == [f"detpipe: stopped: cancelled Vertex AI tuning job {job.resource_name}"]
    (resource,) = json_format.Parse(record.read_text(), GcpResources()).resources
    assert resource.resource_type == "HyperparameterTuningJob"
    assert resource.resource_uri == f"https://europe-west4-aiplatform.googleapis.com/v1/{job.resource_name}"


def test_a_second_sigterm_while_cancelling_does_not_cancel_twice():
    calls = []

    def cancel():
        calls.append(1)
        os.kill(os.getpid(), signal.SIGTERM)  # Vertex AI may signal again while the cancel is sent

    with pytest.raises(job_cancel.Stopped):
        with job_cancel.cancelled_on_sigterm(cancel, "a job"):
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(5)
    assert calls == [1]


# --- the evaluation in the Model Registry ------------------------------------------------------------------------

# The image object detection metrics schema's fields (gs://google-cloud-aiplatform/schema/modelevaluation/
# image_object_detection_metrics_1.0.0.yaml; aiplatform v1 REST reference, SchemaModelevaluationMetrics*).
SCHEMA_FIELDS = {
    "": {"evaluatedBoundingBoxCount", "boundingBoxMetrics", "boundingBoxMeanAveragePrecision"},
    "boundingBoxMetrics": {"iouThreshold", "meanAveragePrecision", "confidenceMetrics"},
    "confidenceMetrics": {"confidenceThreshold", "recall", "precision", "f1Score"},
}


def _schema_problems(found: dict, where: str = "") -> list[str]:
    problems = [f"{where or 'metrics'}: {key} is not in the schema" for key in set(found) - SCHEMA_FIELDS[where]]
    for key in ("boundingBoxMetrics", "confidenceMetrics"):
        for item in found.get(key, []):
            problems += _schema_problems(item, key)
    return problems


@pytest.fixture(scope="module")
def raccoon_evaluation(raccoon_model, raccoon_shards, tmp_path_factory):
    """metrics.json as the evaluate step writes it, for a model trained on raccoon's real photos."""
    from components.evaluate.evaluator import evaluate_detector
    from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics

    out = tmp_path_factory.mktemp("raccoon_eval")
    evaluate_detector(str(raccoon_model), str(raccoon_shards), str(out))
    return EvalMetrics.read(out / METRICS_FILE)


def test_the_evaluation_import_request_holds_a_real_evaluation_in_the_schemas_fields(raccoon_evaluation):
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient
    from google.cloud.aiplatform_v1.types import ModelEvaluation, ModelEvaluationSlice
    from google.protobuf import json_format

    from components.evaluate.threshold import CONFIDENCE_THRESHOLDS
    from components.register.vertex_evaluation import (METRICS_SCHEMA, SLICE_DIMENSION, import_evaluation,
                                                             slice_messages)

    measured = raccoon_evaluation
    calls = []
    client = ModelServiceClient(credentials=AnonymousCredentials())
    version = "projects/proj/locations/europe-west4/models/1234@7"
    with mock.patch.object(ModelServiceClient, "import_model_evaluation", _refusing(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            import_evaluation(version, measured, "detpipe v7", client)
    (call,) = calls
    assert call["parent"] == version
    sent = call["model_evaluation"]
    assert isinstance(sent, ModelEvaluation) and sent.metrics_schema_uri == METRICS_SCHEMA
    assert sent.display_name == "detpipe v7"
    metrics = json_format.MessageToDict(sent._pb.metrics)
    assert _schema_problems(metrics) == []
    assert metrics["boundingBoxMeanAveragePrecision"] == pytest.approx(measured.metrics["mAP"])
    at_50, at_75 = metrics["boundingBoxMetrics"]
    assert (at_50["iouThreshold"], at_75["iouThreshold"]) == (0.5, 0.75)
    assert at_50["meanAveragePrecision"] == pytest.approx(measured.metrics["AP50"])
    assert at_75["meanAveragePrecision"] == pytest.approx(measured.metrics["AP75"])
    curve = at_50["confidenceMetrics"]
    assert [p["confidenceThreshold"] for p in curve] == pytest.approx(list(CONFIDENCE_THRESHOLDS))
    assert all(0.0 <= p[k] <= 1.0 for p in curve for k in ("precision", "recall", "f1Score"))
    recalls = [p["recall"] for p in curve]
    assert recalls == sorted(recalls, reverse=True)  # a higher threshold keeps fewer detections
    assert int(metrics["evaluatedBoundingBoxCount"]) == measured.curve.boxes > 0
    (raccoon,) = slice_messages(measured)  # one class
    assert isinstance(raccoon, ModelEvaluationSlice) and raccoon.metrics_schema_uri == METRICS_SCHEMA
    assert (raccoon.slice_.dimension, raccoon.slice_.value) == (SLICE_DIMENSION, "raccoon")
    per_class = json_format.MessageToDict(raccoon._pb.metrics)
    assert _schema_problems(per_class) == []
    assert per_class["boundingBoxMeanAveragePrecision"] == pytest.approx(measured.per_class["raccoon"])


def test_registry_show_reads_the_imported_evaluation_back(raccoon_evaluation):
    """What `registry show --vertex-model` prints: the newest evaluation a version holds, read
    from the list the service answers (here: the message the import sends, as stored)."""
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    from components.register.vertex_evaluation import evaluation_line, evaluation_message, read_evaluation

    stored = evaluation_message(raccoon_evaluation, "detpipe v7")
    asked = []

    def list_model_evaluations(self, parent=None, **kwargs):
        asked.append(parent)
        return [stored]

    with mock.patch.object(ModelServiceClient, "list_model_evaluations", list_model_evaluations):
        found = read_evaluation("projects/p/locations/l/models/1@7", ModelServiceClient(credentials=AnonymousCredentials()))
    assert asked == ["projects/p/locations/l/models/1@7"]
    line = evaluation_line(found)
    assert line.startswith(f"Vertex AI evaluation: mAP {raccoon_evaluation.metrics['mAP']:.4f}, AP@0.5 ")


def test_register_sends_the_evaluation_for_the_version_it_uploaded(tmp_path, monkeypatch):
    """register_and_upload on a gs:// registry (tests/fake_gcs.py): after the upload (its answer
    stands in for the service's: the model and version it names) the next request is the
    evaluation's import for that very version, refused by the recorder."""
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    from components.model_registry import vertex_model
    from components.model_registry.registry import Registry
    from components.register import register
    from tests.fake_gcs import FakeClient
    from tests.test_registry import _decision, _run_files

    registry = Registry.open("gs://b/reg", client=FakeClient())
    monkeypatch.setattr(register.Registry, "open", lambda uri, name: registry)
    uploaded = []
    monkeypatch.setattr(vertex_model, "find_parent_model", lambda *args, **kwargs: None)
    monkeypatch.setattr(vertex_model, "upload_version", lambda version, **kwargs: uploaded.append((version, kwargs))
                        or mock.Mock(resource_name="projects/proj/locations/europe-west4/models/1234", version_id="7"))
    monkeypatch.setattr(vertex_model, "model_api", lambda location, credentials=None: ModelServiceClient(
        credentials=AnonymousCredentials()))
    calls = []
    files = _run_files(tmp_path)
    with mock.patch.object(ModelServiceClient, "import_model_evaluation", _refusing(calls)):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            register.register_and_upload("gs://b/reg", "detpipe", str(files / "saved_model"), str(files / "data"),
                                         str(files / "metrics.json"), _decision(True, None), {"sha256": "a" * 64},
                                         "run-1", vertex_model="detector", vertex_region="europe-west4",
                                         serving_image="img:1", cloud=CLOUD)
    (version, kwargs), = uploaded
    assert version.registry_version == "v1" and kwargs["cloud"] == CLOUD
    (call,) = calls
    assert call["parent"] == "projects/proj/locations/europe-west4/models/1234@7"
    from google.protobuf import json_format

    sent = json_format.MessageToDict(call["model_evaluation"]._pb.metrics)
    assert sent["boundingBoxMeanAveragePrecision"] == pytest.approx(0.3) and _schema_problems(sent) == []
