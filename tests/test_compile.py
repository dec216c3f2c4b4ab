"""The compiled YAML is byte-identical across processes, working directories and hash seeds."""

import os
import subprocess
import sys

import yaml

from pipeline.compile import compile_pipeline


def _compile_in_subprocess(cwd, seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "compile", "--output", "p.yaml"],
                         cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_same_sha_from_two_directories_and_hash_seeds(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    sha_a, sha_b = _compile_in_subprocess(a, "1"), _compile_in_subprocess(b, "4242")
    assert len(sha_a) == 64 and sha_a == sha_b
    assert (a / "p.yaml").read_bytes() == (b / "p.yaml").read_bytes()


def test_yaml_is_a_linear_dag_with_the_image_and_no_probe_cache(tmp_path):
    compile_pipeline(tmp_path / "p.yaml", image="europe-docker.pkg.dev/p/r/detpipe:abc")
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert {e["container"]["image"] for e in executors.values()} == {"europe-docker.pkg.dev/p/r/detpipe:abc"}
    # No run-time pip installs: the image holds everything.
    assert not any("pip install" in " ".join(e["container"]["command"]) for e in executors.values())
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"validate-and-convert", "probe", "train", "evaluate"}
    assert tasks["probe"]["cachingOptions"] == {}
    assert tasks["train"]["dependentTasks"] == ["probe", "validate-and-convert"]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["batch_size"]["defaultValue"] == "auto" and "images" in params
