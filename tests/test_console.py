"""The quiet console of `detpipe run --local`: lines filed by step, progress, key figures,
and the lines that say why a step failed."""

import io

from rich.console import Console

from pipeline.console import StepDisplay, StepRouter, error_lines

KFP_OUTPUT = """\
16:14:00.749 - INFO - Executing task \x1b[96m'validate-and-convert'\x1b[0m
    [KFP Executor 2026-11-21 16:14:08,911 INFO]: checked 250 records on worker 4711 (300 in the job)
    beam chatter
16:14:10.001 - INFO - Task \x1b[96m'validate-and-convert'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m
16:14:10.101 - INFO - Executing task \x1b[96m'train'\x1b[0m
    Epoch 2/8
    [KFP Executor 2026-11-21 16:14:20,000 ERROR]: the update made the weights non-finite at step 7
    Traceback (most recent call last):
      File "x.py", line 1, in <module>
        raise RuntimeError("loss is nan at step 7")
    components.train.faults.NonFiniteLoss: loss is nan at step 7
16:14:21.000 - ERROR - Task \x1b[96m'train'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m
"""


def test_router_files_lines_by_step_and_reports_progress_and_figures(tmp_path):
    out = io.StringIO()
    display = StepDisplay(Console(file=out, force_terminal=False, width=40))  # narrower than a line: none is broken
    progress = []
    display.progress = lambda text, original=display.progress: (progress.append(text), original(text))
    outputs = {"validate-and-convert": {"parameterValues": {"written": 290, "rejected": 10}}}
    router = StepRouter(tmp_path / "logs", display, outputs_of=lambda task: outputs.get(task, {}))
    with display:
        for chunk in (KFP_OUTPUT[:50], KFP_OUTPUT[50:333], KFP_OUTPUT[333:]):  # arbitrary chunks
            router.write(chunk)
    router.close_logs()
    shown = out.getvalue().splitlines()
    assert shown[0].startswith("✓ validate-and-convert") and shown[0].endswith("290 written, 10 rejected")
    assert shown[1].startswith("✗ train") and shown[1].endswith("failed")
    assert "\x1b" not in out.getvalue()
    assert progress == ["a worker checked 250 of 300 records", "epoch 2/8"]
    assert "beam chatter" in (tmp_path / "logs" / "validate-and-convert.log").read_text()
    assert "Epoch 2/8" not in (tmp_path / "logs" / "validate-and-convert.log").read_text()
    assert router.failed == "train"
    assert error_lines(tmp_path / "logs" / "train.log") == [
        "the update made the weights non-finite at step 7", "NonFiniteLoss: loss is nan at step 7"]


def test_verbose_echo_has_no_colour_codes_in_a_file(tmp_path):
    echo = io.StringIO()
    router = StepRouter(tmp_path / "logs", StepDisplay.silent(), echo=echo)
    router.write(KFP_OUTPUT)
    router.close_logs()
    assert "Executing task 'validate-and-convert'" in echo.getvalue() and "\x1b" not in echo.getvalue()


def test_every_step_declares_the_figure_its_line_shows():
    """Each step of the DAG has its key figure declared next to it; the console only looks it up."""
    from pipeline.kfp_steps import KEY_FIGURES, Steps
    from pipeline.console import key_figure

    tasks = {f.replace("_", "-") for f in Steps.__dataclass_fields__}
    assert set(KEY_FIGURES) == tasks - {"report"}
    assert key_figure("train", {"parameterValues": {"images_per_second": 55.91, "started_from": ""}}) \
        == "55.9 images/s, from scratch"
    assert key_figure("train", {"parameterValues": {"images_per_second": 8.0, "started_from": "v1"}}) \
        == "8.0 images/s, warm start from v1"
    trained = {"images_per_second": 8.0, "started_from": "v1", "length": "12 epochs (96 steps), stopped: plateau: ..."}
    assert key_figure("train", {"parameterValues": trained}) == "8.0 images/s, 12 epochs: plateau, from v1"
    assert key_figure("register", {"parameterValues": {"version": "v2", "status": "rejected"}}) == "v2 rejected"
    line = "defaults (auto: no GPU)"
    assert key_figure("tune-hyperparameters", {"parameterValues": {"tuning_map": -1.0, "summary": line}}) == line
    assert key_figure("report", {}) == ""
    assert key_figure("review", {"parameterValues": {"Output": "3 likely label problems: 3 misplaced raccoon boxes"}}) \
        == "3 likely label problems"
    from components.fingerprint.fingerprint import unchanged_data_line

    same = unchanged_data_line("v1", {"sha256": "ab" * 32}, "ab" * 32)
    assert key_figure("fingerprint-source", {"parameterValues": {"champion": "v1", "unchanged": same}}) \
        == "champion v1; unchanged data (v1's files)"
    assert key_figure("fingerprint-source", {"parameterValues": {"champion": "v1", "unchanged": ""}}) == "champion v1"


def test_what_a_dataset_says_reaches_the_console_as_text(capsys):
    """A class named with a right-to-left override, a bell and a terminal title escape: every
    command's console lines show them written out; a terminal keeps colour sequences (ESC [),
    a pipe gets no ESC raw; closing the stream (absl's handler at exit) leaves the console open."""
    from pipeline.cli import main
    from pipeline.console import VisibleStream

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    hostile = "raccoon\u202e\x07\x1b]0;pwned"
    pipe, terminal = io.StringIO(), Terminal()
    for stream in (VisibleStream(pipe), VisibleStream(terminal)):
        stream.write(f"class {hostile}\n\tnext\r\n\x1b[92mSUCCESS\x1b[0m")
        stream.close()
        assert not stream.closed
    assert pipe.getvalue() == "class raccoon\\u202e\\x07\\x1b]0;pwned\n\tnext\r\n\\x1b[92mSUCCESS\\x1b[0m"
    assert terminal.getvalue() == "class raccoon\\u202e\\x07\\x1b]0;pwned\n\tnext\r\n\x1b[92mSUCCESS\x1b[0m"
    assert main(["registry", "show", hostile, "--registry", "/nonexistent-registry"]) != 0
    err = capsys.readouterr().err
    assert "raccoon\\u202e\\x07\\x1b]0;pwned" in err and "\u202e" not in err and "\x07" not in err
