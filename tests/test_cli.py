import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, build_parser, main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [[], ["train"], ["data", "build", "--format", "tiff"],
                                  ["train", "--data", "d", "--output", "o", "--batch-size", "0"],
                                  ["probe", "--nonsense"], ["run", "--local", "--bad-box", "ignore"]])
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: " in err[0] and "--help" in err[0]


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sub))


def test_help_documents_every_option():
    parsers = dict(_subparsers(build_parser()))
    assert {"demo-data", "data build", "probe", "train", "evaluate", "compile", "run", "registry promote"} \
        <= set(parsers)
    for name, parser in parsers.items():
        assert parser.format_help()  # renders (a bare % in a help text would raise here)
        for action in parser._actions:
            if action.option_strings or action.dest not in ("help",):
                assert action.help, f"`detpipe {name}`: {action.option_strings or action.dest} has no help"


def test_help_gives_the_default_worker_counts_the_jobs_use():
    """The default worker counts are written out in --help (the CLI does not import Beam to
    print it); this keeps them the jobs' own."""
    from beam.data_workers import RECORDS_PER_WORKER
    from components.serve.batch_workers import IMAGES_PER_WORKER

    parsers = dict(_subparsers(build_parser()))
    helps = {name: " ".join(parsers[name].format_help().split()) for name in ("data build", "predict")}
    assert f"one per {RECORDS_PER_WORKER:,} records" in helps["data build"]
    assert f"one per {IMAGES_PER_WORKER:,} images" in helps["predict"]


def test_probe_exit_codes(capsys, tmp_path):
    assert main(["probe", "--json", str(tmp_path / "p.json")]) == EXIT_OK
    assert (tmp_path / "p.json").exists()
    assert main(["probe", "--require-gpu"]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("detpipe: ") for line in err)
    assert "no GPU" in err[0] and "fix:" in err[0]


def test_data_build_on_a_folder_without_annotations_fails_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["data", "build", "--format", "voc", "--images", str(tmp_path), "--annotations",
                 str(tmp_path / "empty"), "--output", str(tmp_path / "out")])
    assert code == 2  # a usage error, found before Beam loads
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no *.xml" in err[0] and "it is empty" in err[0]


def test_demo_data_and_data_build_commands(tmp_path, capsys):
    assert main(["demo-data", str(tmp_path / "d"), "--train", "6", "--val", "2", "--seed", "2"]) == EXIT_OK
    assert main(["data", "build", "--format", "voc", "--images", str(tmp_path / "d" / "images"),
                 "--annotations", str(tmp_path / "d" / "annotations"), "--output", str(tmp_path / "o"),
                 "--val-fraction", "0.3"]) == EXIT_OK
    assert "8 records in" in capsys.readouterr().out


