import argparse

import pytest

from pipeline.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, build_parser, main


@pytest.mark.parametrize("argv", [[], ["train"], ["data", "build", "--format", "tiff"],
                                  ["train", "--data", "d", "--output", "o", "--batch-size", "0"],
                                  ["probe", "--nonsense"]])
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


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


def test_probe_exit_codes(capsys, tmp_path):
    assert main(["probe", "--json", str(tmp_path / "p.json")]) == EXIT_OK
    assert (tmp_path / "p.json").exists()
    assert main(["probe", "--require-gpu"]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("detpipe: ") for line in err)
    assert "no GPU" in err[0] and "fix:" in err[0]


def test_data_build_on_missing_folder_fails_in_one_line(tmp_path, capsys):
    code = main(["data", "build", "--format", "voc", "--images", str(tmp_path), "--annotations",
                 str(tmp_path / "nope"), "--output", str(tmp_path / "out")])
    assert code == EXIT_FAILED
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_demo_data_and_data_build_commands(tmp_path, capsys):
    assert main(["demo-data", str(tmp_path / "d"), "--train", "6", "--val", "2", "--seed", "2"]) == EXIT_OK
    assert main(["data", "build", "--format", "voc", "--images", str(tmp_path / "d" / "images"),
                 "--annotations", str(tmp_path / "d" / "annotations"), "--output", str(tmp_path / "o"),
                 "--val-fraction", "0.3"]) == EXIT_OK
    assert "8 records in" in capsys.readouterr().out
