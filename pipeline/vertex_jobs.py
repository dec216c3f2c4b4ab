"""Vertex AI Pipelines: submit a run, and manage its schedules.

Thin over `google.cloud.aiplatform`: these functions build the `PipelineJob` and call
the client; they add no retries or state of their own. The template is a compiled
local YAML (`detpipe compile`) or an Artifact Registry template URI
(`https://REGION-kfp.pkg.dev/PROJECT/REPO/detpipe/TAG`).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field

from components.cloud.labels import APP_LABELS
from components.cloud.resources import CloudSettings

logger = logging.getLogger(__name__)

MAX_NOTIFY = 3  # recipients of a run's email (GCPC's VertexNotificationEmailOp, compile --notify)
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_CRON = re.compile(r"^(TZ=[\w/+-]+ )?(\S+ ){4}\S+$")
# On every run detpipe starts (and so on a schedule's create request): the release it runs,
# the first RELEASE_CHARS hex digits of its compiled YAML's sha256 (what `detpipe compile`
# prints, and Artifact Registry's version name, sha256:HEX).
RELEASE_LABEL = "detpipe_release"
RELEASE_CHARS = 16
# ListSchedules filters on display_name, state, request (existence), create_time, start_time,
# end_time and next_run_time only (aiplatform_v1 ListSchedulesRequest.filter): a Schedule has no
# labels. So the service lists the pipeline schedules, and detpipe's are those whose create
# request's run carries APP_LABELS.
SCHEDULES_FILTER = "create_pipeline_job_request:*"
_AR_TEMPLATE = re.compile(r"^(https://[a-z0-9-]+-kfp\.pkg\.dev/[^/]+/[^/]+)/([^/]+)/([^/]+)$")


@dataclass(frozen=True)
class VertexTarget:
    project: str
    region: str
    pipeline_root: str | None = None  # gs://bucket/path where runs write artifacts; needed to start runs
    service_account: str | None = None
    cloud: CloudSettings = field(default_factory=CloudSettings)  # labels, key and network of what is created
    credentials: object | None = None  # google.auth credentials; None: application default


@dataclass(frozen=True)
class Release:
    """The compiled pipeline a run or schedule runs: its YAML's sha256, and where it came from."""

    sha256: str
    template: str

    @property
    def label(self) -> str:
        return self.sha256[:RELEASE_CHARS]

    def line(self) -> str:
        """What `schedule create` and `update` print.

        >>> Release("ab" * 32, "detpipe.yaml").line()
        'release abababababababab (sha256 of detpipe.yaml)'
        """
        return f"release {self.label} (sha256 of {self.template})"


def release_of(template: str, auth=None) -> Release:
    """The release `template` names: a local YAML's sha256; an Artifact Registry URI's version
    (`.../detpipe/sha256:HEX`), or its tag's version now (`.../detpipe/latest`), asked of the
    registry (kfp's RegistryClient)."""
    found = _AR_TEMPLATE.match(template)
    if not found:
        with open(template, "rb") as handle:
            return Release(hashlib.sha256(handle.read()).hexdigest(), template)
    host, package, version = found.groups()
    if not version.startswith("sha256:"):
        from kfp.registry import RegistryClient

        if auth is None:
            import google.auth

            auth, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        version = RegistryClient(host=host, auth=auth).get_tag(package, version)["version"].rsplit("/", 1)[-1]
    return Release(version.removeprefix("sha256:"), template)


def validate_cron(cron: str) -> str:
    """Five cron fields, optionally prefixed with `TZ=Area/City `."""
    if not _CRON.match(cron.strip()):
        raise ValueError(f"cron must be five fields with an optional TZ= prefix, e.g. 'TZ=Europe/Berlin 0 3 * * 1'; "
                         f"got {cron!r}")
    return cron.strip()


def build_job(target: VertexTarget, template: str, params: dict[str, object], display_name: str = "detpipe",
              enable_caching: bool | None = None, release: Release | None = None):
    """The `aiplatform.PipelineJob` for one run (not yet submitted): labelled with the user's
    labels, detpipe's and the release it runs, encrypted with the key when one is set."""
    from google.cloud import aiplatform

    if not (target.pipeline_root or "").startswith("gs://"):
        raise ValueError(f"--pipeline-root must be a gs:// URI, got {target.pipeline_root!r}")
    release = release or release_of(template, target.credentials)
    return aiplatform.PipelineJob(
        display_name=display_name, template_path=template, pipeline_root=target.pipeline_root,
        parameter_values=params, enable_caching=enable_caching,
        labels=target.cloud.resource_labels({RELEASE_LABEL: release.label}, environ={}),
        encryption_spec_key_name=target.cloud.kms_key or None,
        project=target.project, location=target.region, credentials=target.credentials,
    )