# Each row: a mistake a new user makes, and what must be on the single stderr line.
def _usage_table(tmp_path):
    voc = tmp_path / "voc"
    voc.mkdir()
    (voc / "a.xml").write_text("<annotation/>")
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.jpg").write_bytes(b"\xff\xd8")
    shards = tmp_path / "shards"  # what `data build` writes, as far as the command line looks
    shards.mkdir()
    (shards / "label_map.json").write_text("{}")
    (shards / "train-00000-of-00001.tfrecord").write_bytes(b"")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    only_model = tmp_path / "only_model"
    only_model.mkdir()
    (only_model / "model.keras").write_bytes(b"not a model")
    not_json = tmp_path / "probe.json"
    not_json.write_text("not json")
    build = ["data", "build", "--images", str(images), "--output", str(tmp_path / "out")]
    return [
        (build + ["--format", "coco", "--annotations", str(voc)], 2, "--format coco reads one .json file"),
        (build + ["--format", "voc", "--annotations", str(voc), "--schema", "/nope"], 2, "/nope does not exist"),
        (build + ["--format", "voc", "--annotations", str(voc), "--previous-stats", "/nope"], 2, "does not exist"),
        (["data", "build", "--format", "voc", "--images", "/nope", "--annotations", str(voc), "--output",
          str(tmp_path / "o")], 2, "/nope does not exist"),
        (build + ["--format", "voc", "--annotations", str(voc), "--val-fracton", "0.5", "--gzipp"], 2,
         "--val-fracton 0.5 --gzipp"),
        # An unknown option goes to Beam, which has none so named: the detpipe option one typo away is named.
        (build + ["--format", "voc", "--annotations", str(voc), "--val-fration=0.5"], 2,
         "--val-fration: did you mean --val-fraction?"),
        (build + ["--format", "voc", "--annotations", str(voc), "--val-fraction", "abc"], 2, "in [0, 1)"),
        (["train", "--data", str(shards), "--output", str(tmp_path / "m"), "--hparams", "/nope.json"], 2,
         "/nope.json does not exist"),
        (["train", "--data", str(shards), "--output", str(a_file)], 2, "is a file"),
        (["train", "--data", str(images), "--output", str(tmp_path / "m")], 2, "not the output of `detpipe data build`"),
        (["evaluate", "--model", str(only_model), "--data", str(shards), "--output", str(tmp_path / "e")], 2,
         "no model.keras + train_config.json"),
        (["compile", "--output", str(a_file / "p.yaml")], 2, "is a file"),
        (["compile", "--train-retries", "-5"], 2, ">= 0"),
        (["compile", "--data-cpu", "abc"], 2, "CPU count"),
        (["run", "--images", str(images), "--annotations", str(voc)], 2, "needs --local"),
        (["submit", "--project", "p", "--region", "r", "--pipeline-root", "/tmp/x"], 2, "gs://"),
        (["submit", "--project", "p", "--region", "r", "--pipeline-root", "gs://bucket/root", "--param", "epochs"], 2,
         "KEY=VALUE"),
        (["upload", "--repo", "https://example.com/x", "--tag", "v1"], 2, "kfp.pkg.dev"),
        (["run", "--local", "--images", "/nope", "--annotations", str(voc)], 2, "/nope does not exist"),
        (["schedule", "create", "--project", "p", "--region", "r", "--pipeline-root", "gs://bucket/root", "--cron",
          "every monday"], 2, "five fields"),
        (["probe", "--baseline", str(not_json)], 1, "not a probe.json"),
        (["probe", "--data", "/nope"], 2, "/nope does not exist"),
        (["demo-data", str(a_file / "x")], 2, "is a file"),
        (["registry", "show", "v1", "--registry", str(tmp_path / "no-registry")], 1, "no version v1"),
    ]


def test_mistakes_end_in_one_line_with_the_right_exit_code(tmp_path, capsys):
    for argv, code, words in _usage_table(tmp_path):
        try:
            got = main(argv)
        except SystemExit as exit_:
            got = exit_.code
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert got == code, (argv, got, err)
        assert len(lines) == 1 and words in lines[0], (argv, err)
        assert "Traceback" not in err


def test_run_keeps_uris_and_makes_local_paths_absolute(tmp_path, monkeypatch):
    from pipeline.params import params_from_args

    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(b"")
    args = build_parser().parse_args(["run", "--local", "--images", "gs://bucket/photos", "--annotations",
                                      "gs://bucket/coco.json", "--format", "coco", "--registry", "reg"])
    params = params_from_args(args)
    assert params["images"] == "gs://bucket/photos" and params["annotations"] == "gs://bucket/coco.json"
    assert params["registry"] == str(tmp_path / "reg")
    args = build_parser().parse_args(["run", "--local", "--images", "imgs", "--annotations", "imgs"])
    assert params_from_args(args)["images"] == str(tmp_path / "imgs")


def test_error_lines_drop_colour_codes():
    from pipeline.cli_types import error_line

    assert error_line(RuntimeError("Pipeline \x1b[95m'detpipe'\x1b[0m failed\nmore")) == "Pipeline 'detpipe' failed"


def test_run_takes_a_split_file_and_the_bad_box_mode(tmp_path, capsys):
    """`detpipe run --split-file` reaches the pipeline's parameters (absolute, as the steps
    run elsewhere); empty by default: the hash split; a missing one is a usage error."""
    from pipeline.params import params_from_args

    split = tmp_path / "split.json"
    split.write_text('{"train": [], "val": []}')
    (tmp_path / "a.jpg").write_bytes(b"")
    source = ["run", "--local", "--images", str(tmp_path), "--annotations", str(tmp_path)]
    parser = build_parser()
    given = params_from_args(parser.parse_args(source + ["--split-file", str(split), "--bad-box", "reject-image"]))
    assert given["split_file"] == str(split.resolve()) and given["bad_box"] == "reject-image"
    default = params_from_args(parser.parse_args(source))
    assert default["split_file"] == "" and default["bad_box"] == "drop"
    with pytest.raises(SystemExit) as exc:
        main(source + ["--split-file", str(tmp_path / "nope.json")])
    assert exc.value.code == EXIT_USAGE and "nope.json does not exist" in capsys.readouterr().err


