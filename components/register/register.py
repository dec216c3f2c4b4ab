"""The register step: record this run's model as a version; move the champion only when
the evaluation blessed it (and the champion is still the one it was compared with)."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.cloud.resources import CloudSettings
from components.detector.artifacts import WARM_START_EXTRAS, WARM_START_FILES
from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics
from components.export.rescore import passed_files
from components.model_registry.decision import DECISION_FILE, DecisionRecord
from components.model_registry.registry import DATA_FILES, Registry
from components.model_registry.store import Conflict

logger = logging.getLogger(__name__)


@dataclass
class Registered:
    version: str
    status: str  # "blessed" (now the champion), "rejected", or "unchanged" (already a version)
    reason: str
    champion: str  # the champion after this step
    record: dict
    vertex_model: str = ""  # the Vertex AI Model Registry version uploaded, MODEL@ID
    vertex_endpoint: str = ""  # the Vertex AI endpoint it was deployed behind


def model_sha256(saved_model_dir: str) -> str:
    """sha256 over the SavedModel's files (names and bytes): the identity of a trained model."""
    digest = hashlib.sha256()
    root = Path(saved_model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def register_run(registry: Registry, saved_model_dir: str, data_dir: str, metrics_file: str, decision: DecisionRecord,
                 fingerprint: dict, run_id: str, train_dir: str = "") -> Registered:
    """Write the version (SavedModel, data files, metrics, decision, and from `train_dir`
    the trained weights a warm start continues), then `champion.json`.

    A model that is already a version (a scheduled run over unchanged data, where Vertex AI
    took every step from its cache) is not recorded again: the step names that version."""
    model_hash = model_sha256(saved_model_dir)
    for known in registry.versions():
        if known.get("model_sha256") == model_hash:
            logger.info("this model is already version %s: nothing new to register", known["version"])
            return Registered(known["version"], "unchanged", f"the same model as {known['version']} "
                              "(unchanged data: every step came from the cache)", registry.champion_version(),
                              known)
    compared_with = (decision.champion or {}).get("version")
    blessed, reason = decision.blessed, decision.reason
    current = registry.champion_version() or None
    if blessed and current != compared_with:
        blessed, reason = False, (f"the champion moved from {compared_with or 'none'} to {current} during this run; "
                                  "not promoted (the next run compares with the new champion)")
    name = registry.claim_version(run_id)
    metrics = EvalMetrics.read(metrics_file)
    status = "blessed" if blessed else "rejected"
    record = {
        "run_id": run_id, "status": status, "reason": reason,
        "model_sha256": model_hash,
        "compared_with": compared_with, "fingerprint": fingerprint,
        "val_fingerprint": decision.val["fingerprint"],
        "metrics": {k: metrics.metrics[k] for k in ("mAP", "AP50", "AP75")},
        "files": passed_files(saved_model_dir),  # converted files that passed their re-scoring, beside the SavedModel
    }
    with tempfile.TemporaryDirectory() as tmp:
        decision_file = os.path.join(tmp, DECISION_FILE)
        decision.with_outcome(blessed, reason, name).write(decision_file)
        files = {n: os.path.join(data_dir, n) for n in DATA_FILES if os.path.exists(os.path.join(data_dir, n))}
        files.update({METRICS_FILE: metrics_file, DECISION_FILE: decision_file})
        if train_dir:
            files.update({n: os.path.join(train_dir, n) for n in WARM_START_FILES})
            files.update({n: os.path.join(train_dir, n) for n in WARM_START_EXTRAS
                          if os.path.exists(os.path.join(train_dir, n))})
        record = registry.write_version(name, saved_model_dir, files, record)
    champion = current or ""
    if blessed:
        try:
            registry.set_champion(name, reason, by=f"pipeline run {run_id}", expected=current)
            champion = name
        except Conflict as err:  # lost a race with another writer after the check above
            logger.error("version %s not promoted: %s", name, err)
            return Registered(name, "rejected", str(err), registry.champion_version(), record)
    logger.info("registered %s as %s: %s", name, status, reason)
    return Registered(name, status, reason, champion, record)


def register_and_upload(registry_uri: str, model_name: str, saved_model_dir: str, data_dir: str, metrics_file: str,
                        decision: DecisionRecord, fingerprint: dict, run_id: str, train_dir: str = "",
                        vertex_model: str = "",
                        vertex_region: str = "", serving_image: str = "", endpoint=None,
                        cloud: CloudSettings = CloudSettings()) -> Registered:
    """`register_run`, then (with `vertex_model`) the Vertex AI Model Registry version and,
    when it is blessed and `endpoint` (a vertex_endpoint.EndpointSpec) is given, that
    version deployed behind the endpoint; the evaluation imported into the Model Registry for the
    version (vertex_evaluation.py); all with `cloud`'s labels (and the run's) and key."""
    from components.model_registry.vertex_model import ModelVersion, find_parent_model, resource_parts, upload_version

    done = register_run(Registry.open(registry_uri, model_name), saved_model_dir, data_dir, metrics_file,
                        decision, fingerprint, run_id, train_dir)
    if vertex_model and done.status != "unchanged":
        version = ModelVersion(
            display_name=vertex_model, artifact_uri=done.record["saved_model"], serving_image=serving_image,
            blessed=done.status == "blessed", run_id=run_id, data_fingerprint=fingerprint.get("sha256", ""),
            map=done.record["metrics"]["mAP"], registry_version=done.version, description=done.reason)
        parent = find_parent_model(vertex_model, project=None, location=vertex_region or None)
        model = upload_version(version, location=vertex_region or None, parent_model=parent, cloud=cloud)
        logger.info("Vertex AI model version %s (%s)", getattr(model, "version_id", "?"), model.resource_name)
        done.vertex_model = f"{model.resource_name}@{model.version_id}"
        from components.register.vertex_evaluation import import_evaluation
        from components.model_registry.vertex_model import model_api

        project, location = resource_parts(model.resource_name, "models", "model")
        evaluation = import_evaluation(done.vertex_model, EvalMetrics.read(metrics_file), f"detpipe {done.version}",
                                       model_api(location))
        logger.info("Vertex AI evaluation %s (the version's Evaluate tab)", evaluation)
        if endpoint is not None and done.status == "blessed":
            from components.model_registry.vertex_endpoint import deploy_to_endpoint

            done.vertex_endpoint = deploy_to_endpoint(done.vertex_model, endpoint, project, location,
                                                      registry_version=done.version, cloud=cloud).endpoint
    return done
