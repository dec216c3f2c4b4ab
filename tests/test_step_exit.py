"""A step's process leaves without the interpreter's teardown once its executor output is written,
with the status Python would have given it (pipeline/step_exit.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.step_exit import output_file

# A stand-in for kfp's executor_main: the step's start, its work (`before`), the output file as the
# executor writes it last, then `after`. An exit hook registered before the step's (a library's)
# runs after it in Python's order: it prints only when the teardown was not skipped.
STEP = textwrap.dedent("""
    import atexit, sys
    atexit.register(lambda: print("library teardown ran", flush=True))
    from pipeline.step_exit import start_step
    start_step()
    {before}
    {write}
    {after}
    """)


def _run_step(tmp_path, before: str = "pass", write_output: bool = True, after: str = "pass"):
    out = tmp_path / "executor_output.json"
    write = f"open({str(out)!r}, 'w').write('{{}}')" if write_output else "pass"
    code = STEP.format(before=before, write=write, after=after)
    return subprocess.run([sys.executable, "-c", code, "--executor_input",
                           json.dumps({"outputs": {"outputFile": str(out)}})], capture_output=True, text=True,
                          timeout=60)


def test_a_finished_step_skips_the_teardown_with_status_0(tmp_path):
    done = _run_step(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "library teardown ran" not in done.stdout


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_failed_step_ends_with_1_and_its_traceback(tmp_path, where):
    done = _run_step(tmp_path, **{where: "raise ValueError('bad data')"})
    assert done.returncode == 1
    assert "ValueError: bad data" in done.stderr


def test_a_step_that_exits_before_its_output_ends_as_python_ends_it(tmp_path):
    done = _run_step(tmp_path, before="raise SystemExit(3)")
    assert done.returncode == 3
    assert "library teardown ran" in done.stdout  # the hook stayed out of the way


def test_an_output_file_left_by_an_earlier_attempt_does_not_count(tmp_path):
    stale = tmp_path / "executor_output.json"
    stale.write_text("{}")
    os.utime(stale, (1_000_000, 1_000_000))
    done = _run_step(tmp_path, before="raise SystemExit(4)", write_output=False)
    assert done.returncode == 4 and "library teardown ran" in done.stdout


def test_the_output_file_comes_from_the_executor_input():
    given = json.dumps({"outputs": {"outputFile": "/tmp/x/executor_output.json"}})
    assert output_file(["main.py", "--executor_input", given]) == "/tmp/x/executor_output.json"
    assert output_file(["main.py", f"--executor_input={given}"]) == "/tmp/x/executor_output.json"
    assert output_file(["main.py", "--executor_input", "not json"]) is None
    assert output_file(["main.py", "--executor_input", json.dumps({"outputs": {}})]) is None
