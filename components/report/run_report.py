"""`run_report.html`: one self-contained page about a run (pictures embedded; no scripts,
styles, fonts or pictures from anywhere else), so it reads the same offline, in the Vertex
AI console and in a mail attachment. Rendered with a jinja2 template.

Example:
    write_run_report(RunInputs(dataset_dir="out/dataset"), "report.html")
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import jinja2

from beam.contract.data_text import page_environment
from components.report import sections

REPORT_FILE = "run_report.html"


@dataclass(frozen=True)
class RunInputs:
    """Where a run's step outputs are (local paths); any may be missing."""
    dataset_dir: str | None = None
    probe_json: str | None = None
    tune_dir: str | None = None  # the tune step's folder (best_hparams.json, trials.jsonl, pictures)
    train_dir: str | None = None
    evaluation_dir: str | None = None
    review_dir: str | None = None  # the label review's folder (label_review.jsonl, label_review.html)
    export_dir: str | None = None  # the export step's folder (the SavedModel, converted files, export_formats.json)
    decision_json: str | None = None
    registered: dict | None = None  # the register step's version, status and champion
    title: str = "detpipe run"


def _environment() -> jinja2.Environment:
    return page_environment(jinja2.FileSystemLoader(Path(__file__).parent / "templates"), trim_blocks=True,
                            lstrip_blocks=True)


def _fmt(value) -> str:
    if isinstance(value, float):
        return "n/a" if value < 0 else f"{value:.3f}"
    return str(value)


def render_run_report(inputs: RunInputs) -> str:
    def maybe(function, path):
        return function(path) if path else None

    env = _environment()
    env.filters["fmt"] = _fmt
    return env.get_template("run_report.html.j2").render(
        title=inputs.title,
        created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        dataset=maybe(sections.dataset_section, inputs.dataset_dir),
        probe=maybe(sections.probe_section, inputs.probe_json),
        tuning=maybe(sections.tuning_section, inputs.tune_dir),
        training=maybe(sections.training_section, inputs.train_dir),
        evaluation=maybe(sections.evaluation_section, inputs.evaluation_dir),
        review=maybe(sections.review_section, inputs.review_dir),
        files=maybe(sections.files_section, inputs.export_dir),
        comparison=maybe(sections.comparison_section, inputs.decision_json),
        registered=inputs.registered,
    )


def write_run_report(inputs: RunInputs, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_run_report(inputs))
    return path


def write_dataset_page(dataset_dir: str, path: str | Path) -> Path:
    """The data step's page: the report's dataset section on its own."""
    return write_run_report(RunInputs(dataset_dir=dataset_dir, title="detpipe dataset"), path)
