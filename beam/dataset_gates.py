"""Dataset-level gates after the Beam job: TFDV schema validation per split, the reject
fraction, look-alike class names, and drift against a previous run's statistics. One line
per problem.
"""

from __future__ import annotations

import logging
import re

import tensorflow_data_validation as tfdv
from apache_beam.io.filesystems import FileSystems

from beam.contract import feature_keys as K
from beam.contract.files import write_text
from beam.contract.manifest import ANOMALIES_FILE, SCHEMA_FILE, STATS_HTML_FILE, stats_file_name
from beam.options import GateOptions
from beam.split import TRAIN, VAL
from beam.tfdv_checks import (OBJECT_KEYS, add_drift_checks, anomaly_lines, class_domain, find_anomalies,
                               statistics_html, task_schema)

logger = logging.getLogger(__name__)


def _new_classes(pinned, label_map: dict[str, int]) -> list[str]:
    """Classes the pinned schema does not list; the schema copy learns them, so TFDV does
    not report them a second time."""
    domain = class_domain(pinned)
    if domain is None:
        return []
    new = sorted(set(label_map) - set(domain.value))
    domain.value.extend(new)
    return new


def _new_class_problems(new: list[str], options: GateOptions) -> list[str]:
    """One problem naming the new classes, unless they are allowed."""
    source = options.pinned_by or options.schema_file
    if not new:
        return []
    if options.allow_new_classes:
        logger.warning("new class(es) %s not in %s: allowed", ", ".join(new), source)
        return []
    return [f"[vs {source}] {K.CLASS_TEXT} | new class | {', '.join(new)}: not among the classes of {source}; "
            "pass allow_new_classes (--allow-new-classes) to train on them"]


def look_alike_class_problems(class_names) -> list[str]:
    """One problem for each set of class names that differ only in case, spaces, "-" or "_"
    ("Car", "car", "car_"): most often one class labelled two ways, which trains as two
    classes that compete for the same objects.

    >>> look_alike_class_problems(["Car", "car", "traffic-light", "traffic light", "person"])[0].split(" | ")[:2]
    ['(classes)', 'look-alike class names']
    >>> look_alike_class_problems(["car", "cart"])
    []
    """
    groups: dict[str, list[str]] = {}
    for name in sorted(class_names):
        groups.setdefault(re.sub(r"[\s_-]+", " ", name).strip().casefold(), []).append(name)
    return [f"(classes) | look-alike class names | {' and '.join(repr(n) for n in names)} differ only in case, "
            "spaces, - or _: one class labelled two ways? Give them one name (or --allow-anomalies keeps them apart)"
            for names in groups.values() if len(names) > 1]


def normalised_coordinates_problems(first_pixel_boxes: int, boxes: int) -> list[str]:
    """The problem when most written boxes lie within the first pixel of their image: the
    annotations hold fractions of the image size (as YOLO and some exporters write), which
    VOC, COCO and CSV give in pixels. Such boxes pass every per-box check, and training
    would only refuse later, for anchors no box can match.

    >>> normalised_coordinates_problems(118, 120)[0].split(" | ")[:2]
    ['(boxes)', 'coordinates look normalised']
    >>> normalised_coordinates_problems(1, 120)
    []
    """
    if not boxes or first_pixel_boxes * 2 <= boxes:
        return []
    return [f"(boxes) | coordinates look normalised | {first_pixel_boxes} of {boxes} boxes lie within the first "
            "pixel of their image: the annotations give fractions of the image size, but VOC, COCO and CSV "
            "coordinates are pixels (multiply x by the width and y by the height)"]


def boxless_splits(written: dict[str, int], boxes: dict[str, int]) -> list[str]:
    """The splits that hold images, all of them negatives (no box written).

    >>> boxless_splits({"train": 5, "val": 2}, {"train": 9, "val": 0})
    ['val']
    >>> boxless_splits({"train": 5, "val": 0}, {"train": 9})
    []
    """
    return [split for split in (TRAIN, VAL) if written.get(split) and not boxes.get(split)]


def no_boxes_problems(written: dict[str, int], boxless: list[str]) -> list[str]:
    """The problem of each split in `boxless`: nothing to learn from in train, no mAP to measure
    on val.

    >>> no_boxes_problems({"train": 5, "val": 2}, ["val"])[0].split(" | ")[:2]
    ['(split val)', 'no boxes']
    """
    why = {TRAIN: "training has nothing to learn", VAL: "no mAP can be measured on it"}
    return [f"(split {split}) | no boxes | its {written[split]} image(s) hold no box (negatives, or every box "
            f"dropped): {why[split]}" for split in boxless]


def dataset_problems(out: str, label_map: dict[str, int], written: dict[str, int], rejected: int,
                     records_in: int, options: GateOptions, found: list[str] = (),
                     boxes: dict[str, int] | None = None) -> list[str]:
    """Write `schema.pbtxt`, `anomalies.txt`, `stats.html`; return every dataset-level problem
    (`found`: those the caller found already, in the same "scope | problem | detail" form;
    `boxes`: the boxes written per split, for the splits that hold none)."""
    problems = list(found) + [f"(split {split}) | no examples | every split needs at least one example"
                              for split in (TRAIN, VAL) if not written.get(split)]
    boxless = [] if boxes is None else boxless_splits(written, boxes)
    problems += no_boxes_problems(written, boxless)
    problems += look_alike_class_problems(label_map)
    fraction = rejected / records_in if records_in else 0.0
    if fraction > options.max_reject_fraction:
        problems.append(f"(records) | too many rejects | {rejected} of {records_in} records rejected "
                        f"({fraction:.1%}), over --max-reject-fraction {options.max_reject_fraction:.1%}; "
                        "see rejects-*.jsonl")
    stats = {s: tfdv.load_stats_binary(FileSystems.join(out, stats_file_name(s))) for s in (TRAIN, VAL)
             if written.get(s)}
    if TRAIN in stats:
        pinned = tfdv.load_schema_text(options.schema_file) if options.schema_file else None
        new = _new_classes(pinned, label_map) if pinned is not None else []
        problems += _new_class_problems(new, options)
        schema = task_schema(stats[TRAIN], num_labels=max(label_map.values()), pinned=pinned)
        tfdv.write_schema_text(schema, FileSystems.join(out, SCHEMA_FILE))
        for split, split_stats in stats.items():
            lines = anomaly_lines(find_anomalies(split_stats, schema))
            if split in boxless:  # TFDV reads a box feature with no values as 0s: said once above instead
                lines = [line for line in lines if line.split(" | ", 1)[0] not in OBJECT_KEYS]
            problems += [f"[{split}] {line}" for line in lines]
        if options.previous_stats:
            previous = tfdv.load_stats_binary(options.previous_stats)
            add_drift_checks(schema, options.drift_threshold, classes=not new)
            drift = find_anomalies(stats[TRAIN], schema, previous=previous)
            problems += [f"[drift vs {options.pinned_by or options.previous_stats}] {line}" for line in anomaly_lines(drift)]
        if VAL in stats:
            write_text(FileSystems.join(out, STATS_HTML_FILE), statistics_html(stats[TRAIN], stats[VAL]))
    write_text(FileSystems.join(out, ANOMALIES_FILE),
               "feature | problem | detail\n" + "".join(p + "\n" for p in problems) if problems else "no anomalies\n")
    return problems
