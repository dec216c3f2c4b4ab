"""A setting declared once (pipeline/params.py) reaches each step the same way: a KFP step input
named for a declared parameter has the declaration's type, the DAG passes that input the
parameter of the same name and no other, and a command option of that name takes the
declaration's type, default and choices. Today these are written by hand in each place; this
test is what fails when one of them drifts from the declaration."""

import ast
import inspect
from pathlib import Path


from components import kfp_steps
from pipeline.params import BY_NAME, REQUIRED

ROOT = Path(__file__).resolve().parents[1]
STEP_FUNCTIONS = ("fingerprint_source", "validate_and_convert", "probe", "tune_hyperparameters", "train", "evaluate",
                  "review", "export", "register", "report")


def _step_inputs() -> dict[str, dict[str, object]]:
    """Each KFP step function's inputs that share a declared parameter's name, with their annotations."""
    out = {}
    for name in STEP_FUNCTIONS:
        signature = inspect.signature(getattr(kfp_steps, name))
        out[name] = {p: parameter.annotation for p, parameter in signature.parameters.items() if p in BY_NAME}
    return out


def type_mismatches(inputs: dict[str, dict[str, object]]) -> list[tuple]:
    return [(step, name, annotation, BY_NAME[name].type) for step, names in inputs.items()
            for name, annotation in names.items() if annotation not in (BY_NAME[name].type, BY_NAME[name].type.__name__)]


def test_each_step_input_named_for_a_parameter_has_its_declared_type():
    inputs = _step_inputs()
    assert type_mismatches(inputs) == []
    assert sum(len(names) for names in inputs.values()) > 40  # the steps take the settings by name


def _dag_keywords() -> list[tuple[int, str, str]]:
    """(line, input, parameter) of every DAG call argument given a pipeline parameter `p.NAME`."""
    tree = ast.parse((ROOT / "pipeline" / "dag.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                value = keyword.value
                if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                        and value.value.id == "p" and keyword.arg):
                    found.append((value.lineno, keyword.arg, value.attr))
    return found


def crossed_keywords(keywords: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The DAG arguments given another declared parameter than the one of their name."""
    return [(line, arg, attr) for line, arg, attr in keywords if attr in BY_NAME and arg != attr]


def test_the_dag_passes_each_input_the_parameter_of_its_name():
    keywords = _dag_keywords()
    assert len(keywords) > 60
    assert crossed_keywords(keywords) == [], "an input given another parameter than its own"
    unknown = sorted({attr for _, _, attr in keywords if attr not in BY_NAME})
    assert unknown == [], f"the DAG reads parameters nobody declared: {unknown}"


def test_every_declared_step_setting_reaches_a_step_that_takes_it():
    """A parameter a step input is named for is passed to that step by the DAG (no input left
    at a default the user cannot change)."""
    passed = {arg for _, arg, _ in _dag_keywords()}
    taken = {name for inputs in _step_inputs().values() for name in inputs}
    assert taken - passed == set()


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

    assert type_mismatches({"probe": {"image_size": int}}) == [("probe", "image_size", int, str)]
    assert crossed_keywords([(7, "epochs", "fine_tune_epochs"), (8, "epochs", "epochs")]) == [
        (7, "epochs", "fine_tune_epochs")]
    stale = argparse.Action(["--epochs"], "epochs", default=BY_NAME["epochs"].default + 1)
    narrowed = argparse.Action(["--model-size"], "model_size", default=BY_NAME["model_size"].default, choices=["tiny"])
    assert option_mismatches([("train", stale), ("train", narrowed)])[1] == [
        ("train", "epochs", "default", BY_NAME["epochs"].default + 1, BY_NAME["epochs"].default),
        ("train", "model_size", "choices", ["tiny"], BY_NAME["model_size"].choices)]
