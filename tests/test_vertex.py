"""Vertex AI and Artifact Registry, without a network: the real aiplatform and kfp
client code runs up to the transport, where a recording fake keeps the request and
refuses it (it never pretends the call succeeded). Tests assert on those requests."""

import hashlib
from unittest import mock

import google.api_core.exceptions as gexc
import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient
from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient

from pipeline import vertex_jobs
from pipeline.cli import main
from pipeline.compile import compile_pipeline
from pipeline.template_registry import upload_template

REFUSED = "recorded by the test, not sent"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "detpipe.yaml"
    compile_pipeline(path, image="us-docker.pkg.dev/p/r/detpipe:v1")
    return str(path)


@pytest.fixture
def recorder():
    """Record every request the clients would send, then refuse it."""
    calls = []

    def refuse(name):
        def fake(self, *args, **kwargs):
            calls.append((name, kwargs or {"args": args}))
            raise gexc.ServiceUnavailable(REFUSED)
        return fake

    buckets = []
    patches = [
        mock.patch.object(PipelineServiceClient, "create_pipeline_job", refuse("create_pipeline_job")),
        mock.patch.object(ScheduleServiceClient, "create_schedule", refuse("create_schedule")),
        mock.patch.object(ScheduleServiceClient, "list_schedules", refuse("list_schedules")),
        mock.patch.object(ScheduleServiceClient, "get_schedule", refuse("get_schedule")),
        # aiplatform checks the pipeline-root bucket over HTTP before submitting: record that too.
        mock.patch("google.cloud.aiplatform.utils.gcs_utils.create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
                   lambda **kw: buckets.append(kw)),
    ]
    for p in patches:
        p.start()
    yield calls, buckets
    for p in patches:
        p.stop()


TARGET = vertex_jobs.VertexTarget(project="proj", region="europe-west4", pipeline_root="gs://bucket/root",
                                  service_account="runner@proj.iam.gserviceaccount.com",
                                  credentials=AnonymousCredentials())
PARAMS = {"images": "gs://bucket/images", "annotations": "gs://bucket/coco.json", "data_format": "coco", "epochs": 20}


def test_submit_request_carries_every_setting(recorder, template):
    calls, buckets = recorder
    with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
        vertex_jobs.submit(TARGET, template, PARAMS, display_name="nightly")
    (name, request), = calls
    job = request["pipeline_job"]
    assert name == "create_pipeline_job" and request["parent"] == "projects/proj/locations/europe-west4"
    assert job.display_name == "nightly"
    assert job.service_account == "runner@proj.iam.gserviceaccount.com"
    assert job.runtime_config.gcs_output_directory == "gs://bucket/root"
    values = dict(job.runtime_config.parameter_values)
    assert values["images"] == "gs://bucket/images" and values["data_format"] == "coco" and values["epochs"] == 20
    release = hashlib.sha256(open(template, "rb").read()).hexdigest()[:vertex_jobs.RELEASE_CHARS]
    assert dict(job.labels) == {"app": "detpipe", vertex_jobs.RELEASE_LABEL: release}  # the run says what it ran
    spec = job.pipeline_spec
    assert spec["pipelineInfo"]["name"] == "detpipe"
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"us-docker.pkg.dev/p/r/detpipe:v1"}
    assert buckets and buckets[0]["output_artifacts_gcs_dir"] == "gs://bucket/root"


def test_schedule_create_request_has_cron_and_concurrency(recorder, template):
    calls, _ = recorder
    with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
        vertex_jobs.create_schedule(TARGET, template, PARAMS, "TZ=Europe/Berlin 0 3 * * 1", display_name="weekly")
    (name, request), = calls
    schedule = request["schedule"]
    assert name == "create_schedule" and request["parent"] == "projects/proj/locations/europe-west4"
    assert schedule.cron == "TZ=Europe/Berlin 0 3 * * 1" and schedule.display_name == "weekly"
    assert schedule.max_concurrent_run_count == 1
    job = schedule.create_pipeline_job_request.pipeline_job
    assert job.service_account == "runner@proj.iam.gserviceaccount.com"
    assert job.runtime_config.gcs_output_directory == "gs://bucket/root"
    assert dict(job.runtime_config.parameter_values)["annotations"] == "gs://bucket/coco.json"


def test_schedule_list_and_changes_ask_for_the_right_resources(recorder):
    calls, _ = recorder
    with pytest.raises(gexc.ServiceUnavailable):
        vertex_jobs.list_schedules(TARGET)
    for action in ("pause", "resume", "delete"):
        with pytest.raises(gexc.ServiceUnavailable):
            vertex_jobs.change_schedule(TARGET, "1234", action)
    (list_name, list_request), *gets = calls
    assert list_name == "list_schedules"
    assert list_request["request"]["parent"] == "projects/proj/locations/europe-west4"
    assert list_request["request"]["filter"] == vertex_jobs.SCHEDULES_FILTER  # tests/test_vertex_cloud.py checks it
    assert [g[0] for g in gets] == ["get_schedule"] * 3
    assert all(g[1]["name"] == "projects/proj/locations/europe-west4/schedules/1234" for g in gets)


@pytest.mark.parametrize("cron", ["0 3 * * *", "TZ=America/New_York 30 2 * * 1-5"])
def test_valid_crons(cron):
    assert vertex_jobs.validate_cron(cron) == cron