def test_processes_the_cli_starts_do_not_print_google_api_cores_python_notice():
    """A local Beam job's worker processes import google-api-core's libraries, each printing
    its Python 3.11 end-of-life notice (8 lines a job): the CLI's environment silences it
    there as in its own process."""
    code = ("from pipeline.quiet_logs import quiet_libraries; quiet_libraries(); import subprocess, sys; "
            "sys.exit(subprocess.run([sys.executable, '-c', 'import google.api_core, google.cloud.storage']).returncode)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert "FutureWarning" not in run.stderr, run.stderr[-1000:]
    shown = subprocess.run([sys.executable, "-c", "import google.api_core, google.cloud.storage"], cwd=REPO, env=env,
                           capture_output=True, text=True, check=True)
    assert "FutureWarning" in shown.stderr  # what it prints without: the check above can fail


def test_beams_own_notes_are_dropped_and_the_jobs_worker_lines_kept():
    import logging

    from apache_beam.portability.api import beam_fn_api_pb2

    from pipeline.quiet_logs import BEAM_WORKER_RELAY, not_beam_chatter

    def relayed(message, location, level=logging.INFO, trace=""):  # as local_job_service re-logs a worker's line
        entry = beam_fn_api_pb2.LogEntry(message=message, log_location=location, trace=trace)
        return logging.LogRecord(BEAM_WORKER_RELAY, level, "local_job_service.py", 1, "Worker: %s",
                                 (str(entry).replace("\n", " "),), None)

    beam_file = "/venv/lib/python3.11/site-packages/apache_beam/runners/worker/sdk_worker_main.py:386"
    assert not not_beam_chatter(relayed("No semi_persistent_directory found", beam_file, logging.WARNING))
    assert not_beam_chatter(relayed("checked 500 records on worker 81 (2304 in the job)",
                                    "/work/repo/beam/job_transforms.py:82"))
    assert not_beam_chatter(relayed("a DoFn failed", beam_file, logging.ERROR))
    # What passes reads as the worker's own line, not as Beam's LogEntry text (severity,
    # timestamp, ids): quotes, non-ASCII and a traceback come back as the worker wrote them.
    line = relayed('checked 7 records of "Füße.xml"\nsecond line', "/work/repo/beam/job_transforms.py:82")
    assert not_beam_chatter(line) and line.getMessage() == 'worker: checked 7 records of "Füße.xml"\nsecond line'
    failed = relayed("a DoFn failed", beam_file, logging.ERROR,
                     trace="Traceback (most recent call last):\n  ValueError: bad")
    assert not_beam_chatter(failed) and failed.getMessage() == (
        "worker: a DoFn failed\nTraceback (most recent call last):\n  ValueError: bad")
    odd = logging.LogRecord(BEAM_WORKER_RELAY, logging.INFO, "local_job_service.py", 1, "Worker: %s", ("{not",), None)
    assert not_beam_chatter(odd) and odd.getMessage() == "Worker: {not"
    root = logging.LogRecord("root", logging.INFO, "/venv/site-packages/apache_beam/transforms/util.py", 1,
                             "BatchElements statistics: %s", ("...",), None)
    assert not not_beam_chatter(root)
    ours = logging.LogRecord("components.serve.batch_job", logging.INFO, "/work/repo/components/serve/batch_job.py",
                             1, "predict: %d files", (3,), None)
    assert not_beam_chatter(ours)


# Options that share a pipeline parameter's name but are another setting, and why.
NOT_THE_PARAMETER = {
    ("registry list", "--registry"): "the registry commands read the local run's folder by default",
    ("registry show", "--registry"): "the registry commands read the local run's folder by default",
    ("registry promote", "--registry"): "the registry commands read the local run's folder by default",
    ("predict", "images"): "image files to predict, not the training images",
    ("demo-data", "--seed"): "the seed of the generated images",
}
# Options that take a parameter's type and checks but not its default: not given is None.
NOT_GIVEN_IS_NONE = {
    ("train", "--base-lr"): "--hparams's value when given, else the declaration's default",
    ("train", "--weight-decay"): "--hparams's value when given, else the declaration's default",
    ("train", "--augment-strength"): "--hparams's value when given, else the declaration's default",
    ("tune-trial", "--base_lr_per_64"): "a value Vertex AI's tuning job passes, else the declaration's default",
    ("tune-trial", "--weight_decay"): "a value Vertex AI's tuning job passes, else the declaration's default",
    ("tune-trial", "--augment_strength"): "a value Vertex AI's tuning job passes, else the declaration's default",
}
# Options whose help is their command's own words, not the declaration's: the command uses the
# setting for something narrower (the probe's memory check assumes --image-size).
OWN_WORDS = {
    ("probe", "--image-size"), ("probe", "--model-size"), ("probe", "--batch-size"), ("probe", "--precision"),
    ("probe", "--xla"), ("data build", "--seed"), ("evaluate", "--min-map"),
    ("train", "--registry"), ("train", "--base-lr"), ("train", "--weight-decay"), ("train", "--augment-strength"),
    ("registry promote", "--vertex-model"), ("registry show", "--vertex-model"), ("data build", "--images"), ("data build", "--annotations"),
    ("data build", "--allow-new-classes"), ("data build", "--allow-anomalies"), ("probe", "--require-gpu"),
    ("probe", "--allow-poor-anchors"), ("probe", "--tile"), ("data build", "--tile"),
    ("tune-trial", "--base_lr_per_64"), ("tune-trial", "--weight_decay"), ("tune-trial", "--augment_strength"),
    ("export", "--format"),
}


def _options(parser, command=""):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{command} {name}".strip())
        elif action.dest != "help":
            yield command, action


def test_every_option_of_a_pipeline_parameter_agrees_with_its_declaration():
    """An option that sets a pipeline parameter (`train --epochs`, `data build --exif`,
    `registry promote --vertex-model`, every `run` option) takes the declaration's type (with
    its checks), default, choices and help (OWN_WORDS apart); a parameter without a default is a
    required option."""
    import argparse

    from pipeline.cli import build_parser
    from pipeline.params import BY_NAME, REQUIRED, Switch, _bool_arg, _help_with_default

    checked, problems = 0, []
    for command, action in _options(build_parser()):
        name = action.option_strings[0] if action.option_strings else action.dest
        if action.dest not in BY_NAME or (command, name) in NOT_THE_PARAMETER:
            continue
        param, checked = BY_NAME[action.dest], checked + 1
        defaults = {param.default} | ({param.cli_default} if param.cli_default is not REQUIRED else set())
        defaults |= {None} if (command, name) in NOT_GIVEN_IS_NONE else set()
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, Switch))
        if isinstance(action, Switch):  # --flag / --no-flag of a setting on by default
            agrees = param.type is bool and param.default is True and action.default is True
        elif flag:  # --flag
            agrees = param.type is bool and param.default is isinstance(action, argparse._StoreFalseAction)
        elif param.default is REQUIRED and command != "run":
            agrees = action.required and action.type is (param.cli_type or param.type)
        else:
            agrees = (action.default in defaults and tuple(action.choices or ()) == tuple(param.choices)
                      and action.type is (param.cli_type or (_bool_arg if param.type is bool else param.type)))
        if not agrees:
            problems.append(f"{command} {name}: default {action.default!r}, type {action.type}, choices "
                            f"{action.choices}; declared {param.default!r}, {param.cli_type or param.type}, "
                            f"{param.choices}")
        said = _help_with_default(param.help, action.default, flag=param.type is bool and action.default is False)
        if not (flag and isinstance(action, argparse._StoreFalseAction)) and (command, name) not in OWN_WORDS \
                and action.help != said:
            problems.append(f"{command} {name}: help {action.help!r}, declared {said!r}")
    assert checked >= 70 and not problems, problems


