"""Dataset-level gates after the Beam job: TFDV schema validation per split, the reject
fraction, and drift against a previous run's statistics. One line per problem.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tensorflow_data_validation as tfdv
from apache_beam.io.filesystems import FileSystems

from beam.output_files import write_text
from beam.split import TRAIN, VAL
from beam.tfdv_checks import add_drift_checks, anomaly_lines, find_anomalies, statistics_html, task_schema

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateOptions:
    schema_file: str | None = None  # pin a schema (schema.pbtxt of an earlier run)
    max_reject_fraction: float = 0.1
    previous_stats: str | None = None  # stats-train.pb of an earlier run
    drift_threshold: float = 0.1


def dataset_problems(out: str, label_map: dict[str, int], written: dict[str, int], rejected: int,
                     records_in: int, options: GateOptions) -> list[str]:
    """Write `schema.pbtxt`, `anomalies.txt`, `stats.html`; return every dataset-level problem."""
    problems = [f"(split {split}) | no examples | every split needs at least one example"
                for split in (TRAIN, VAL) if not written.get(split)]
    fraction = rejected / records_in if records_in else 0.0
    if fraction > options.max_reject_fraction:
        problems.append(f"(records) | too many rejects | {rejected} of {records_in} records rejected "
                        f"({fraction:.1%}), over --max-reject-fraction {options.max_reject_fraction:.1%}; "
                        "see rejects.jsonl")
    stats = {s: tfdv.load_stats_binary(FileSystems.join(out, f"stats-{s}.pb")) for s in (TRAIN, VAL)
             if written.get(s)}
    if TRAIN in stats:
        pinned = tfdv.load_schema_text(options.schema_file) if options.schema_file else None
        schema = task_schema(stats[TRAIN], num_labels=max(label_map.values()), pinned=pinned)
        tfdv.write_schema_text(schema, FileSystems.join(out, "schema.pbtxt"))
        for split, split_stats in stats.items():
            problems += [f"[{split}] {line}" for line in anomaly_lines(find_anomalies(split_stats, schema))]
        if options.previous_stats:
            previous = tfdv.load_stats_binary(options.previous_stats)
            add_drift_checks(schema, options.drift_threshold)
            drift = find_anomalies(stats[TRAIN], schema, previous=previous)
            problems += [f"[drift vs {options.previous_stats}] {line}" for line in anomaly_lines(drift)]
        if VAL in stats:
            write_text(FileSystems.join(out, "stats.html"), statistics_html(stats[TRAIN], stats[VAL]))
    write_text(FileSystems.join(out, "anomalies.txt"),
               "feature | problem | detail\n" + "".join(p + "\n" for p in problems) if problems else "no anomalies\n")
    return problems
