"""A quiet, live console for `detpipe run --local`.

The KFP local runner prints everything (its own log lines, each task's executor JSON, and
every line the task's process writes) to `sys.stdout`. While the run lasts, `StepRouter`
stands in for `sys.stdout`: it splits that stream by task into `RUN/logs/<task>.log` and
tells a `StepDisplay` when a task starts, makes progress or ends. The display shows one
line per step (state, elapsed time, the step's key figure when it is done), live on a
terminal (rich), as plain lines otherwise (no ANSI codes in a redirected file).
"""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from beam.contract.data_text import visible

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CSI = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z])")  # a terminal's control sequence: colours, cursor moves
_START = re.compile(r"Executing task '([^']+)'")
_END = re.compile(r"Task '([^']+)' finished with status (\w+)")
# Progress the steps print (Keras' "Epoch 3/8", the data step's "checked 500 records on worker 81 (2304 in the job)"),
# and how the live line shows it.
_PROGRESS = ((re.compile(r"\bEpoch (\d+)/(\d+)"), "epoch {}/{}"),
             (re.compile(r"checked (\d+) records on worker \d+ \((\d+) in the job\)"),
              "a worker checked {} of {} records"))


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class VisibleStream:
    """A console stream (stdout, stderr) that writes what a dataset's text holds as text:
    control characters and bidi overrides become `\\xNN` / `\\uNNNN` (beam/contract/data_text.py),
    so a class name cannot retitle the terminal or reverse a line. New lines, tabs and carriage
    returns stay; on a terminal, so do the CSI sequences (ESC [ ... letter) with which rich and kfp
    colour their lines and rich's live display moves the cursor; any other ESC (a title's OSC)
    is written out, and a file or a pipe gets no ESC raw."""

    def __init__(self, stream):
        self._stream = stream
        self._tty = getattr(stream, "isatty", lambda: False)()

    def write(self, text: str) -> int:
        if self._tty:
            parts = _CSI.split(text)  # text, sequence, text, ...: the sequences kept as they are
            shown = "".join(part if i % 2 else visible(part, keep="\n\r\t") for i, part in enumerate(parts))
        else:
            shown = visible(text, keep="\n\r\t")
        self._stream.write(shown)
        return len(text)

    def close(self) -> None:  # a log handler closing its stream at exit (absl's) must not close the console
        self._stream.flush()

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, buffer...: the stream's own
        return getattr(self._stream, name)


def key_figure(task: str, outputs: dict) -> str:
    """What a finished step says in one phrase, from its output parameters: the figure the
    step declares next to itself (pipeline/kfp_steps.py KEY_FIGURES); "" for none."""
    from pipeline.kfp_steps import KEY_FIGURES

    figure = KEY_FIGURES.get(task)
    return figure(outputs.get("parameterValues", {})) if figure else ""


@dataclass
class Step:
    name: str
    started: float
    state: str = "running"
    ended: float | None = None
    progress: str = ""
    figure: str = ""

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class StepDisplay:
    """One line per step: live on a terminal, plain lines when printing to a file or pipe."""

    def __init__(self, console=None, show: bool = True):
        import sys

        from rich.console import Console

        # Bound to the real stdout now: during the run sys.stdout is the StepRouter.
        self.console = console or Console(file=sys.stdout, highlight=False)
        self.steps: list[Step] = []
        self._live = None
        self._show = show

    @classmethod
    def silent(cls) -> "StepDisplay":
        """Keeps track of the steps and prints nothing (the full output is shown instead)."""
        return cls(show=False)

    def __enter__(self):
        if self._show and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def _line(self, step: Step) -> str:
        mark = {"running": "…", "SUCCESS": "✓", "FAILURE": "✗"}.get(step.state, "?")
        detail = step.figure if step.state != "running" else step.progress
        # visible: a figure or progress can quote a dataset (a class name), ESC included
        return f"{mark} {step.name:<22} {step.elapsed():6.1f} s  {visible(detail)}".rstrip()

    def _render(self):
        from rich.text import Text

        return Text("\n".join(self._line(s) for s in self.steps) or "starting …")

    def _refresh(self, step: Step | None = None, final: bool = False) -> None:
        if self._live is not None:
            self._live.update(self._render())
        elif final and step is not None and self._show:
            self.console.print(self._line(step), markup=False, soft_wrap=True)  # a file or pipe: one line a step, unbroken

    def start(self, name: str) -> None:
        self.steps.append(Step(name, time.monotonic()))
        self._refresh()

    def progress(self, text: str) -> None:
        if self.steps and self.steps[-1].state == "running":
            self.steps[-1].progress = text
            self._refresh()

    def finish(self, name: str, state: str, figure: str = "") -> None:
        for step in reversed(self.steps):
            if step.name == name and step.state == "running":
                step.state, step.ended, step.figure = state, time.monotonic(), figure
                self._refresh(step, final=True)
                return