@pytest.mark.parametrize("cron", ["", "daily", "0 3 * *", "TZ= 0 3 * * *"])
def test_invalid_crons(cron):
    with pytest.raises(ValueError, match="five fields"):
        vertex_jobs.validate_cron(cron)


def test_upload_request_has_file_tags_and_url(template, monkeypatch):
    sent = {}

    def fake_post(url, data=None, headers=None, files=None, auth=None):
        sent.update(url=url, data=data, content=files["content"].read())
        response = requests.Response()
        response.status_code = 503
        response.url = url
        return response

    monkeypatch.setattr("kfp.registry.registry_client.requests.post", fake_post)
    with pytest.raises(requests.HTTPError):
        upload_template("https://europe-west4-kfp.pkg.dev/proj/templates", template, ["v3", "latest"],
                        auth=AnonymousCredentials())
    assert sent["url"] == "https://europe-west4-kfp.pkg.dev/proj/templates"
    assert sent["data"] == {"tags": "v3,latest"}
    assert sent["content"] == open(template, "rb").read()


def test_upload_rejects_a_non_registry_url(template):
    with pytest.raises(ValueError, match="REGION-kfp.pkg.dev"):
        upload_template("https://example.com/x", template, ["v1"], auth=AnonymousCredentials())


@pytest.mark.parametrize("argv", [
    ["submit", "--project", "p", "--region", "r", "--pipeline-root", "gs://bucket/r"],
    ["schedule", "create", "--project", "p", "--region", "r", "--pipeline-root", "gs://bucket/r", "--cron", "0 3 * * *"],
    ["schedule", "list", "--project", "p", "--region", "r"],
    ["upload", "--repo", "https://us-kfp.pkg.dev/p/r", "--tag", "v1"],
])
def test_without_credentials_one_clear_line(argv, template, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("HOME", str(tmp_path))
    code = main([*argv, "--template", template] if argv[0] != "schedule" or argv[1] == "create" else argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("detpipe: error:")
    assert "credentials" in err[0]


@pytest.mark.parametrize("command", [["submit"], ["schedule"], ["schedule", "create"], ["upload"]])
def test_vertex_help_explains_every_option(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


DATAFLOW_SAMPLES = {"dataflow_project": "my-project", "dataflow_temp_location": "gs://bucket/tmp",
                    "dataflow_service_account": "dataflow@my-project.iam.gserviceaccount.com",
                    "dataflow_subnetwork": "regions/europe-west4/subnetworks/workers", "beam_options": "--disk_size_gb=50"}


def _sample(param) -> str:
    """A valid command-line value of each declared type."""
    if param.choices:
        return param.choices[-1]
    if param.type is bool:
        return "true"
    if param.name == "warm_start":  # auto, never or a version
        return "v3"
    if param.name in ("batch_size", "image_size", "tune_trials", "patience"):  # STRING parameters that also take "auto"
        return "64"
    if param.name == "tile":  # auto, none or SIZE[:OVERLAP]
        return "640:64"
    if param.name == "export_formats":  # comma-separated formats
        return "saved_model,onnx"
    if param.name == "time_budget":  # auto or a duration
        return "20m"
    if param.name in DATAFLOW_SAMPLES:  # checked together with data_runner (DataflowRunner here)
        return DATAFLOW_SAMPLES[param.name]
    return {int: "3", float: "0.5"}.get(param.type, "gs://bucket/x")


def test_submit_params_carry_the_types_the_template_declares(recorder, template):
    """`--param batch_size=16` must reach Vertex AI as the STRING the template declares, not
    the number 16.0; every parameter of the compiled template is checked."""
    import yaml

    from pipeline.params import PARAMS, typed_values

    declared = yaml.safe_load(open(template))["root"]["inputDefinitions"]["parameters"]
    assert set(declared) == {p.name for p in PARAMS}
    sent = typed_values([f"{p.name}={_sample(p)}" for p in PARAMS])
    calls, _ = recorder
    with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
        vertex_jobs.submit(TARGET, template, sent)
    values = dict(calls[0][1]["pipeline_job"].runtime_config.parameter_values)
    for name, spec in declared.items():
        kind, value = spec["parameterType"], values[name]
        if kind == "STRING":
            assert isinstance(value, str), (name, value)
        elif kind == "BOOLEAN":
            assert value is True, (name, value)
        elif kind == "NUMBER_INTEGER":
            assert isinstance(value, (int, float)) and value == int(value) and isinstance(sent[name], int), name
        else:
            assert kind == "NUMBER_DOUBLE" and isinstance(value, float), (name, kind)
    assert values["batch_size"] == "64" and values["image_size"] == "64"


@pytest.mark.parametrize("pair,words", [
    ("imgae_size=512", "no such pipeline parameter (did you mean image_size?)"),
    ("epochs=3.5", "--param epochs:"),
    ("batch_size=sixteen", "--param batch_size:"),
    ("allow_anomalies=maybe", "true or false"),
    ("data_format=xml", "must be one of voc, coco, csv"),
])
def test_a_wrong_param_is_one_line_and_exit_2(pair, words, capsys):
    code = main(["submit", "--project", "p", "--region", "europe-west4", "--pipeline-root", "gs://bucket/root",
                 "--param", pair])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and words in err[0], err
