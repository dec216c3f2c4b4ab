"""No import cycles among pipeline/, components/ and beam/: every import counts, at the top
of a module or inside a function (the KFP component bodies and the CLI's deferred imports
too), so a cycle cannot hide behind a function-level import."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "components", "beam")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # A package's __init__ is imported along with any of its modules; ours are docstrings only,
    # so importing `a.b.c` is an edge to a.b.c and nothing else.
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_is_seen_whole():
    graph = import_graph()
    assert "components.train.trainer" in graph["pipeline.kfp_steps"]  # a KFP component body's import
    assert "pipeline.local_run" in graph["pipeline.run_cli"]  # a deferred CLI import


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The steps' packages. Each builds on components.detector (the detector core) and reaches
# another step only through one of INTERFACES: modules that define a file or a contract
# the two share, or the one function a step lends another.
STEPS = ("fingerprint", "train", "tune", "evaluate", "review", "export", "serve", "probe", "model_registry",
         "register", "report")
CORE = "components.detector"
INTERFACES = {
    "components.tune.hparams_file": "best_hparams.json's definition (the run report shows the tune step's choice)",
    "components.tune.tune_report": "the names of the tune step's pictures (the run report shows them)",
    "components.tune.trials": "trials.jsonl's definition (the run report reads the tune step's trials)",
    "components.evaluate.metrics_file": "metrics.json's definition (export, register, report read it)",
    "components.review.label_review": "label_review.jsonl's definition (the run report reads it)",
    "components.evaluate.evaluator": "val_images: the review reads the val photos as evaluation does",
    "components.evaluate.detections_file": "detections.jsonl's definition: the review scores evaluation's detections",
    "components.train.trainer": "train_detector: the label review's fold models, the tuner's trials and the probe's "
                                "dry run train as the train step does",
    "components.train.distribution": "training_devices: the probe's dry run names the devices training would use",
    "components.evaluate.pictures": "the names of the evaluation's picture files (the run report links them)",
    "components.model_registry.decision": "decision.json's definition and the promotion rule",
    "components.model_registry.registry": "the registry folder: versions, champion, their SavedModels",
    "components.model_registry.checksums": "sha256.json: what a registered folder held (export, the champion's score and "
                                     "the warm start check a model before loading it)",
    "components.model_registry.store": "Conflict: the register step's version name was taken by a concurrent run",
    "components.model_registry.vertex_model": "the Vertex AI Model Registry's requests (register uploads each version)",
    "components.model_registry.vertex_endpoint": "deploy_to_endpoint: register puts a new champion behind its endpoint",
    "components.export.saved_model": "the SavedModel's serving signature and export (serve, the probe's dry run)",
    "components.export.export_files": "the names of an export's files (serve looks for them before TensorFlow)",
    "components.export.rescore": "passed_files: register records the converted files that passed with the version",
    "components.export.file_formats": "is_model_file: batch prediction tells a converted file from a SavedModel",
    "components.export.file_predictor": "a converted file run as `predict --model FILE` runs it (batch prediction)",
    "components.export.model_files": "check_model_dir: a folder is an export, said before TensorFlow loads",
    "components.export.predictor": "a SavedModel run as `detpipe serve` runs it (serve; the champion's score)",
    "components.train.time_budget": "the time budget's `auto`: the tune step decides on a search by the training's "
                                    "budget",
    "components.train.config": "TrainConfig, what a training run is asked to do (the probe's dry run runs one)",
    "components.train.input_pipeline": "train_dataset: the probe times training's input pipeline on the real shards",
}

# The steps' layers, lowest first: a step imports only its own layer's interfaces and those
# below. Training and the registry's files are the base; evaluation reads both; the tuner,
# the export and the checks above them; serving, registering and the probe (which runs a
# training and an export) over those; the run report reads everything.
LAYERS = {"fingerprint": 1, "train": 1, "model_registry": 1, "export": 2, "evaluate": 3, "tune": 3, "review": 4, "probe": 4, "serve": 4,
          "register": 4, "report": 5}
# The imports that run up a layer, by step pair, each with its reason: none. (Evaluation
# re-scores the champion's SavedModel as `serve` answers, through export's predictor, below it;
# the export takes the threshold evaluation chose from its adapters, not from evaluate.)
UPWARD: dict[tuple[str, str], str] = {}


def upward_imports() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Each (step, step above it) pair an import runs up, with the imports."""
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name, deps in import_graph().items():
        for dep in deps:
            low, high = _step(name), _step(dep)
            if low and high and low != high and LAYERS[high] > LAYERS[low]:
                found.setdefault((low, high), []).append((name, dep))
    return found


def test_at_most_one_step_pair_imports_up_a_layer_and_it_says_why():
    assert set(LAYERS) == set(STEPS)
    found = upward_imports()
    assert set(found) == set(UPWARD), {pair: found[pair] for pair in set(found) - set(UPWARD)}
    assert UPWARD == {}