def test_no_option_writes_its_default_into_its_help():
    """A default shown in --help is argparse's `%(default)s`, so it cannot say another value
    than the option has."""
    from pipeline.cli import build_parser

    restated = [f"{command} {action.option_strings[0]}: {action.help!r}" for command, action in _options(build_parser())
                if action.option_strings and action.help and action.default not in (None, "", False, True)
                and re.search(rf"default:? {re.escape(str(action.default))}\b", action.help)]
    assert restated == []


# Settings of the pipeline still given a literal default in a second place (issue 53 moves
# each to one declaration): (file, class, field). A new repeat fails the test below, and so
# does one removed without taking it off this list.
STILL_REPEATED = {
    # The split's seed (beam/) and training's (components/) are one pipeline parameter, `seed`,
    # declared from TrainConfig.seed; beam/ imports nothing above it, so the data job keeps its own 0.
    ("beam/options.py", "ConvertOptions", "seed"),
}


def test_a_pipeline_setting_s_default_is_written_once():
    """A dataclass field named for a pipeline parameter, with a literal default of its type,
    is either the parameter's declaration (pipeline/params.py takes its default from it) or
    listed above."""
    import ast
    from pathlib import Path

    from pipeline.params import BY_NAME

    repo = Path(__file__).resolve().parents[1]
    params_source = (repo / "pipeline" / "params.py").read_text()
    found = set()
    for path in [*repo.joinpath("beam").rglob("*.py"), *repo.joinpath("components").rglob("*.py")]:
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                        and node.target.id in BY_NAME and isinstance(node.value, ast.Constant)
                        and node.value.value not in (None, "")
                        and type(node.value.value) is BY_NAME[node.target.id].type  # else another setting
                        and f"{cls.name}.{node.target.id}" not in params_source):
                    found.add((path.relative_to(repo).as_posix(), cls.name, node.target.id))
    assert found == STILL_REPEATED, (f"new: {sorted(found - STILL_REPEATED)}; "
                                     f"now written once (take off the list): {sorted(STILL_REPEATED - found)}")


