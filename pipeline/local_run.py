"""Run the whole DAG with the KFP local runner and summarise what it produced."""

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from kfp import local

from beam.contract.files import read_manifest
from components.detector.artifacts import TrainConfigFile
from components.evaluate.metrics_file import EvalMetrics
from components.model_registry.decision import DecisionRecord, comparison_line
from components.tune.search import WORK_DIR
from pipeline.console import StepDisplay, StepRouter, error_lines, read_outputs
from pipeline.dag import make_pipeline

logger = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_dir: Path
    records_in: int
    written: int
    rejected: int
    boxes_dropped: int  # boxes that could not be trusted, dropped from images that were written
    probe_verdict: str
    images_per_second: float
    started: str  # where training started: "from v1 (the champion): ..." or "from scratch: ..."
    metrics: dict
    per_class: list[tuple[str, float, float]]  # (class, AP@[.5:.95], AP50), weakest AP50 first
    cap_warning: str | None  # the detection cap decided most val images
    prediction: str | None  # what predicting the val photos cost (metrics_file.PredictionCost.line)
    saved_model: Path
    version: str
    comparison: str  # the champion comparison and the decision, one line
    report: Path | None  # run_report.html at the top of the run folder
    unchanged: str = ""  # fingerprint_source's line when the files are the champion's ("" when not)
    review: str | None = None  # the label review's summary line ("3 likely label problems: ...")
    review_page: Path | None = None  # label_review.html at the top of the run folder
    files: str = ""  # the export step's line on converted files ("" when none were asked for)
    length: str = ""  # how long training ran and why it stopped (TrainResult.length_line)
    short: str = ""  # the budget ended training while its held-out curve still rose (TrainResult.short)

    def lines(self) -> list[str]:
        return [
            *([self.unchanged] if self.unchanged else []),
            f"records: {self.records_in} in, {self.written} written, {self.rejected} rejected"
            + (f"; {self.boxes_dropped} bad box(es) dropped from written images" if self.boxes_dropped else ""),
            f"probe: {self.probe_verdict}",
            f"training: {self.images_per_second:.1f} images/s, started {self.started}"
            + (f"; {self.length}" if self.length else ""),
            *([f"warning: training {self.short}"] if self.short else []),
            f"evaluation: mAP@[.5:.95] {self.metrics['mAP']:.3f}, AP50 {self.metrics['AP50']:.3f}, "
            f"AP75 {self.metrics['AP75']:.3f}" + (f"; prediction: {self.prediction}" if self.prediction else ""),
            "per class (AP@[.5:.95] / AP50): " + ", ".join(
                f"{name} {ap:.3f} / {ap50:.3f}" for name, ap, ap50 in self.per_class[:PER_CLASS_SHOWN])
            + (f", ... ({len(self.per_class) - PER_CLASS_SHOWN} more in the report)"
               if len(self.per_class) > PER_CLASS_SHOWN else ""),
            *([f"warning: {self.cap_warning}"] if self.cap_warning else []),
            *([f"label review: {self.review}" + (f", see {self.review_page}" if self.review_page else "")]
              if self.review else []),
            f"model to serve: detpipe serve --model {self.saved_model}",
            *([f"converted files: {self.files} (export_report.md beside the model)"] if self.files else []),
            f"artifacts: {self.run_dir}",
            f"report: {self.report or 'not written'}",
            f"registry: {self.version}: {self.comparison}",
        ]


# Classes named on the summary's per-class line (the weakest first); the report has them all.
PER_CLASS_SHOWN = 8


def _task_dir(run_dir: Path, task: str) -> Path:
    path = run_dir / task
    if not path.is_dir():
        raise FileNotFoundError(f"no outputs of task {task!r} under {run_dir}")
    return path


def summarise(run_dir: Path) -> RunSummary:
    """Read the artifacts of one local run folder."""
    manifest = read_manifest(str(_task_dir(run_dir, "validate-and-convert") / "dataset"))
    probe = json.loads((_task_dir(run_dir, "probe") / "probe_json").read_text())
    train_config = TrainConfigFile.read(_task_dir(run_dir, "train") / "model")
    metrics = EvalMetrics.read(_task_dir(run_dir, "evaluate") / "metrics_json")
    decision = DecisionRecord.read(_task_dir(run_dir, "evaluate") / "decision")
    return RunSummary(
        run_dir=run_dir, records_in=manifest.records_in, written=manifest.written_total,
        rejected=manifest.rejected, boxes_dropped=sum(c.rejected for c in manifest.boxes.values()),
        probe_verdict=probe["verdict"],
        images_per_second=train_config.images_per_second, started=train_config.warm_start["line"],
        metrics=metrics.metrics,
        per_class=sorted(((name, ap, metrics.per_class_ap50.get(name, -1.0)) for name, ap in metrics.per_class.items()),
                         key=lambda row: (row[2], row[0])),
        cap_warning=metrics.cap.warning(metrics.num_images) if metrics.cap else None,
        prediction=metrics.prediction.line() if metrics.prediction else None,
        saved_model=_task_dir(run_dir, "export") / "saved_model",
        version=_register_output(run_dir, "version"), comparison=comparison_line(decision),
        report=_top_level_report(run_dir), unchanged=_step_output(run_dir, "fingerprint-source", "unchanged"), review=_review_summary(run_dir), review_page=_top_level_review(run_dir),
        files=_step_output(run_dir, "export", "formats"), length=_step_output(run_dir, "train", "length"),
        short=train_config.result.get("short", ""),
    )


