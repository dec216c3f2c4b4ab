"""Vertex AI Pipelines: submit a run, and manage its schedules.

Thin over `google.cloud.aiplatform`: these functions build the `PipelineJob` and call
the client; they add no retries or state of their own. The template is a compiled
local YAML (`detpipe compile`) or an Artifact Registry template URI
(`https://REGION-kfp.pkg.dev/PROJECT/REPO/detpipe/TAG`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

LABELS = {"app": "detpipe"}
MAX_NOTIFY = 3  # recipients of a run's email (GCPC's VertexNotificationEmailOp, compile --notify)
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_CRON = re.compile(r"^(TZ=[\w/+-]+ )?(\S+ ){4}\S+$")


@dataclass(frozen=True)
class VertexTarget:
    project: str
    region: str
    pipeline_root: str | None = None  # gs://bucket/path where runs write artifacts; needed to start runs
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=lambda: dict(LABELS))
    credentials: object | None = None  # google.auth credentials; None: application default


def validate_cron(cron: str) -> str:
    """Five cron fields, optionally prefixed with `TZ=Area/City `."""
    if not _CRON.match(cron.strip()):
        raise ValueError(f"cron must be five fields with an optional TZ= prefix, e.g. 'TZ=Europe/Berlin 0 3 * * 1'; "
                         f"got {cron!r}")
    return cron.strip()


def build_job(target: VertexTarget, template: str, params: dict[str, object], display_name: str = "detpipe",
              enable_caching: bool | None = None):
    """The `aiplatform.PipelineJob` for one run (not yet submitted)."""
    from google.cloud import aiplatform

    if not (target.pipeline_root or "").startswith("gs://"):
        raise ValueError(f"--pipeline-root must be a gs:// URI, got {target.pipeline_root!r}")
    return aiplatform.PipelineJob(
        display_name=display_name, template_path=template, pipeline_root=target.pipeline_root,
        parameter_values=params, enable_caching=enable_caching, labels=target.labels,
        project=target.project, location=target.region, credentials=target.credentials,
    )


def submit(target: VertexTarget, template: str, params: dict[str, object], display_name: str = "detpipe",
           enable_caching: bool | None = None, experiment: str = "") -> str:
    """Submit one run, a run of `experiment` (Vertex AI Experiments; created when missing)
    unless it is empty; returns the console URL of the run."""
    job = build_job(target, template, params, display_name, enable_caching)
    job.submit(service_account=target.service_account, experiment=experiment or None)
    return job._dashboard_uri()


def create_schedule(target: VertexTarget, template: str, params: dict[str, object], cron: str,
                    display_name: str = "detpipe-schedule", max_concurrent_runs: int = 1,
                    max_runs: int | None = None) -> str:
    """Create a schedule that starts a run on `cron`; returns the schedule's resource name."""
    job = build_job(target, template, params, display_name)
    schedule = job.create_schedule(cron=validate_cron(cron), display_name=display_name,
                                   max_concurrent_run_count=max_concurrent_runs, max_run_count=max_runs,
                                   service_account=target.service_account)
    return schedule.resource_name


def list_schedules(target: VertexTarget) -> list[dict[str, str]]:
    from google.cloud import aiplatform

    schedules = aiplatform.PipelineJobSchedule.list(
        filter='labels.app="detpipe"', project=target.project, location=target.region,
        credentials=target.credentials)
    return [{"name": s.resource_name, "display_name": s.display_name, "state": s.state.name,
             "cron": s.cron} for s in schedules]


def change_schedule(target: VertexTarget, schedule: str, action: str) -> None:
    """`pause`, `resume` or `delete` one schedule (its ID or full resource name)."""
    from google.cloud import aiplatform

    if action not in ("pause", "resume", "delete"):
        raise ValueError(f"unknown schedule action {action!r}")
    found = aiplatform.PipelineJobSchedule.get(schedule_id=schedule, project=target.project,
                                               location=target.region, credentials=target.credentials)
    getattr(found, action)()