def test_every_option_s_help_is_short():
    """--help is a reminder: an option says what it is in at most HELP_LIMIT characters, and the
    command's help ends with the docs page that explains the rest (tests/test_docs.py)."""
    from pipeline.cli import build_parser

    long = [f"{command} {action.option_strings[0] if action.option_strings else action.dest}: {len(action.help)}"
            for command, action in _options(build_parser()) if action.help and len(action.help) > HELP_LIMIT]
    assert long == []


HELP_LIMIT = 240


@pytest.mark.parametrize("argv,words", [
    (["trian"], "(did you mean train?) (see `detpipe --help`)"),
    (["data", "build", "--val-fration", "0.1"], "(--val-fration: did you mean --val-fraction?) "
                                                "(see `detpipe data build --help`)"),
    (["run", "--epocs", "3"], "(--epocs: did you mean --epochs?) (see `detpipe run --help`)"),
    (["data", "biuld"], "(did you mean build?)"),
])
def test_a_mistyped_command_or_option_gets_a_guess_and_its_subcommand_s_help(argv, words, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_version(capsys):
    from importlib.metadata import version

    from pipeline.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.strip() == f"detpipe {version('detpipe')}"


def test_settings_that_are_on_by_default_are_switched_off_the_same_way_in_every_command(tmp_path):
    from pipeline.cli import build_parser

    raccoon = REPO / "tests" / "data" / "raccoon"
    (tmp_path / "label_map.json").write_text("{}")  # a folder the command line takes for shards
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    parser = build_parser()
    base = {"run": ["run", "--local", "--images", str(raccoon / "images"), "--annotations",
                    str(raccoon / "annotations")],
            "train": ["train", "--data", str(tmp_path), "--output", str(tmp_path / "out")]}
    for command, argv in base.items():
        parse = lambda *extra: parser.parse_known_args([*argv, *extra])[0]  # noqa: E731
        assert parse().ema is True and parse().flip is True, command
        assert parse("--no-ema").ema is False and parse("--no-flip").flip is False, command
        assert parse("--ema", "false").ema is False and parse("--ema=true").ema is True, command  # the old spelling
        assert parse("--no-ema", "--ema").ema is True, command  # the last one wins
