"""One image, many uses: the project image (infra/Dockerfile) starts Dataflow's Beam SDK workers
through its entrypoint, Beam's boot program of the exact apache-beam version in uv.lock and of
the image's own Python; every other use names its own command, so the entrypoint never runs in
its place. Read from the Dockerfile, uv.lock, the compiled YAML and the recorded Vertex AI
requests; a disagreement between any two fails here."""

import re
import tomllib
from pathlib import Path
from unittest import mock

import google.api_core.exceptions as gexc
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.job_service import JobServiceClient
from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]
IMAGE = "europe-docker.pkg.dev/p/r/detpipe:v9"
BOOT = "/opt/apache/beam/boot"
REFUSED = "recorded by the test, not sent"


def _stages(dockerfile: str) -> list[dict]:
    """Each stage of a Dockerfile: its FROM line's image and alias, and its instructions
    (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            image, _, alias = rest.partition(" AS ")
            stages.append({"image": image.strip(), "alias": alias.strip(), "lines": []})
        else:
            stages[-1]["lines"].append((word.upper(), rest.strip()))
    return stages


def _locked(name: str) -> str:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    (version,) = {p["version"] for p in lock["package"] if p["name"] == name}
    return version


def test_the_image_starts_beam_workers_of_the_locked_beam_and_its_own_python():
    stages = _stages((REPO / "infra" / "Dockerfile").read_text())
    final = stages[-1]
    python = re.fullmatch(r"python:(\d+\.\d+)-[\w.-]+", final["image"])
    assert python, final["image"]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python.group(1) in requires
    beam = [s for s in stages if s["image"].startswith("apache/beam_python")]
    assert len(beam) == 1, "one stage from a Beam Python SDK image, the boot program's source"
    assert beam[0]["image"] == f"apache/beam_python{python.group(1)}_sdk:{_locked('apache-beam')}"
    assert ("COPY", f"--from={beam[0]['alias']} /opt/apache/beam /opt/apache/beam") in final["lines"]
    entrypoints = [rest for word, rest in final["lines"] if word == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == f'["{BOOT}"]'  # exec form: signals reach the workers
    env = " ".join(rest for word, rest in final["lines"] if word == "ENV")
    assert "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1" in env  # the boot program runs the image's venv


def _compiled(tmp_path, *options) -> dict:
    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.yaml"
    assert main(["compile", "--output", str(out), "--image", IMAGE, *options]) == 0
    return yaml.safe_load(out.read_text())


@pytest.mark.parametrize("options", [(), ("--train-runner", "customjob", "--train-replicas", "2"),
                                     ("--pipeline", "batch-predict")], ids=["task", "customjob", "batch-predict"])
def test_every_step_on_the_image_names_its_command_and_dataflow_gets_the_image(tmp_path, options):
    spec = _compiled(tmp_path, *options)
    on_image = 0
    for name, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        if container["image"] == IMAGE:
            on_image += 1
            assert container.get("command"), f"{name} would run the image's entrypoint, Beam's boot program"
    pools = [pool for component in spec["components"].values()
             for pool in component.get("inputDefinitions", {}).get("parameters", {})
             .get("worker_pool_specs", {}).get("defaultValue", [])]
    for pool in pools:  # a custom job made from a step runs the step's command on the image
        assert pool["container_spec"]["image_uri"] == IMAGE and pool["container_spec"]["command"]
    assert on_image + len(pools) >= (1 if "batch-predict" in options else 8)
    # The Beam steps hand Dataflow this same image for its workers, whose entrypoint is the boot program.
    images = [task["inputs"]["parameters"]["sdk_container_image"]["runtimeValue"]["constant"]
              for task in spec["root"]["dag"]["tasks"].values()
              if "sdk_container_image" in task.get("inputs", {}).get("parameters", {})]
    assert images == [IMAGE]


def test_the_tuning_trials_and_the_served_model_name_their_command():
    from google.cloud.aiplatform.compat.types import custom_job as gca_custom_job

    from components.model_registry.vertex_model import ModelVersion, upload_version
    from components.tune.vertex_job import TrialMachine, tuning_job

    sent = []

    def refuse(self, *args, **kwargs):
        sent.append(kwargs.get("request") or kwargs)
        raise gexc.ServiceUnavailable(REFUSED)

    where = {"project": "proj", "credentials": AnonymousCredentials()}
    job = tuning_job("/gcs/b/plan.json", "/gcs/b/trials", TrialMachine(IMAGE, "n1-standard-8", "NVIDIA_L4", 1),
                     trials=2, parallel=1, region="europe-west4", **where)
    version = ModelVersion(display_name="d", artifact_uri="gs://b/v1/saved_model", serving_image=IMAGE, blessed=True,
                           run_id="r", data_fingerprint="ab" * 32, map=0.3, registry_version="v1", description="")
    with mock.patch.object(JobServiceClient, "create_hyperparameter_tuning_job", refuse), \
            mock.patch.object(ModelServiceClient, "upload_model", refuse):
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            job.run(sync=True, scheduling_strategy=gca_custom_job.Scheduling.Strategy.STANDARD)
        with pytest.raises(gexc.ServiceUnavailable, match=REFUSED):
            upload_version(version, parent_model=None, location="europe-west4", **where)
    trial, upload = sent
    (pool,) = trial["hyperparameter_tuning_job"].trial_job_spec.worker_pool_specs
    assert pool.container_spec.image_uri == IMAGE and list(pool.container_spec.command)[:1] == ["detpipe"]
    serving = upload.model.container_spec
    assert serving.image_uri == IMAGE and list(serving.command) == ["detpipe"] and list(serving.args) == ["serve"]