def submit(target: VertexTarget, template: str, params: dict[str, object], display_name: str = "detpipe",
           enable_caching: bool | None = None, experiment: str = "") -> str:
    """Submit one run, a run of `experiment` (Vertex AI Experiments; created when missing)
    unless it is empty; returns the console URL of the run."""
    job = build_job(target, template, params, display_name, enable_caching)
    job.submit(service_account=target.service_account, network=target.cloud.network or None,
               experiment=experiment or None)
    return job._dashboard_uri()


def create_schedule(target: VertexTarget, template: str, params: dict[str, object], cron: str,
                    display_name: str = "detpipe-schedule", max_concurrent_runs: int = 1,
                    max_runs: int | None = None, release: Release | None = None) -> str:
    """Create a schedule that starts a run of `template` on `cron`; returns the schedule's
    resource name. The schedule keeps a copy of the template's spec: it runs this release
    until `update_schedule` moves it."""
    job = build_job(target, template, params, display_name, release=release)
    schedule = job.create_schedule(cron=validate_cron(cron), display_name=display_name,
                                   max_concurrent_run_count=max_concurrent_runs, max_run_count=max_runs,
                                   service_account=target.service_account, network=target.cloud.network or None)
    return schedule.resource_name


def _time(stamp) -> str:
    """A schedule's timestamp as ISO 8601 (UTC), or '-' when unset."""
    return stamp.isoformat(timespec="minutes") if stamp and stamp.timestamp() > 0 else "-"


def schedule_row(schedule) -> dict[str, str] | None:
    """One listed schedule (the service's Schedule message) as `schedule list` shows it, or
    None when it is not detpipe's (its run lacks APP_LABELS)."""
    job = schedule.create_pipeline_job_request.pipeline_job
    labels = dict(job.labels)
    if any(labels.get(k) != v for k, v in APP_LABELS.items()):
        return None
    return {"name": schedule.name, "display_name": schedule.display_name, "state": schedule.state.name,
            "cron": schedule.cron, "next_run": _time(schedule.next_run_time),
            "release": labels.get(RELEASE_LABEL, "unknown"), "template": job.template_uri or "(a local YAML)",
            "runs": str(schedule.started_run_count)}


def list_schedules(target: VertexTarget) -> list[dict[str, str]]:
    """detpipe's schedules in the target's project and region, each with the release it runs."""
    from google.cloud import aiplatform

    schedules = aiplatform.PipelineJobSchedule.list(
        filter=SCHEDULES_FILTER, project=target.project, location=target.region, credentials=target.credentials)
    return [row for row in (schedule_row(s.gca_resource) for s in schedules) if row]


def _get_schedule(target: VertexTarget, schedule: str):
    from google.cloud import aiplatform

    return aiplatform.PipelineJobSchedule.get(schedule_id=schedule, project=target.project,
                                              location=target.region, credentials=target.credentials)


def change_schedule(target: VertexTarget, schedule: str, action: str) -> None:
    """`pause`, `resume` or `delete` one schedule (its ID or full resource name)."""
    if action not in ("pause", "resume", "delete"):
        raise ValueError(f"unknown schedule action {action!r}")
    getattr(_get_schedule(target, schedule), action)()


@dataclass(frozen=True)
class MovedSchedule:
    old: str
    new: str
    old_release: str
    release: Release


def update_schedule(target: VertexTarget, schedule: str, template: str) -> MovedSchedule:
    """Move a schedule to another release: the API cannot change a schedule's pipeline (its
    UpdateSchedule takes the timing and counts; aiplatform's `update` offers nothing else), so
    a new schedule is created with the old one's cron, display name, parameters, pipeline root,
    service account, network, key, user labels and remaining runs, and then the old one is
    deleted (a failed create leaves it running as it was)."""
    from google.protobuf import json_format

    old = _get_schedule(target, schedule)
    found = old.gca_resource
    job = found.create_pipeline_job_request.pipeline_job
    params = json_format.MessageToDict(job.runtime_config._pb).get("parameterValues", {})
    own = {**APP_LABELS, RELEASE_LABEL: ""}
    user = {k: v for k, v in dict(job.labels).items() if k not in own}
    moved = VertexTarget(project=target.project, region=target.region,
                         pipeline_root=job.runtime_config.gcs_output_directory,
                         service_account=job.service_account or None,
                         cloud=CloudSettings(user, job.encryption_spec.kms_key_name, job.network),
                         credentials=target.credentials)
    remaining = found.max_run_count - found.started_run_count if found.max_run_count else None
    if remaining is not None and remaining <= 0:
        raise ValueError(f"schedule {found.name} has run all {found.max_run_count} of its runs: nothing to move")
    release = release_of(template, target.credentials)
    name = create_schedule(moved, template, params, found.cron, display_name=found.display_name,
                           max_concurrent_runs=found.max_concurrent_run_count or 1, max_runs=remaining,
                           release=release)
    old.delete()
    return MovedSchedule(found.name, name, dict(job.labels).get(RELEASE_LABEL, "unknown"), release)