def _top_level_report(run_dir: Path) -> Path | None:
    """The report step's page, copied to RUN/run_report.html where people look first."""
    from components.report.run_report import REPORT_FILE

    source = run_dir / "report" / "run_report"
    if not source.is_file():
        return None
    return Path(shutil.copyfile(source, run_dir / REPORT_FILE))


def _step_output(run_dir: Path, task: str, name: str, default=""):
    """An output parameter of a step (`default` when it wrote none)."""
    return read_outputs(run_dir, task).get("parameterValues", {}).get(name, default)


def _review_summary(run_dir: Path) -> str | None:
    """The review step's summary line (None when it did not run)."""
    if not (run_dir / "review").is_dir():
        return None
    return _step_output(run_dir, "review", "Output", None)


def _top_level_review(run_dir: Path) -> Path | None:
    """The review step's page, copied to RUN/label_review.html beside the run report."""
    from components.review.review_page import PAGE_FILE

    source = run_dir / "review" / "review_page"
    if not source.is_file():
        return None
    return Path(shutil.copyfile(source, run_dir / PAGE_FILE))


def _register_output(run_dir: Path, name: str) -> str:
    """An output parameter of the register step ("?" when it wrote none)."""
    _task_dir(run_dir, "register")  # the step ran
    return _step_output(run_dir, "register", name, "?")


class StepFailed(RuntimeError):
    """A step of a local run failed; the message: what went wrong and where its log is."""

    def __init__(self, task: str, lines: list[str], log: Path):
        self.task, self.lines, self.log = task, lines, log
        super().__init__("\n".join([f"step {task} failed:", *("  " + line for line in lines),
                                    f"full log: {log}"]))


def run_local(params: dict, pipeline_root: Path, quiet: bool = False, console=None) -> RunSummary:
    """Run the DAG with `SubprocessRunner(use_venv=False)`: the venv already holds the image's
    environment, so nothing is installed at run time. Each step's output goes to
    RUN/logs/<step>.log; on the console, `quiet` shows one live line per step
    (pipeline/console.py), otherwise everything."""
    pipeline_root = Path(pipeline_root).resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    Path(params["registry"]).mkdir(parents=True, exist_ok=True)  # may live under the root: not a run folder
    (pipeline_root / WORK_DIR).mkdir(exist_ok=True)  # the tune step's searches, kept between runs: nor is this
    logs = pipeline_root / f".logs-{os.getpid()}"
    before = set(pipeline_root.iterdir()) | {logs}

    def run_dir() -> Path | None:
        new = sorted(set(pipeline_root.iterdir()) - before)
        return new[0] if len(new) == 1 else None

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    with warnings.catch_warnings(), steps_temporary_folder():
        # kfp warns for any image without "python" in its name; the local venv is the image's env.
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        _run_routed(params, logs, run_dir, console, quiet)
    found = run_dir()
    if found is None:
        raise RuntimeError(f"expected one new run folder under {pipeline_root}")
    return summarise(found)


@contextlib.contextmanager
def steps_temporary_folder():
    """The steps' processes' TMPDIR: a folder of this run's, removed after it. KFP's command
    for a lightweight component writes the step's program into a `mktemp -d` folder that it
    never removes: ~10 folders left in /tmp by every local run."""
    folder = tempfile.mkdtemp(prefix="detpipe-run-")
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _run_routed(params: dict, logs: Path, run_dir, console, quiet: bool) -> None:
    """Every line of the run into the logs of its step; on the console either one live line
    per step (`quiet`) or everything as it comes."""
    import sys

    display = StepDisplay(console) if quiet else StepDisplay.silent()
    router = StepRouter(logs, display, outputs_of=lambda task: read_outputs(run_dir(), task),
                        echo=None if quiet else sys.stdout)
    try:
        with display, contextlib.redirect_stdout(router), contextlib.redirect_stderr(router):
            make_pipeline(local=True)(**params)
    except RuntimeError as err:
        if router.failed is None:
            raise
        router.close_logs()
        where = _move_logs(logs, run_dir())
        raise StepFailed(router.failed, error_lines(where / f"{router.failed}.log") or [str(err)],
                         where / f"{router.failed}.log") from None
    finally:
        router.close_logs()
    _move_logs(logs, run_dir())


def _move_logs(logs: Path, run_dir: Path | None) -> Path:
    """RUN/logs, once the run folder exists (the logs start before it does)."""
    if run_dir is None or not logs.is_dir():
        return logs
    target = run_dir / "logs"
    target.mkdir(exist_ok=True)
    for path in logs.iterdir():
        with open(target / path.name, "a") as out:
            out.write(path.read_text(errors="replace"))
        path.unlink()
    logs.rmdir()
    return target
