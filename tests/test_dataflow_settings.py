"""The Dataflow settings (beam/dataflow.py), declared once: `data build` and `predict --images`
take them as options, the data step and the batch-predict pipeline as parameters; each is
checked before a job or a run is submitted (one line a problem) and reaches Beam as its own
option. Nothing here reaches Google Cloud: the job's runner and options are recorded where the
job would start it, and refused."""

from dataclasses import fields
from unittest import mock

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, WorkerOptions

from beam.dataflow import DataflowSettings
from pipeline.cli import main
from pipeline.params import BY_NAME, DATAFLOW, typed_values

RACCOON = "tests/data/raccoon"
GOOD = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "europe-west4",
        "--temp-location", "gs://bucket/tmp", "--machine-type", "n2-standard-8", "--max-workers", "7",
        "--service-account", "df@my-project.iam.gserviceaccount.com", "--network", "vpc",
        "--subnetwork", "regions/europe-west4/subnetworks/workers", "--worker-image", "eu-docker.pkg.dev/p/r/detpipe:v9"]


class Recorded(RuntimeError):
    pass


def _recording(module: str):
    """The job's `runner_and_options` recorded and refused: what the job would hand Beam."""
    seen = []

    def record(runner, beam_args, *args, **kwargs):
        seen.append((runner, PipelineOptions(list(beam_args))))
        raise Recorded("recorded by the test, not sent")

    return seen, mock.patch(f"{module}.runner_and_options", record)


def _expect_the_settings(options: PipelineOptions):
    cloud, workers = options.view_as(GoogleCloudOptions), options.view_as(WorkerOptions)
    assert (cloud.project, cloud.region, cloud.temp_location) == ("my-project", "europe-west4", "gs://bucket/tmp")
    assert cloud.service_account_email == "df@my-project.iam.gserviceaccount.com"
    assert (workers.machine_type, workers.max_num_workers, workers.network) == ("n2-standard-8", 7, "vpc")
    assert workers.subnetwork == "regions/europe-west4/subnetworks/workers"
    assert workers.sdk_container_image == "eu-docker.pkg.dev/p/r/detpipe:v9"
    assert options.get_all_options()["disk_size_gb"] == 50  # a Beam option passed through as Beam's


