"""The compiled YAML is byte-identical across processes, working directories and hash seeds."""

import os
import subprocess
import sys

import pytest
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


# Updated deliberately when the DAG or a component changes: `detpipe compile` prints it.
# Last change: augment_strength's help names how a long run's strength grows (augment_settings.run_strength).
GOLDEN_SHA256 = "b93f6bf95c291de5d157db8b9c6a79db6dad1533d90580fe791bcb4a94522f63"


def test_golden_compile(tmp_path):
    sha = compile_pipeline(tmp_path / "p.yaml")
    assert sha == GOLDEN_SHA256, (
        f"the compiled pipeline changed (sha256 {sha}); if that is intended, update GOLDEN_SHA256")


def _executor(spec, task):
    component = spec["root"]["dag"]["tasks"][task]["componentRef"]["name"]
    executor = spec["components"][component]["executorLabel"]
    return spec["deploymentSpec"]["executors"][executor]["container"]


def test_accelerators_on_probe_tune_and_train_only(tmp_path):
    from pipeline.dag import StepResources

    compile_pipeline(tmp_path / "p.yaml", resources=StepResources(accelerator_type="NVIDIA_L4", accelerator_count=2))
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    for task in ("probe", "tune-hyperparameters", "train"):
        accelerator = _executor(spec, task)["resources"]["accelerator"]
        assert accelerator["resourceType"] == "NVIDIA_L4" and accelerator["resourceCount"] == "2"
    assert "accelerator" not in _executor(spec, "validate-and-convert").get("resources", {})
    assert "accelerator" not in _executor(spec, "evaluate").get("resources", {})
    assert _executor(spec, "validate-and-convert")["resources"]["resourceCpuLimit"] == "4"
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["probe"]["cachingOptions"] == {}  # caching off
    assert tasks["validate-and-convert"]["cachingOptions"] == {"enableCache": True}
    assert tasks["train"]["cachingOptions"] == {"enableCache": True}
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert all(p.get("description") for p in params.values()), "every pipeline parameter has a description"
    compile_pipeline(tmp_path / "g.yaml", resources=StepResources(evaluate_on_gpu=True))
    gpu_eval = yaml.safe_load((tmp_path / "g.yaml").read_text())
    assert "accelerator" in _executor(gpu_eval, "evaluate")["resources"]


def test_yaml_is_a_linear_dag_with_the_image_and_no_probe_cache(tmp_path):
    compile_pipeline(tmp_path / "p.yaml", image="europe-docker.pkg.dev/p/r/detpipe:abc")
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert {e["container"]["image"] for e in executors.values()} == {"europe-docker.pkg.dev/p/r/detpipe:abc"}
    # No run-time pip installs: the image holds everything.
    assert not any("pip install" in " ".join(e["container"]["command"]) for e in executors.values())
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"fingerprint-source", "validate-and-convert", "probe", "tune-hyperparameters", "train",
                          "evaluate", "review", "export", "register", "report"}
    # The label review decides nothing; the val split re-scores converted files (export_formats).
    assert tasks["export"]["dependentTasks"] == ["evaluate", "train", "validate-and-convert"]
    assert tasks["review"]["dependentTasks"] == ["evaluate", "train", "validate-and-convert"]
    assert "review" in tasks["report"]["dependentTasks"]
    assert tasks["register"]["dependentTasks"] == ["evaluate", "export", "fingerprint-source", "train",
                                                   "validate-and-convert"]
    assert tasks["register"]["cachingOptions"] == {}
    assert tasks["probe"]["cachingOptions"] == {}
    assert tasks["tune-hyperparameters"]["dependentTasks"] == ["probe", "validate-and-convert"]
    assert tasks["train"]["dependentTasks"] == ["fingerprint-source", "probe", "tune-hyperparameters",
                                                "validate-and-convert"]  # the registry it resolved
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["batch_size"]["defaultValue"] == "auto" and "images" in params
    assert params["tune_trials"]["defaultValue"] == "auto"  # the search where it pays (components/tune/budget.py)
    assert params["warm_start"]["defaultValue"] == "auto"  # scheduled runs continue the champion


