"""What a run shows in the Vertex AI console, read from the compiled YAML and the requests the
real aiplatform client builds (a recording fake at the transport keeps each and refuses it:
nothing pretends a call succeeded): the lineage artifacts (GCPC's google.VertexModel and
google.VertexEndpoint), the confusion matrix the console draws, runs joining an experiment,
and an email when a run ends."""

from unittest import mock

import google.api_core.exceptions as gexc
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient
from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient
from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient

from pipeline.cli import main

REFUSED = "recorded by the test, not sent"
STEPS = {"fingerprint-source", "validate-and-convert", "probe", "tune-hyperparameters", "train", "evaluate", "review",
         "export", "register", "report"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("yaml")
    assert main(["compile", "--output", str(folder / "plain.yaml")]) == 0
    assert main(["compile", "--output", str(folder / "notify.yaml"), "--notify", "ml-team@example.com",
                 "--notify", "oncall@example.org"]) == 0
    return {name: yaml.safe_load((folder / f"{name}.yaml").read_text()) for name in ("plain", "notify")}


def _outputs(spec, component: str) -> dict[str, str]:
    artifacts = spec["components"][component]["outputDefinitions"]["artifacts"]
    return {name: a["artifactType"]["schemaTitle"] for name, a in artifacts.items()}


def test_register_outputs_the_vertex_resources_and_evaluate_a_confusion_matrix(compiled):
    spec = compiled["plain"]
    assert _outputs(spec, "comp-register") == {"uploaded_model": "google.VertexModel",
                                              "serving_endpoint": "google.VertexEndpoint"}
    evaluate = _outputs(spec, "comp-evaluate")
    assert evaluate["metrics"] == "system.Metrics" and evaluate["confusion_matrix"] == "system.ClassificationMetrics"
    register = spec["root"]["dag"]["tasks"]["register"]["inputs"]["parameters"]
    assert register["pipeline_job"]["runtimeValue"]["constant"] == "{{$.pipeline_job_resource_name}}"
    assert register["experiment"] == {"componentInputParameter": "experiment"}
    assert spec["root"]["inputDefinitions"]["parameters"]["experiment"]["defaultValue"] == ""
    # Without --notify the DAG stays linear: every step at the top, no exit handler.
    assert set(spec["root"]["dag"]["tasks"]) == STEPS


def test_notify_wraps_the_steps_in_an_exit_handler_that_emails(compiled):
    spec = compiled["notify"]
    tasks = spec["root"]["dag"]["tasks"]
    (handler,) = [name for name in tasks if name.startswith("exit-handler")]
    (email,) = [name for name in tasks if "notification-email" in name]
    assert tasks[email]["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}  # failed runs too
    assert tasks[email]["dependentTasks"] == [handler]
    recipients = tasks[email]["inputs"]["parameters"]["recipients"]["runtimeValue"]["constant"]
    assert recipients == ["ml-team@example.com", "oncall@example.org"]
    assert set(spec["components"][tasks[handler]["componentRef"]["name"]]["dag"]["tasks"]) == STEPS


@pytest.mark.parametrize("argv,said", [(["--notify", "ops"], "--notify takes email addresses, got 'ops'"),
                                       (["--notify", "a@x.io"] * 4, "at most 3 addresses")])
def test_bad_notify_is_one_line(tmp_path, capsys, argv, said):
    assert main(["compile", "--output", str(tmp_path / "x.yaml"), *argv]) == 2
    assert said in capsys.readouterr().err


@pytest.fixture
def recorded():
    calls = []

    def refuse(name):
        def fake(self, *args, **kwargs):
            calls.append((name, kwargs.get("request") or kwargs))
            raise gexc.FailedPrecondition(REFUSED)  # an error no client retries
        return fake

    def spy(real):  # the SDK's own method, its arguments recorded
        def called(self, *args, **kwargs):
            calls.append((real.__name__, kwargs))
            return real(self, *args, **kwargs)
        return called
        return fake

    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer

    patches = [mock.patch.object(MetadataServiceClient, "get_metadata_store", refuse("get_metadata_store")),
               mock.patch.object(aiplatform.PipelineJob, "submit", spy(aiplatform.PipelineJob.submit)),
               mock.patch.object(MetadataServiceClient, "add_context_children", refuse("add_context_children")),
               mock.patch.object(PipelineServiceClient, "create_pipeline_job", refuse("create_pipeline_job")),
               mock.patch.object(ScheduleServiceClient, "create_schedule", refuse("create_schedule")),
               mock.patch("google.auth.default", lambda *a, **k: (AnonymousCredentials(), "proj")),
               # aiplatform keeps the credentials it found: they go with this test
               mock.patch.object(initializer.global_config, "_credentials", None),
               mock.patch.object(initializer.global_config, "_project", None),
               mock.patch("google.cloud.aiplatform.utils.gcs_utils."
                          "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **kw: None)]
    for p in patches:
        p.start()
    yield calls
    for p in patches:
        p.stop()


WHERE = ["--project", "proj", "--region", "europe-west4", "--pipeline-root", "gs://bucket/root"]


def test_submit_makes_the_run_one_of_an_experiment_named_for_the_model(recorded, compiled, tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(yaml.safe_dump(compiled["plain"]))
    assert main(["submit", *WHERE, "--template", str(template), "--param", "model_name=Shapes_v2"]) == 1
    # The SDK is given the experiment; it looks it up (in the project's metadata store) before it
    # creates the run, which it then joins.
    (_, given), (name, request) = recorded
    assert given["experiment"] == "shapes-v2" and name == "get_metadata_store"
    assert request["name"] == "projects/proj/locations/europe-west4/metadataStores/default"
    assert "Experiment shapes-v2 could not be found or created" in capsys.readouterr().err
    recorded.clear()
    assert main(["submit", *WHERE, "--template", str(template), "--no-experiment"]) == 1
    assert [name for name, _ in recorded] == ["submit", "create_pipeline_job"] and recorded[0][1]["experiment"] is None
    assert main(["submit", *WHERE, "--template", str(template), "--experiment", "Bad Name"]) == 2
    assert "--experiment: experiment names are lower-case" in capsys.readouterr().err


def test_each_scheduled_run_joins_the_experiment_from_its_register_step(recorded, compiled, tmp_path):
    from components.model_registry.vertex_experiment import join_experiment

    template = tmp_path / "t.yaml"
    template.write_text(yaml.safe_dump(compiled["plain"]))
    assert main(["schedule", "create", *WHERE, "--template", str(template), "--cron", "0 3 * * 1",
                 "--experiment", "nightly-shapes"]) == 1
    ((name, request),) = recorded
    job = request["schedule"].create_pipeline_job_request.pipeline_job
    assert dict(job.runtime_config.parameter_values)["experiment"] == "nightly-shapes"
    recorded.clear()
    # What the register step does with it on Vertex AI: the SDK's own first call, for this run's place.
    with pytest.raises(gexc.FailedPrecondition, match=REFUSED):
        join_experiment("nightly-shapes", "projects/proj/locations/europe-west4/pipelineJobs/detpipe-20261128",
                        credentials=AnonymousCredentials())
    assert recorded[0][1]["name"] == "projects/proj/locations/europe-west4/metadataStores/default"
    with pytest.raises(ValueError, match="not a Vertex AI pipeline job"):
        join_experiment("nightly-shapes", "detpipe-20261128")


def test_a_train_task_uploads_its_curves_to_the_tensorboard_named_in_its_environment(tmp_path):
    """Task mode: no custom job, so no AIP_TENSORBOARD_LOG_DIR; the DAG names the TensorBoard in
    the train task's environment and the step uploads its event files with aiplatform's uploader
    (its first request recorded and refused)."""
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform_v1.services.tensorboard_service import TensorboardServiceClient

    from components.train.tensorboard_upload import TENSORBOARD_ENV, upload_curves

    board = "projects/proj/locations/europe-west4/tensorboards/42"
    assert main(["compile", "--output", str(tmp_path / "t.yaml"), "--tensorboard", board]) == 0
    spec = yaml.safe_load((tmp_path / "t.yaml").read_text())
    train = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert {"name": TENSORBOARD_ENV, "value": board} in train["env"]
    assert "env" not in spec["deploymentSpec"]["executors"]["exec-evaluate"]["container"]
    seen = []

    def refuse(self, *args, **kwargs):
        seen.append(kwargs)
        raise gexc.FailedPrecondition(REFUSED)

    (tmp_path / "logs" / "train").mkdir(parents=True)
    with mock.patch.object(TensorboardServiceClient, "get_tensorboard", refuse), \
            mock.patch("google.auth.default", lambda *a, **k: (AnonymousCredentials(), "proj")), \
            mock.patch.object(initializer.global_config, "_credentials", None), \
            mock.patch.object(initializer.global_config, "_project", None):
        refused = upload_curves(board, str(tmp_path / "logs"), "shapes")  # said, not raised: the model is kept
    assert seen == [{"name": board}]
    assert refused == f"training curves not uploaded to {board}: FailedPrecondition: 400 {REFUSED}"
    with pytest.raises(ValueError, match="not a Vertex AI TensorBoard"):
        upload_curves("42", str(tmp_path / "logs"), "shapes")
