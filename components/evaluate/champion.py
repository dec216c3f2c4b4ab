"""Champion against challenger on the same val images.

The champion is re-scored here, through its exported SavedModel (what is being served),
on the current val split, so both scores come from the same images: a score recorded
when the champion was trained was measured on other data and compares nothing. Classes
are matched by name, so a champion with a different label map is compared on the classes
both know (and the decision says which those are).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from beam.contract.data_text import markdown_text
from components.detector.artifacts import TrainConfigFile
from components.detector.records import read_box_sample
from components.evaluate.baseline import Baseline, box_prior_baseline
from components.evaluate.bootstrap import match_table, paired_bootstrap
from components.detector.coco_metrics import ImageDetections, ImageTruth
from components.evaluate.evaluator import REPORT_FILE, EvalResult, evaluate_detector
from components.export.export_files import LABEL_MAP_FILE
from components.model_registry.decision import (CONFIDENCE_LEVEL, DECISION_FILE, DecisionRecord, PromotionRule, Verdict,
                                          comparison_line, decide, readable)
from components.model_registry.checksums import verify_folder
from components.model_registry.registry import DEFAULT_MODEL_NAME, SAVED_MODEL_DIR, Registry

logger = logging.getLogger(__name__)

RESAMPLES = 1000
# The box-prior baseline learns its boxes from this many train records (the first, in shard order).
BASELINE_RECORDS = 5000


def saved_model_detections(saved_model_dir: str, images: list[bytes], label_map: dict[str, int],
                           batch_size: int = 16) -> list[ImageDetections]:
    """Every detection (score threshold 0, as COCO evaluation wants) of an exported model,
    with its class names mapped to `label_map`'s ids; classes `label_map` lacks are dropped.
    Image ids are 1..N in the order of `images`."""
    from components.export.predictor import Predictor

    predictor = Predictor.load(saved_model_dir)
    out = []
    for start in range(0, len(images), batch_size):
        for offset, p in enumerate(predictor.predict(images[start:start + batch_size], score_threshold=0.0)):
            rows = [(tuple(b), s, label_map[n]) for b, s, n in zip(p["detection_boxes"], p["detection_scores"],
                                                                   p["detection_class_names"]) if n in label_map]
            out.append(ImageDetections(start + offset + 1, [r[0] for r in rows], [r[1] for r in rows],
                                       [r[2] for r in rows]))
    return out


def compare_and_decide(truths: list[ImageTruth], challenger: list[ImageDetections], label_map: dict[str, int],
                       challenger_map: float, rule: PromotionRule, champion: dict | None = None,
                       val_fingerprint: str = "", seed: int = 0, resamples: int = RESAMPLES,
                       baseline: Baseline | None = None) -> DecisionRecord:
    """The decision (decision.json). `champion`: {"version", "detections" (on the same
    images, ids from `label_map`), "label_map"} or None when there is none yet. With
    `baseline` (the pipeline always has one), the challenger must beat it either way."""
    floor = baseline.metrics["mAP"] if baseline else None
    base = {"rule": {**rule.to_dict(), "resamples": resamples, "seed": seed, "level": 0.95},
            "val": {"images": len(truths), "fingerprint": val_fingerprint},
            "baseline": baseline.to_dict() if baseline else None}
    if champion is None:
        return DecisionRecord(**base, challenger={"mAP": challenger_map}, champion=None,
                              **decide(rule, challenger_map, None, floor).as_fields())
    shared = sorted(set(label_map) & set(champion["label_map"]))
    classes = {"shared": shared, "challenger_only": sorted(set(label_map) - set(champion["label_map"])),
               "champion_only": sorted(set(champion["label_map"]) - set(label_map))}
    if not shared:
        verdict = Verdict(False, f"no class in common with champion {champion['version']}: nothing to compare; "
                                 "promote by hand (detpipe registry promote) if the new classes are intended")
        return DecisionRecord(**base, challenger={"mAP": challenger_map}, champion={"version": champion["version"]},
                              classes=classes, **verdict.as_fields())
    names = {label_map[name]: name for name in shared}
    result = paired_bootstrap(match_table(truths, challenger, names), match_table(truths, champion["detections"], names),
                              resamples=resamples, seed=seed)
    a, b = result.challenger, result.champion
    delta = {
        "mAP": result.delta_map.to_dict(), "AP50": result.delta_ap50.to_dict(),
        "per_class": {names[k]: (round(float(a.per_class[0][i] - b.per_class[0][i]), 6)
                                 if a.per_class[0][i] > -1 and b.per_class[0][i] > -1 else None)
                      for i, k in enumerate(sorted(names))},
    }
    return DecisionRecord(
        **base, challenger={"mAP": challenger_map, "mAP_shared": float(a.map[0]), "AP50_shared": float(a.ap50[0])},
        champion={"version": champion["version"], "mAP_shared": float(b.map[0]), "AP50_shared": float(b.ap50[0])},
        classes=classes, delta=delta, **decide(rule, challenger_map, result.delta_map, floor).as_fields())


def evaluate_against_champion(model_dir: str, data_dir: str, output_dir: str, rule: PromotionRule,
                              registry: str = "", model_name: str = DEFAULT_MODEL_NAME, champion: str = "",
                              seed: int = 0, resamples: int = RESAMPLES) -> tuple[EvalResult, DecisionRecord]:
    """Evaluate the challenger (metrics.json, eval_report.md), re-score `champion` (a
    version of the registry; "" for none) on the same val images, and decide
    (decision.json, and a section of the report)."""
    result = evaluate_detector(model_dir, data_dir, output_dir, min_map=rule.min_map, raise_on_gate=False)
    images, val_fingerprint = result.images, result.val_fingerprint
    if len(images) != len(result.truths):
        raise RuntimeError(f"read {len(images)} val images for the champion but evaluated {len(result.truths)}")
    scored = None
    if champion:
        with tempfile.TemporaryDirectory() as tmp:
            Registry.open(registry, model_name).fetch(champion, SAVED_MODEL_DIR, tmp)
            verify_folder(tmp)  # the champion compared is the one registered
            with open(os.path.join(tmp, LABEL_MAP_FILE)) as handle:
                champion_labels = json.load(handle)
            logger.info("re-scoring champion %s on %d val images", champion, len(images))
            scored = {"version": champion, "label_map": champion_labels,
                      "detections": saved_model_detections(tmp, images, result.label_map)}
    train = read_box_sample(data_dir, records=BASELINE_RECORDS)
    baseline = box_prior_baseline(result.truths, {v: k for k, v in result.label_map.items()}, train.boxes,
                                  train.labels, seed=seed)
    record = compare_and_decide(result.truths, result.detections, result.label_map, result.metrics["mAP"], rule,
                                scored, val_fingerprint=val_fingerprint, seed=seed, resamples=resamples,
                                baseline=baseline)
    record = replace(record, warm_start=TrainConfigFile.read(model_dir).warm_start)
    out = Path(output_dir)
    record.write(out / DECISION_FILE)
    with open(out / REPORT_FILE, "a") as handle:
        handle.write(decision_markdown(record))
    logger.info("promotion: %s", comparison_line(record))
    return result, record


def decision_markdown(record: DecisionRecord) -> str:
    """The report's section on the champion comparison."""
    lines = ["", "## Champion comparison", "", comparison_line(record) + ".", ""]
    if record.warm_start:
        lines += [f"The challenger started {record.warm_start['line']}.", ""]
    if record.baseline:
        lines += [record.floor_line(), ""]
    if record.delta:
        d = record.delta
        lines += [f"| | champion | challenger | Δ ({CONFIDENCE_LEVEL:.0%} CI) |", "|---|---|---|---|"]
        for key, name in (("mAP", "mAP@[.5:.95]"), ("AP50", "AP50")):
            theirs, mine = readable(record.champion[key + "_shared"], record.challenger[key + "_shared"])
            lines.append(f"| {name} | {theirs} | {mine} | {record.interval(key).replace(f'{CONFIDENCE_LEVEL:.0%} CI ', '')} |")
        lines += ["", "| class | ΔAP@[.5:.95] |", "|---|---|"]
        lines += [f"| {markdown_text(name)} | {'n/a' if v is None else f'{v:+.3f}'} |" for name, v in d["per_class"].items()]
        classes = record.classes
        if classes["challenger_only"] or classes["champion_only"]:
            lines += ["", f"Compared on the shared classes only; new: {', '.join(map(markdown_text, classes['challenger_only'])) or 'none'}"
                          f"; no longer present: {', '.join(map(markdown_text, classes['champion_only'])) or 'none'}."]
        rule = record.rule
        lines += ["", f"Rule: promote_if={rule['promote_if']}, max_regression={rule['max_regression']}, "
                      f"min_map={rule['min_map']}; paired bootstrap over val images, {rule['resamples']} "
                      f"resamples, seed {rule['seed']}. Val set fingerprint {record.val['fingerprint'][:16]}."]
    return "\n".join(lines) + "\n"