def test_source_fingerprint_is_uncached_and_in_the_data_steps_cache_key(tmp_path):
    """Vertex caches a step on its inputs: the data step takes the fingerprint of the files
    as an input, and the step that computes it never comes from the cache."""
    compile_pipeline(tmp_path / "p.yaml")
    tasks = yaml.safe_load((tmp_path / "p.yaml").read_text())["root"]["dag"]["tasks"]
    assert tasks["fingerprint-source"]["cachingOptions"] == {}
    assert "dependentTasks" not in tasks["fingerprint-source"]  # the first step
    inputs = tasks["validate-and-convert"]["inputs"]["parameters"]
    for name, output in (("source_fingerprint", "fingerprint"), ("registry", "registry")):
        assert inputs[name]["taskOutputParameter"] == {"outputParameterKey": output,
                                                       "producerTask": "fingerprint-source"}
    assert "champion" not in inputs  # a new champion alone does not convert and retrain unchanged data
    train = tasks["train"]["inputs"]["parameters"]  # nor retrain it: the train step looks the champion up itself
    assert "champion" not in train and train["warm_start"] == {"componentInputParameter": "warm_start"}
    assert tasks["register"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]["producerTask"] == "train"
    # A split file is data: the fingerprint lists it, and the data step uses it.
    for task in ("fingerprint-source", "validate-and-convert"):
        assert tasks[task]["inputs"]["parameters"]["split_file"] == {"componentInputParameter": "split_file"}
    evaluate = tasks["evaluate"]["inputs"]["parameters"]  # but the comparison is redone with it
    assert evaluate["champion"]["taskOutputParameter"]["producerTask"] == "fingerprint-source"
    assert tasks["fingerprint-source"]["inputs"]["parameters"]["pipeline_root"]["runtimeValue"]["constant"] \
        == "{{$.pipeline_root}}"
    assert tasks["register"]["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_name}}"


def test_one_declaration_of_the_parameters(tmp_path):
    """The DAG's parameters, their descriptions and `detpipe run`'s options come from PARAMS."""
    from pipeline.cli import build_parser
    from pipeline.params import PARAMS, REQUIRED

    compile_pipeline(tmp_path / "p.yaml")
    params = yaml.safe_load((tmp_path / "p.yaml").read_text())["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {p.name for p in PARAMS}
    for p in PARAMS:
        assert params[p.name]["description"].split()[0] == p.help.split()[0]
        if p.default is not REQUIRED:
            assert params[p.name]["defaultValue"] == p.default
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    options = {a.dest for a in run._actions}
    assert {p.name for p in PARAMS if p.local} <= options
    assert not ({p.name for p in PARAMS if not p.local} & options)


def test_train_as_a_spot_custom_job_with_three_replicas(tmp_path):
    """`--train-runner customjob`: tune and train become Vertex AI custom jobs (GCPC) on the
    project image: pool 0 the chief, pool 1 the other two replicas, spot, the timeout and the GPU;
    the tuner on the chief alone."""
    from pipeline.cli import main

    out = tmp_path / "c.yaml"
    assert main(["compile", "--output", str(out), "--image", "europe-docker.pkg.dev/p/r/detpipe:v2",
                 "--train-runner", "customjob", "--train-replicas", "3", "--spot", "--train-timeout", "24h",
                 "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "2"]) == 0
    spec = yaml.safe_load(out.read_text())
    tasks = spec["root"]["dag"]["tasks"]
    for task in ("train", "tune-hyperparameters"):
        inputs = spec["components"][tasks[task]["componentRef"]["name"]]["inputDefinitions"]["parameters"]
        pools = inputs["worker_pool_specs"]["defaultValue"]
        assert [p["replica_count"] for p in pools] == ([1, 2] if task == "train" else [1])
        for pool in pools:
            assert pool["container_spec"]["image_uri"] == "europe-docker.pkg.dev/p/r/detpipe:v2"
            assert pool["machine_spec"] == {"machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_L4",
                                            "accelerator_count": 2}
        assert inputs["strategy"]["defaultValue"] == "SPOT" and inputs["timeout"]["defaultValue"] == "86400s"
        launcher = _executor(spec, task)  # GCPC's launcher starts the job; the machines are in the job spec
        assert "google-cloud-pipeline-components" in launcher["image"] and "resources" not in launcher
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    # The default stays the golden, task-based YAML.
    assert compile_pipeline(tmp_path / "d.yaml") == GOLDEN_SHA256


def test_spot_without_a_custom_job_is_bad_usage(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["compile", "--output", str(tmp_path / "x.yaml"), "--spot"]) == 2
    assert "need --train-runner customjob" in capsys.readouterr().err


def test_a_tensorboard_job_gets_the_output_directory_vertex_needs_for_it(tmp_path, capsys):
    """`--tensorboard` with `--job-output-dir`: each custom job names both, so Vertex AI sets
    AIP_TENSORBOARD_LOG_DIR (where the trainer's curve writer goes, components/train/curve.py);
    without the folder, or with a local one, one line and exit 2."""
    from pipeline.cli import main

    board = "projects/p/locations/us-central1/tensorboards/42"
    out = tmp_path / "t.yaml"
    assert main(["compile", "--output", str(out), "--train-runner", "customjob", "--tensorboard", board,
                 "--job-output-dir", "gs://b/jobs"]) == 0
    spec = yaml.safe_load(out.read_text())
    tasks = spec["root"]["dag"]["tasks"]
    for task in ("train", "tune-hyperparameters"):
        inputs = spec["components"][tasks[task]["componentRef"]["name"]]["inputDefinitions"]["parameters"]
        assert inputs["tensorboard"]["defaultValue"] == board
        assert inputs["base_output_directory"]["defaultValue"] == "gs://b/jobs"
    for bad, said in ((["--tensorboard", board], "needs --job-output-dir"),
                      (["--tensorboard", board, "--job-output-dir", "/tmp/jobs"], "must be a gs:// folder")):
        assert main(["compile", "--output", str(tmp_path / "x.yaml"), "--train-runner", "customjob", *bad]) == 2
        assert said in capsys.readouterr().err
    assert main(["compile", "--output", str(tmp_path / "x.yaml"), "--tensorboard", board,
                 "--job-output-dir", "gs://b/jobs"]) == 2
    assert "need --train-runner customjob" in capsys.readouterr().err


def test_the_batch_predict_template_compiles_reproducibly(tmp_path):
    """`detpipe compile --pipeline batch-predict`: one uncached step that looks the champion
    up when it runs; every parameter described; the same bytes twice."""
    first = compile_pipeline(tmp_path / "a.yaml", pipeline="batch-predict")
    assert compile_pipeline(tmp_path / "b.yaml", pipeline="batch-predict") == first
    spec = yaml.safe_load((tmp_path / "a.yaml").read_text())
    assert spec["pipelineInfo"]["name"] == "detpipe-batch-predict"
    params = spec["root"]["inputDefinitions"]["parameters"]
    dataflow = {f"dataflow_{name}" for name in ("project", "region", "temp_location", "machine_type", "max_workers",
                                                 "service_account", "network", "subnetwork")}
    assert set(params) == {"images", "registry", "model_name", "version", "score_threshold", "runner", "beam_options",
                           *dataflow}
    assert params["dataflow_max_workers"]["parameterType"] == "NUMBER_INTEGER"
    assert all(p.get("description") for p in params.values())
    (task,) = spec["root"]["dag"]["tasks"].values()
    assert task["cachingOptions"] == {}
    with pytest.raises(ValueError, match="pipeline must be one of"):
        compile_pipeline(tmp_path / "c.yaml", pipeline="nope")


def test_a_step_takes_each_pipeline_parameter_under_its_name_and_type(tmp_path):
    """One name from the parameter to the step: every step input wired from a pipeline
    parameter has the parameter's name and type in the compiled YAML."""
    compile_pipeline(tmp_path / "p.yaml")
    spec = yaml.safe_load((tmp_path / "p.yaml").read_text())
    declared = spec["root"]["inputDefinitions"]["parameters"]
    wired, differing = 0, []
    for name, task in spec["root"]["dag"]["tasks"].items():
        inputs = spec["components"][task["componentRef"]["name"]].get("inputDefinitions", {}).get("parameters", {})
        for arg, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" not in source:
                continue
            wired += 1
            param = source["componentInputParameter"]
            if arg != param or inputs[arg]["parameterType"] != declared[param]["parameterType"]:
                differing.append(f"{name}: {arg} ({inputs[arg]['parameterType']}) <- {param} "
                                 f"({declared[param]['parameterType']})")
    assert wired > 60 and differing == []
