"""infra/: the image installs exactly the lock, Cloud Build compiles with the tag it
pushes, and Terraform declares the resources the pipeline needs (parsed, not applied)."""

import os
import re
import subprocess
from pathlib import Path

import hcl2
import yaml

INFRA = Path(__file__).resolve().parents[1] / "infra"


def _unquote(value):
    if isinstance(value, str):
        return value.strip('"')
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items() if k != "__is_block__"}
    return value


def _terraform() -> dict:
    return _unquote(hcl2.load((INFRA / "terraform" / "main.tf").open()))


def _resources(tf: dict, kind: str) -> dict:
    return {name: body for block in tf["resource"] for k, named in block.items() if k == kind
            for name, body in named.items()}


def test_dockerfile_installs_from_the_lock_frozen():
    text = (INFRA / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"^COPY .*uv\.lock", text, re.M)
    syncs = re.findall(r"uv sync ([^\n]*)", text)
    assert syncs and all("--frozen" in s and "--extra gpu" in s for s in syncs)
    assert "pip install" not in text.replace('pip install --no-cache-dir "uv==${UV_VERSION}"', "")  # only the lock
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    assert "org.opencontainers.image.revision" in text and "GIT_REVISION" in text
    assert re.search(r"^HEALTHCHECK [^\n]*\\\n\s*CMD .*pipeline\.healthcheck", text, re.M)


def test_make_writes_bytecode_back_and_the_image_compiles_it_at_build():
    """Without .pyc files each process compiles what it imports on every start (TensorFlow's
    import 14.5 s instead of 5.3 s here): make's recipes clear PYTHONDONTWRITEBYTECODE so the
    first import writes them, and the image, read-only at run time, compiles at build."""
    shown = subprocess.run(["make", "-s", "--eval", 'shown-env: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"', "shown-env"],
                           cwd=INFRA.parent, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                           capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"
    assert re.search(r"^\s*UV_COMPILE_BYTECODE=1\b", (INFRA / "Dockerfile").read_text(), re.M)


def test_the_image_and_the_makefile_pin_the_same_uv():
    docker = re.search(r"^ARG UV_VERSION=(\S+)$", (INFRA / "Dockerfile").read_text(), re.M)
    make = re.search(r"^UV_VERSION := (\S+)$", (INFRA.parent / "Makefile").read_text(), re.M)
    assert docker and make and docker.group(1) == make.group(1) and re.fullmatch(r"\d+\.\d+\.\d+", make.group(1))


def test_cloudbuild_compiles_and_uploads_with_the_pushed_tag():
    build = yaml.safe_load((INFRA / "cloudbuild.yaml").read_text())
    steps = {s["id"]: s for s in build["steps"]}
    image = "${_IMAGE}"
    assert steps["build"]["args"][-2:] == [image, "."] and "infra/Dockerfile" in steps["build"]["args"]
    assert steps["push"]["args"] == ["push", image]
    compile_args = steps["compile"]["args"]
    assert compile_args[compile_args.index("compile") + 1:compile_args.index("compile") + 3] == ["--image", image]
    assert image in compile_args[: compile_args.index("detpipe")]  # runs the pushed image itself
    upload = steps["upload"]["args"]
    assert "upload" in upload and "latest" in upload and "${_TAG}" in upload
    assert build["images"] == [image]
    assert "${_TAG}" in build["substitutions"]["_IMAGE"]
    assert [s["id"] for s in build["steps"]] == ["build", "push", "compile", "upload", "move-schedules"]
    # The named schedules (none by default) move to the version just uploaded, by its tag.
    assert build["substitutions"]["_SCHEDULES"] == ""
    move = steps["move-schedules"]["args"][-1]
    assert "detpipe schedule update \"$$schedule\"" in move and image in move
    assert "--template https://${_REGION}-kfp.pkg.dev/${PROJECT_ID}/${_KFP_REPO}/detpipe/${_TAG}" in move


def test_terraform_declares_what_the_pipeline_needs():
    tf = _terraform()
    apis = set(tf["locals"][0]["apis"])
    assert {"aiplatform.googleapis.com", "artifactregistry.googleapis.com", "dataflow.googleapis.com"} <= apis
    buckets = _resources(tf, "google_storage_bucket")
    bucket = buckets["pipeline_root"]
    rule = bucket["lifecycle_rule"][0]
    assert rule["action"][0]["type"] == "Delete" and "retention" in rule["condition"][0]["age"]
    # Never public; old versions kept, but only for a bounded time; access logged.
    assert all(b["public_access_prevention"] == "enforced" and b["uniform_bucket_level_access"] is True
               for b in buckets.values())
    assert bucket["versioning"][0]["enabled"] is True
    noncurrent = bucket["lifecycle_rule"][1]["condition"][0]
    assert noncurrent["with_state"] == "ARCHIVED" and "noncurrent" in noncurrent["days_since_noncurrent_time"]
    assert "access_logs" in bucket["logging"][0]["log_bucket"]
    repos = _resources(tf, "google_artifact_registry_repository")
    assert sorted(r["format"] for r in repos.values()) == ["DOCKER", "KFP"]
    assert "google_service_account" in str(tf["resource"])


def test_runner_service_account_has_least_roles():
    roles = set(_terraform()["locals"][0]["runner_roles"])
    assert "roles/aiplatform.user" in roles
    assert not roles & {"roles/owner", "roles/editor", "roles/aiplatform.admin", "roles/storage.admin"}
    assert all(r.startswith("roles/") for r in roles)
    bucket_iam = _resources(_terraform(), "google_storage_bucket_iam_member")["runner_bucket"]
    assert bucket_iam["role"] == "roles/storage.objectAdmin"  # on the bucket, not the project
    project_roles = {body["role"] for name, body in _resources(_terraform(), "google_project_iam_member").items()
                     if name != "runner"} | roles
    assert project_roles == roles | {"roles/dataflow.developer"}  # launching the data step's Dataflow job


def test_terraform_variables_have_descriptions():
    variables = _unquote(hcl2.load((INFRA / "terraform" / "variables.tf").open()))["variable"]
    for block in variables:
        for name, body in block.items():
            assert body.get("description"), f"variable {name} has no description"
