"""The search on Vertex AI (components/tune/vertex_job.py), at request level: the real Vertex AI
client builds the hyperparameter tuning job's request; a recording fake at the GAPIC method keeps
it and refuses it (nothing pretends a job ran). And the trial command Vertex runs, for real on
the demo shards, reporting its score where the service reads it."""

import json
import math
from unittest import mock

import google.api_core.exceptions as gexc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

from components.tune.hparams_file import SEARCH_SPACE
from components.tune.vertex_job import METRIC_ID, TrialMachine, choose_backend, tuning_job

REFUSED = "recorded by the test, not sent"


def test_the_tuning_job_request_runs_each_trial_as_a_tune_trial_on_the_training_machine():
    calls = []

    def refuse(self, *args, **kwargs):
        calls.append(kwargs)
        raise gexc.ServiceUnavailable(REFUSED)

    machine = TrialMachine("europe-docker.pkg.dev/p/detpipe/detpipe:v1", "a2-highgpu-1g", "NVIDIA_TESLA_A100", 1,
                           spot=True)
    job = tuning_job("/gcs/b/run/tune/search_plan.json", "/gcs/b/run/tune/vertex_trials", machine, trials=7,
                     parallel=3, region="europe-west4", project="proj", credentials=AnonymousCredentials())
    from google.cloud.aiplatform.compat.types import custom_job as gca_custom_job

    with mock.patch.object(JobServiceClient, "create_hyperparameter_tuning_job", refuse):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            job.run(sync=True, scheduling_strategy=gca_custom_job.Scheduling.Strategy.SPOT)
    (call,) = calls
    assert call["parent"] == "projects/proj/locations/europe-west4"
    sent = call["hyperparameter_tuning_job"]
    assert (sent.max_trial_count, sent.parallel_trial_count, sent.max_failed_trial_count) == (7, 3, 3)
    (metric,) = sent.study_spec.metrics
    assert metric.metric_id == METRIC_ID and metric.goal.name == "MAXIMIZE"
    specs = {p.parameter_id: p for p in sent.study_spec.parameters}
    assert set(specs) == set(SEARCH_SPACE)
    for name, (low, high, log) in SEARCH_SPACE.items():
        spec = specs[name]
        assert (spec.double_value_spec.min_value, spec.double_value_spec.max_value) == (low, high)
        assert spec.scale_type.name == ("UNIT_LOG_SCALE" if log else "UNIT_LINEAR_SCALE")
    trial = sent.trial_job_spec
    (pool,) = trial.worker_pool_specs
    assert pool.replica_count == 1 and pool.machine_spec.machine_type == "a2-highgpu-1g"
    assert pool.machine_spec.accelerator_type.name == "NVIDIA_TESLA_A100" and pool.machine_spec.accelerator_count == 1
    assert pool.container_spec.image_uri == machine.image
    assert list(pool.container_spec.command) == ["detpipe", "tune-trial"]
    assert list(pool.container_spec.args) == ["--plan", "/gcs/b/run/tune/search_plan.json", "--output",
                                              "/gcs/b/run/tune/vertex_trials"]
    assert trial.scheduling.strategy.name == "SPOT"
    assert trial.base_output_directory.output_uri_prefix == "gs://b/run/tune/vertex_trials"


def test_auto_runs_trials_on_vertex_only_from_a_step_on_vertex():
    assert choose_backend("auto", "/gcs/bucket/root/run/tune") == "vertex"
    assert choose_backend("auto", "/tmp/local_outputs/run/tune") == "local"
    assert choose_backend("vertex", "/tmp/x") == "vertex"
    with pytest.raises(ValueError, match="tune_backend must be one of"):
        choose_backend("gpu", "/tmp/x")


def test_submit_compiles_a_pipeline_whose_tune_step_gets_the_trial_machine(tmp_path):
    """`detpipe compile` (what `submit --param tune_trials=8` sends): the tune step takes the
    trials, the backend and the machine of the trials, the training's."""
    import yaml

    from pipeline.compile import compile_pipeline
    from pipeline.dag import StepResources

    compile_pipeline(tmp_path / "p.yaml", resources=StepResources(spot=True, train_runner="customjob",
                                                                   train_machine_type="g2-standard-8",
                                                                   accelerator_type="NVIDIA_L4"),
                     image="europe-docker.pkg.dev/p/detpipe/detpipe:v1")
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    inputs = spec["root"]["dag"]["tasks"]["tune-hyperparameters"]["inputs"]["parameters"]
    assert inputs["tune_trials"]["componentInputParameter"] == "tune_trials"
    assert inputs["tune_backend"]["componentInputParameter"] == "tune_backend"
    machine = json.loads(inputs["trial_machine"]["runtimeValue"]["constant"])
    assert machine == {"image": "europe-docker.pkg.dev/p/detpipe/detpipe:v1", "machine_type": "g2-standard-8",
                       "accelerator_type": "NVIDIA_L4", "accelerator_count": 1, "spot": True}
    assert spec["root"]["inputDefinitions"]["parameters"]["tune_trials"]["defaultValue"] == "auto"


@pytest.mark.slow
def test_a_vertex_trial_trains_the_plan_and_reports_each_rung_to_the_service(demo_shards, tmp_path, monkeypatch):
    """`detpipe tune-trial` as Vertex runs it (the values as --NAME=VALUE, its trial id in the
    environment): it trains the plan's regime on the tuning split and writes every rung's score
    where cloudml-hypertune tells the service."""
    from components.detector.holdout import carve_tuning_split
    from components.tune.trials import PLAN_FILE, trial_regime
    from components.train.config import TrainConfig
    from pipeline.cli import main

    split = carve_tuning_split(str(demo_shards), str(tmp_path / "split"), 0.25, seed=0)
    regime = trial_regime(TrainConfig(str(demo_shards), "", epochs=2, batch_size=4, image_size=64), split, 1)
    (tmp_path / PLAN_FILE).write_text(json.dumps({"regime": regime.to_dict()}))
    metrics = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metrics))
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "4")
    assert main(["tune-trial", "--plan", str(tmp_path / PLAN_FILE), "--output", str(tmp_path / "trials"),
                 "--base_lr_per_64=0.01", "--weight_decay=0.0002"]) == 0
    reported = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [int(r["global_step"]) for r in reported][-1] == regime.stops[-1]  # the last rung, the final measurement
    assert all(r["trial"] == "4" and math.isfinite(float(r[METRIC_ID])) for r in reported)
    train = json.loads((tmp_path / "trials" / "trial-4" / "model" / "train_config.json").read_text())["train"]
    assert (train["base_lr_per_64"], train["weight_decay"]) == (0.01, 0.0002)
    assert train["data_dir"] == split.folder and train["batch_size"] == regime.batch_size