def _model_folder(tmp_path):
    """A folder `predict --model` takes: a job is refused before it would read the model."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"")
    return model


def test_data_build_and_predict_hand_beam_the_typed_settings(tmp_path, capsys):
    seen, patch = _recording("beam.convert_job")
    with patch:
        assert main(["data", "build", "--format", "voc", "--images", f"{RACCOON}/images", "--annotations",
              f"{RACCOON}/annotations", "--output", str(tmp_path / "shards"), *GOOD, "--disk_size_gb=50"]) == 1
    ((runner, options),) = seen
    assert runner == "DataflowRunner"
    _expect_the_settings(options)
    assert "recorded by the test" in capsys.readouterr().err

    seen = []  # the batch job's options, as `predict` hands them to it (it would check the model first)

    def record(options):
        seen.append((options.runner, PipelineOptions(list(options.beam_args))))
        raise Recorded("recorded by the test, not sent")

    with mock.patch("components.serve.batch_job.predict_images", record):
        assert main(["predict", "--model", str(_model_folder(tmp_path)), "--images", f"{RACCOON}/images",
                     "--output", str(tmp_path / "pred"), *GOOD, "--disk_size_gb=50"]) == 1
    ((runner, options),) = seen
    assert runner == "DataflowRunner"
    _expect_the_settings(options)


@pytest.mark.parametrize("command", ["data", "predict"])
def test_bad_settings_are_one_line_each_before_anything_runs(tmp_path, capsys, command):
    model = _model_folder(tmp_path)
    seen, patch = _recording("beam.convert_job" if command == "data" else "components.serve.batch_job")
    bad = ["--runner", "DataflowRunner", "--temp-location", "/tmp/x", "--service-account", "bob",
           "--subnetwork", "workers", "--project", "My_Project", "--temp_location=gs://b/t"]
    argv = (["data", "build", "--format", "voc", "--images", f"{RACCOON}/images", "--annotations",
             f"{RACCOON}/annotations", "--output", str(tmp_path / "out")] if command == "data" else
            ["predict", "--model", str(model), "--images", f"{RACCOON}/images", "--output", str(tmp_path / "out")])
    with patch:
        code = main(argv + bad)
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and not seen and not (tmp_path / "out").exists()
    assert err == [
        "detpipe: error: --region: required on DataflowRunner",
        "detpipe: error: --worker-image: required on DataflowRunner",
        "detpipe: error: --temp-location: must be a gs:// folder, got '/tmp/x'",
        "detpipe: error: --service-account: must be an email NAME@PROJECT.iam.gserviceaccount.com, got 'bob'",
        "detpipe: error: --subnetwork: must be regions/REGION/subnetworks/NAME or a full URL, got 'workers'",
        "detpipe: error: --project: is not a Google Cloud project ID: 'My_Project'",
        "detpipe: error: --temp_location: give it as --temp-location, which is checked before the job is "
        "submitted"]
    # A setting given to the local runner is given for nothing: said, not ignored.
    assert main(argv[:-2] + [argv[-2], str(tmp_path / "out2"), "--max-workers", "3"]) == 2
    assert "--max-workers: applies to DataflowRunner only (the runner is DirectRunner)" in capsys.readouterr().err


def test_the_pipeline_parameters_are_the_settings_and_submit_checks_them():
    """One parameter a setting but the image (the step's own), typed as declared; `submit`
    refuses a run the data step would refuse, before it is sent."""
    assert set(DATAFLOW) == {f"dataflow_{f.name}" for f in fields(DataflowSettings) if f.name != "image"}
    assert DATAFLOW["dataflow_max_workers"] is int and BY_NAME["data_runner"].choices == ("DirectRunner", "DataflowRunner")
    from pipeline.cli_types import UsageError

    with pytest.raises(UsageError) as err:
        typed_values(["data_runner=DataflowRunner", "dataflow_project=my-project", "beam_options=--region=x"])
    assert str(err.value).splitlines() == [
        "--param dataflow_region: required on DataflowRunner",
        "--param dataflow_temp_location: required on DataflowRunner",
        "--param beam_options --region: give it as the parameter dataflow_region, which is checked"]
    with pytest.raises(UsageError, match="dataflow_max_workers: applies to DataflowRunner only"):
        typed_values(["dataflow_max_workers=4"])
    assert typed_values(["data_runner=DataflowRunner", "dataflow_project=my-project", "dataflow_region=us-east1",
                         "dataflow_temp_location=gs://b/t"])["dataflow_region"] == "us-east1"


def test_the_data_step_adds_its_own_image_and_refuses_what_submit_refuses():
    from beam.runner import step_beam_args

    given = {name: BY_NAME[name].default for name in DATAFLOW}
    assert step_beam_args("--x=1", "DirectRunner", "img:1", given) == ("--x=1",)  # the image only on Dataflow
    on_dataflow = {**given, "dataflow_project": "my-project", "dataflow_region": "r", "dataflow_temp_location": "gs://b"}
    assert "--sdk_container_image=img:1" in step_beam_args("", "DataflowRunner", "img:1", on_dataflow)
    with pytest.raises(ValueError) as err:
        step_beam_args("--sdk_container_image=other", "DataflowRunner", "img:1", {**on_dataflow, "dataflow_max_workers": -1})
    assert str(err.value).splitlines() == [
        "dataflow_max_workers: must be 0 or more, got -1",
        "beam_options --sdk_container_image: give it as the pipeline's --image at compile time: the workers run "
        "the step's own image"]