@dataclass
class StepRouter(io.TextIOBase):
    """A text stream that files each line under the task printing it."""

    log_dir: Path
    display: StepDisplay
    outputs_of: object = None  # callable(task) -> executor output dict, once the task ended
    echo: object = None  # a stream that also gets every line as it comes (--verbose)
    current: str = "pipeline"
    failed: str | None = None
    _buffer: str = ""
    _files: dict = field(default_factory=dict)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.echo is not None:  # kfp colours its lines: not in a file or a pipe
            self.echo.write(text if getattr(self.echo, "isatty", lambda: False)() else strip_ansi(text))
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(strip_ansi(line))
        return len(text)

    def flush(self) -> None:
        if self.echo is not None:
            self.echo.flush()
        for handle in self._files.values():
            handle.flush()

    def close_logs(self) -> None:
        if self._buffer:
            self._line(strip_ansi(self._buffer))
            self._buffer = ""
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def log_path(self, task: str) -> Path:
        return self.log_dir / f"{task}.log"

    def _log(self, task: str, line: str) -> None:
        if task not in self._files:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._files[task] = open(self.log_path(task), "a")
        self._files[task].write(line + "\n")

    def _line(self, line: str) -> None:
        started, ended = _START.search(line), _END.search(line)
        if started:
            self.current = started.group(1)
            self.display.start(self.current)
        self._log(self.current, line)
        if ended:
            task, state = ended.groups()
            if state != "SUCCESS":
                self.failed = task
            figure = key_figure(task, self.outputs_of(task) if self.outputs_of else {}) if state == "SUCCESS" \
                else "failed"
            self.display.finish(task, state, figure)
            return
        for pattern, shown in _PROGRESS:
            found = pattern.search(line)
            if found:
                self.display.progress(shown.format(*found.groups()))


_LOGGED_ERROR = re.compile(r"^\[KFP Executor [^\]]*\b(?:ERROR|CRITICAL)\]:\s*(.+)")
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?::\s*(.*))?$")


def _messages(lines: list[str]):
    """ERROR log lines, and the last line of each traceback (the exception, module path dropped)."""
    in_traceback = expect_code = False
    for raw in lines:
        line = raw.strip()
        logged = _LOGGED_ERROR.match(line)
        if logged:
            yield logged.group(1)
        elif line.startswith("Traceback (most recent call last)"):
            in_traceback, expect_code = True, False
        elif in_traceback:
            if line.startswith("File "):
                expect_code = True
            elif expect_code or not line or set(line) <= set("^~ "):
                expect_code = False
            else:
                raised = _RAISED.match(line)
                if raised:
                    yield f"{raised.group(1)}: {raised.group(2)}" if raised.group(2) else raised.group(1)
                    in_traceback = False


def error_lines(log: Path, count: int = 5) -> list[str]:
    """What a failed step's log says went wrong: its ERROR log lines and the exceptions it
    raised, the last `count` of them (each once)."""
    if not log.is_file():
        return []
    found: list[str] = []
    for text in _messages(log.read_text(errors="replace").splitlines()):
        if "finished with status" not in text:
            if text in found:
                found.remove(text)
            found.append(text)
    return found[-count:]


def read_outputs(run_dir: Path | None, task: str) -> dict:
    """A task's executor output (its output parameters, which kfp's local runner keeps in
    the task folder); {} before the run folder exists or the task has written it."""
    path = run_dir / task / "executor_output.json" if run_dir else None
    return json.loads(path.read_text()) if path and path.is_file() else {}
