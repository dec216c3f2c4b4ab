"""A setting declared once (pipeline/params.py) reaches each step the same way, checked on the
compiled pipeline itself: a KFP step input named for a declared parameter has the declaration's
type and is fed that pipeline parameter and no other; the probe, tune and train steps take every
training setting; and a command option of that name takes the declaration's type, default and
choices. The training, Dataflow and export settings of the steps and the DAG's calls are made
from the declaration (pipeline/kfp_settings.py), the other steps' inputs by hand: this test is
what fails when one drifts from the declaration."""

import pytest
import yaml

from pipeline.params import BY_NAME, PARAMS, REQUIRED, TRAINING

KFP_TYPES = {bool: "BOOLEAN", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", str: "STRING"}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    from pipeline.compile import compile_pipeline

    path = tmp_path_factory.mktemp("compiled") / "p.yaml"
    compile_pipeline(path)
    return yaml.safe_load(path.read_text())


def step_inputs(spec: dict) -> dict[str, dict[str, str]]:
    """Each task's parameter inputs: {task: {input: its KFP type}}."""
    tasks = spec["root"]["dag"]["tasks"]
    return {task: {name: value["parameterType"] for name, value in
                   spec["components"][body["componentRef"]["name"]]["inputDefinitions"].get("parameters", {}).items()}
            for task, body in tasks.items()}


def type_mismatches(inputs: dict[str, dict[str, str]]) -> list[tuple]:
    return [(task, name, kind, KFP_TYPES[BY_NAME[name].type]) for task, names in inputs.items()
            for name, kind in names.items() if name in BY_NAME and kind != KFP_TYPES[BY_NAME[name].type]]


def crossed_inputs(spec: dict) -> list[tuple]:
    """Task inputs named for a declared parameter but fed something else (another parameter, a
    constant, an upstream output of another name). An upstream output of the same name is the
    parameter resolved (the registry folder fingerprint-source resolves under the pipeline root)."""
    crossed = []
    for task, body in spec["root"]["dag"]["tasks"].items():
        for name, source in body["inputs"].get("parameters", {}).items():
            resolved = source.get("taskOutputParameter", {}).get("outputParameterKey")
            if name in BY_NAME and name not in (source.get("componentInputParameter"), resolved):
                crossed.append((task, name, source))
    return crossed


def test_each_step_input_named_for_a_parameter_has_its_declared_type(spec):
    inputs = step_inputs(spec)
    assert type_mismatches(inputs) == []
    assert sum(name in BY_NAME for names in inputs.values() for name in names) > 60  # the steps take them by name


def test_the_dag_feeds_each_input_the_parameter_of_its_name(spec):
    assert crossed_inputs(spec) == []
    pipeline_inputs = set(spec["root"]["inputDefinitions"]["parameters"])
    assert pipeline_inputs == {p.name for p in PARAMS}  # one pipeline parameter per declared setting


def test_probe_tune_and_train_take_every_training_setting(spec):
    inputs = step_inputs(spec)
    for task in ("probe", "tune-hyperparameters", "train"):
        assert set(TRAINING) <= set(inputs[task]), task
    assert {"image_size", "box_loss", "epochs", "fine_tune_epochs"} <= set(TRAINING)


def test_every_parameter_reaches_a_step(spec):
    """No declared parameter is left unused (a step that lost its input, a setting nobody reads)."""
    fed = {source.get("componentInputParameter") for body in spec["root"]["dag"]["tasks"].values()
           for source in body["inputs"].get("parameters", {}).values()}
    assert {p.name for p in PARAMS} - fed == set()


def _subcommand_actions():
    from pipeline.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for command, sub in commands.choices.items():
        nested = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        subs = [(f"{command} {n}", s) for a in nested for n, s in a.choices.items()] if nested else [(command, sub)]
        for name, subparser in subs:
            for action in subparser._actions:
                yield name, action


# Options that share a parameter's name but, on purpose, not its default: (command, name) ->
# the default they take instead, and why.
OWN_DEFAULTS = {
    **{("train", name): (None, "taken from --hparams unless given") for name in
       ("base_lr_per_64", "weight_decay", "augment_strength")},
    **{("tune-trial", name): (None, "the value Vertex AI's tuning service proposes") for name in
       ("base_lr_per_64", "weight_decay", "augment_strength")},
    **{(f"registry {command}", "registry"): ("local_outputs/registry", "the registry `run --local` writes")
       for command in ("list", "show", "promote")},
}


def option_mismatches(actions) -> tuple[int, list[tuple]]:
    """(options checked, those whose default or choices are not the declaration's)."""
    checked, wrong = 0, []
    for command, action in actions:
        declared = BY_NAME.get(action.dest)
        if declared is None or command == "run" or not action.option_strings:
            continue  # `run` takes every parameter from the declaration in a loop (run_cli.py)
        checked += 1
        if (command, action.dest) in OWN_DEFAULTS:
            own, _ = OWN_DEFAULTS[command, action.dest]
            if action.default != own:
                wrong.append((command, action.dest, "default", action.default, own))
            continue
        if declared.default is not REQUIRED and action.default != declared.default:
            wrong.append((command, action.dest, "default", action.default, declared.default))
        if declared.choices and tuple(action.choices or ()) != tuple(declared.choices):
            wrong.append((command, action.dest, "choices", action.choices, declared.choices))
    return checked, wrong


def test_each_command_option_named_for_a_parameter_takes_its_declaration():
    checked, wrong = option_mismatches(_subcommand_actions())
    assert checked > 20
    assert wrong == []


def test_a_drift_from_the_declaration_would_be_found():
    import argparse

    assert type_mismatches({"probe": {"image_size": "NUMBER_INTEGER"}}) == [
        ("probe", "image_size", "NUMBER_INTEGER", "STRING")]
    wrong = {"epochs": {"componentInputParameter": "fine_tune_epochs"}, "seed": {"componentInputParameter": "seed"}}
    assert crossed_inputs({"root": {"dag": {"tasks": {"train": {"inputs": {"parameters": wrong}}}}}}) == [
        ("train", "epochs", {"componentInputParameter": "fine_tune_epochs"})]
    stale = argparse.Action(["--epochs"], "epochs", default=BY_NAME["epochs"].default + 1)
    narrowed = argparse.Action(["--model-size"], "model_size", default=BY_NAME["model_size"].default, choices=["tiny"])
    assert option_mismatches([("train", stale), ("train", narrowed)])[1] == [
        ("train", "epochs", "default", BY_NAME["epochs"].default + 1, BY_NAME["epochs"].default),
        ("train", "model_size", "choices", ["tiny"], BY_NAME["model_size"].choices)]


def test_settings_are_written_into_a_step_as_typed_parameters():
    import doctest

    from pipeline import kfp_settings

    assert doctest.testmod(kfp_settings).failed == 0

    def no_marker(data: str) -> str:
        return data

    def clashing(epochs: int, settings: dict) -> int:
        return epochs

    with pytest.raises(TypeError, match="needs a parameter `settings: dict`"):
        kfp_settings.with_settings(no_marker, {"epochs": int})
    with pytest.raises(TypeError, match="already has parameters named epochs"):
        kfp_settings.with_settings(clashing, {"epochs": int})


def test_train_tune_and_probe_offer_every_training_setting_and_hand_it_to_train_config():
    from components.train.config import TrainConfig
    from components.tune.trials import TRIAL_OWN
    from pipeline.params import training_values

    offered = {}
    for command, action in _subcommand_actions():
        offered.setdefault(command, set()).add(action.dest)
    assert set(TRAINING) <= offered["train"] and set(TRAINING) <= offered["probe"]
    assert set(TRAINING) - offered["tune"] == set(TRAINING) & set(TRIAL_OWN)  # a trial sets those itself
    import argparse

    args = argparse.Namespace(**{action.dest: action.default for command, action in _subcommand_actions()
                                 if command == "train"})  # what `train` holds when no option is given
    from pipeline.train_cli import HPARAMS_OPTIONS  # None unless given: --hparams' values then

    given = {name: value for name, value in training_values(args).items() if name not in HPARAMS_OPTIONS}
    assert given.keys() == set(TRAINING) - set(HPARAMS_OPTIONS)
    config = TrainConfig("d", "o", **given)
    assert {name: getattr(config, name) for name in given} == {name: getattr(TrainConfig("d", "o"), name)
                                                                for name in given}


def test_a_rule_about_settings_lives_in_the_config_so_every_adapter_gets_it():
    """Augmentation off when neither flip nor a strength is left: in TrainConfig itself, so `train`,
    `tune`, the probe's dry run and the KFP steps (which all make a TrainConfig) agree."""
    from components.train.config import TrainConfig

    assert not TrainConfig(data_dir="d", output_dir="o", flip=False, augment_strength=0.0).augment
    assert TrainConfig(data_dir="d", output_dir="o", flip=False, augment_strength=0.1).augment
    assert TrainConfig(data_dir="d", output_dir="o", flip=True, augment_strength=0.0).augment


def compiled_with(made_up, tmp_path, monkeypatch, **step_settings) -> dict:
    """The pipeline compiled with one more declared parameter, `made_up`, and the DAG's
    `step_settings` (TRAINING=..., EXPORT=...) naming it."""
    from pipeline import dag, params
    from pipeline.compile import compile_pipeline

    declared = (*params.PARAMS, made_up)
    for name, value in step_settings.items():
        monkeypatch.setattr(dag, name, value)
    monkeypatch.setattr(dag, "in_signature_order", lambda: params.in_signature_order(declared))
    monkeypatch.setattr(dag, "pipeline_signature", lambda: params.pipeline_signature(declared))
    monkeypatch.setattr(dag, "pipeline_docstring", lambda summary: params.pipeline_docstring(summary, declared))
    compile_pipeline(tmp_path / "p.yaml")
    return yaml.safe_load((tmp_path / "p.yaml").read_text())


def test_a_made_up_training_setting_needs_its_declaration_and_nothing_else(tmp_path, monkeypatch):
    """One more Param among the training settings (a TrainConfig field, in the code): the compiled
    DAG offers it as a parameter with its default and description, the probe, tune and train steps
    take it under its name from that parameter, and `detpipe train` has its option; neither the
    DAG's code, the steps nor the commands change."""
    import argparse

    from pipeline import params

    made_up = params.Param("made_up_rate", float, 0.125, "A setting made up by this test.")
    training = {**params.TRAINING, made_up.name: float}
    spec = compiled_with(made_up, tmp_path, monkeypatch, TRAINING=training)
    root = spec["root"]["inputDefinitions"]["parameters"][made_up.name]
    assert root["defaultValue"] == 0.125 and root["description"] == made_up.help
    for task in ("probe", "tune-hyperparameters", "train"):
        given = spec["root"]["dag"]["tasks"][task]["inputs"]["parameters"]
        assert given[made_up.name] == {"componentInputParameter": made_up.name}, task
    assert made_up.name not in spec["root"]["dag"]["tasks"]["evaluate"]["inputs"]["parameters"]

    monkeypatch.setattr(params, "TRAINING", training)
    monkeypatch.setitem(params.BY_NAME, made_up.name, made_up)
    parser = argparse.ArgumentParser()
    params.add_training_options(parser)
    assert params.training_values(parser.parse_args(["--made-up-rate", "0.5"]))[made_up.name] == 0.5


def test_the_export_step_and_command_take_every_export_setting_from_its_field(spec, tmp_path, monkeypatch):
    """ExportSettings' fields are the pipeline's export_* parameters (their help the field's),
    the export step's inputs (each fed its parameter) and `detpipe export`'s options; a made-up
    export parameter reaches the export step with no change to the DAG or the step."""
    import argparse
    from dataclasses import fields

    from components.export.file_formats import SETTINGS_PREFIX, ExportSettings
    from pipeline import params
    from pipeline.cli import build_parser

    names = {SETTINGS_PREFIX + f.name: f for f in fields(ExportSettings)}
    assert set(params.EXPORT) == set(names)
    assert all(BY_NAME[name].help == f.metadata["help"] and BY_NAME[name].default == f.default
               for name, f in names.items())
    given = spec["root"]["dag"]["tasks"]["export"]["inputs"]["parameters"]
    assert all(given[name] == {"componentInputParameter": name} for name in names)
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(names) <= {action.dest for action in commands["export"]._actions}

    made_up = params.Param(SETTINGS_PREFIX + "made_up_quality", int, 7, "An export setting made up by this test.")
    made = compiled_with(made_up, tmp_path, monkeypatch, EXPORT={**params.EXPORT, made_up.name: int})
    assert made["root"]["dag"]["tasks"]["export"]["inputs"]["parameters"][made_up.name] == {
        "componentInputParameter": made_up.name}
    assert made_up.name not in made["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]


def test_the_promotion_rule_s_fields_are_its_parameters_and_the_evaluate_step_s_inputs(spec):
    """PromotionRule's fields (help and choices in their metadata) are the promote_if,
    max_regression and min_map parameters, and the evaluate step takes each, fed its parameter."""
    from dataclasses import fields

    from components.model_registry.decision import PromotionRule
    from pipeline.params import RULE

    rule = {f.name: f for f in fields(PromotionRule)}
    assert list(RULE) == list(rule) == ["promote_if", "max_regression", "min_map"]
    assert all(BY_NAME[name].help == f.metadata["help"] and BY_NAME[name].default == f.default
               and BY_NAME[name].choices == f.metadata.get("choices", ()) for name, f in rule.items())
    given = spec["root"]["dag"]["tasks"]["evaluate"]["inputs"]["parameters"]
    assert all(given[name] == {"componentInputParameter": name} for name in rule)