def _step(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "components" and parts[1] in STEPS else None


def test_the_detector_core_imports_no_step():
    graph = import_graph()
    core = {name: deps for name, deps in graph.items() if name == CORE or name.startswith(CORE + ".")}
    assert len(core) > 5, "the core package moved?"
    reached = {(name, dep) for name, deps in core.items() for dep in deps if _step(dep)}
    assert reached == set(), f"the detector core imports a step: {sorted(reached)}"


def test_a_step_reaches_another_only_through_a_declared_interface():
    graph = import_graph()
    undeclared = sorted((name, dep) for name, deps in graph.items() for dep in deps
                        if _step(name) and _step(dep) and _step(dep) != _step(name) and dep not in INTERFACES)
    assert undeclared == [], "a step imports another's internals; use components.detector or declare " \
                             f"an interface in INTERFACES: {undeclared}"
    # Each builds on the core; serve runs the exported SavedModel, whose graph holds the
    # core's decoding, resizing and detection, and needs no Python of it.
    for step in ("train", "evaluate", "export", "probe"):
        assert any(_step(name) == step and any(dep.startswith(CORE + ".") for dep in deps)
                   for name, deps in graph.items()), step
    used = {dep for name, deps in graph.items() for dep in deps if _step(name) and _step(dep) != _step(name)}
    assert set(INTERFACES) <= used, f"declared but unused: {sorted(set(INTERFACES) - used)}"


def test_an_undeclared_import_between_steps_would_be_found():
    assert _step("components.train.model") == "train" and _step("components.detector.model") is None
    assert _step("pipeline.kfp_steps") is None and _step("pipeline.cli") is None


# The Beam side. beam/contract/ is the shard contract (feature keys, codec, manifest, label map,
# rejects rows, images): everything a step knows of a dataset comes from there. Besides it, a
# step may use only the plumbing every Beam job of the project runs on (the batch prediction
# job is one), and only the pipeline's adapters (pipeline/: the CLI and the KFP steps) start the
# data job itself through its entry modules.
CONTRACT = "beam.contract"
BEAM_PLUMBING = {
    "beam.data_workers": "how many local workers a job gets, from the CPUs this process may use (the probe reports them)",
    "beam.runner": "a job's runner and options, locally or on Dataflow",
    "beam.local_worker": "the local worker processes and the check that one died",
}
BEAM_ENTRY = {
    "beam.convert_job": "build_dataset: the data step",
    "beam.options": "ConvertOptions, GateOptions: the data step's settings, declared once",
    "beam.dataflow": "DataflowSettings: where the Beam jobs run on Dataflow, declared once",
    "beam.record_checks": "CheckOptions and BAD_BOX_MODES: the checks' settings and --bad-box's choices",
    "beam.split": "given_split_conflict: the pre-flight check of a dataset that comes split",
}
ADAPTERS = ("pipeline.",)


def _beam_imports_allowed(importer: str, dep: str) -> bool:
    if not dep.startswith("beam.") or dep == CONTRACT or dep.startswith(CONTRACT + "."):
        return True
    if dep in BEAM_PLUMBING:
        return True
    return dep in BEAM_ENTRY and importer.startswith(ADAPTERS)


def test_the_shard_contract_imports_nothing_but_itself():
    graph = import_graph()
    contract = {name: deps for name, deps in graph.items() if name.startswith(CONTRACT + ".")}
    assert {"beam.contract.feature_keys", "beam.contract.manifest", "beam.contract.label_map",
            "beam.contract.rejects", "beam.contract.codec"} <= set(contract)
    outside = sorted((name, dep) for name, deps in contract.items() for dep in deps
                     if not (dep == CONTRACT or dep.startswith(CONTRACT + ".")))
    assert outside == [], f"the shard contract imports beyond itself: {outside}"


def test_beam_imports_nothing_above_it():
    graph = import_graph()
    upward = sorted((name, dep) for name, deps in graph.items() if name.startswith("beam.")
                    for dep in deps if dep.startswith(("components", "pipeline")))
    assert upward == [], f"beam/ imports a step or the pipeline: {upward}"


def test_the_steps_know_the_beam_job_only_through_the_contract():
    graph = import_graph()
    reaching = sorted((name, dep) for name, deps in graph.items() if name.startswith(("components", "pipeline"))
                      for dep in deps if not _beam_imports_allowed(name, dep))
    assert reaching == [], f"an import of the Beam job's internals; use beam.contract or declare it: {reaching}"
    used = {dep for name, deps in graph.items() if name.startswith(("components", "pipeline")) for dep in deps}
    assert set(BEAM_PLUMBING) | set(BEAM_ENTRY) <= used, sorted(set(BEAM_PLUMBING) | set(BEAM_ENTRY) - used)
    for reader in ("components.detector.records", "components.evaluate.evaluator", "components.export.predictor",
                   "components.train.trainer"):
        assert any(dep.startswith(CONTRACT + ".") for dep in graph[reader]), reader


def test_an_import_of_the_job_s_internals_would_be_found():
    assert _beam_imports_allowed("components.train.trainer", "beam.contract.label_map")
    assert not _beam_imports_allowed("components.train.trainer", "beam.convert_job")
    assert _beam_imports_allowed("pipeline.cli", "beam.convert_job")
    assert not _beam_imports_allowed("pipeline.cli", "beam.job_transforms")


def test_the_steps_logic_imports_no_kfp():
    """components/ holds the steps' logic as plain functions; their KFP adapters are pipeline/'s."""
    found = []
    for path in (ROOT / "components").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}: {name}" for name in names
                      if name.split(".")[0] in ("kfp", "google_cloud_pipeline_components")]
    assert found == []


def test_tensorflow_imports_without_the_optional_libraries_detpipe_does_not_use_and_they_import_after():
    """components/tf_import.py, in a fresh process as a step starts: TensorFlow's import skips
    scikit-learn, matplotlib, googleapiclient and pandas, and each still imports afterwards."""
    import subprocess
    import sys

    from components.tf_import import HIDDEN

    script = ("import sys, pipeline.cli, tensorflow, keras; "
              f"print(sorted(n for n in {HIDDEN!r} if n in sys.modules)); "
              "import sklearn, matplotlib.pyplot, googleapiclient, pandas; print('after: ok')")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-2:] == ["[]", "after: ok"]
    import doctest

    from components import tf_import

    assert doctest.testmod(tf_import).failed == 0
