"""What the Beam job hands to its driver (`build_dataset`), declared once for both.

The job writes every output through its own sinks into OUTPUT/_job/: the shards and the
rejects (sharded, deterministic), each shard's features for the statistics, and three small
outputs (the label map, the shard list, the job summary of combined counts), each element of
these a file of its own named by its content (`write_parts`), so a retried bundle rewrites
the same file with the same bytes. When the job has finished, the
driver reads the small outputs (`read_job_outputs`) and moves the rest into OUTPUT
(`publish`). A job that fails leaves only OUTPUT/_job/, which no reader takes for a
dataset (they read OUTPUT's top level, and trust it only with `manifest.json`, which the
driver writes last).

>>> s = JobSummary.merge([JobSummary(counts={"a": 1}, near_duplicates=1, near_duplicate_examples=["x"]),
...                       JobSummary(counts={"a": 2, "b": 1}, unknown_ids=1, unknown_id_examples=["7"])])
>>> s.counts, s.near_duplicates, s.unknown_id_examples, JobSummary.from_json(s.to_json()) == s
({'a': 3, 'b': 1}, 1, ['7'], True)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam.contract.manifest import JOB_DIR

LABEL_MAP_OUTPUT = "label_map"
SHARD_LIST_OUTPUT = "shards"
SHARD_COUNTS_OUTPUT = "shard_counts"
SUMMARY_OUTPUT = "summary"

# How many examples the summary keeps of near-duplicate box pairs and of split-file ids
# that match no record (the manifest and the warnings show these).
EXAMPLES_KEPT = 5


def job_path(output: str, name: str) -> str:
    return FileSystems.join(output, JOB_DIR, name)


def features_file_name(shard: str) -> str:
    """The job file of a shard's features (an Arrow batch, beam/feature_batches.py), which the
    driver's statistics read; it goes with OUTPUT/_job/.

    >>> features_file_name("val-00001-of-00002.tfrecord")
    'features-val-00001-of-00002.tfrecord.arrow'
    """
    return f"features-{shard}.arrow"


def features_files(output: str, split: str) -> list[str]:
    """The paths of a split's features files the job wrote, in shard order."""
    return _matching(job_path(output, features_file_name(f"{split}-*")))


def _matching(pattern: str) -> list[str]:
    """The paths matching a glob pattern (local or gs://), sorted."""
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


@dataclass
class JobSummary:
    """The job's combined counts: `counts` of record facts ("boxes_in/train", ...), the
    near-duplicate box pairs and the split-file ids that match no record, each with the
    first EXAMPLES_KEPT (smallest, so the result does not depend on the order of work)."""

    counts: dict[str, int] = field(default_factory=dict)
    near_duplicates: int = 0
    near_duplicate_examples: list[str] = field(default_factory=list)
    unknown_ids: int = 0
    unknown_id_examples: list[str] = field(default_factory=list)

    def add(self, part: "JobSummary") -> "JobSummary":
        """Add `part` into this summary (in place; once per record on the job's hot path)."""
        for key, value in part.counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        self.near_duplicates += part.near_duplicates
        if part.near_duplicate_examples:
            self.near_duplicate_examples = sorted(self.near_duplicate_examples
                                                  + part.near_duplicate_examples)[:EXAMPLES_KEPT]
        self.unknown_ids += part.unknown_ids
        if part.unknown_id_examples:
            self.unknown_id_examples = sorted(self.unknown_id_examples + part.unknown_id_examples)[:EXAMPLES_KEPT]
        return self

    @staticmethod
    def merge(parts) -> "JobSummary":
        out = JobSummary()
        for part in parts:
            out.add(part)
        out.counts = dict(sorted(out.counts.items()))
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "JobSummary":
        return JobSummary(**json.loads(text))


class CombineSummaries(beam.CombineFn):
    """`JobSummary` parts → one (Beam's combiner lifting merges them on each worker first)."""

    def create_accumulator(self):
        return JobSummary()

    def add_input(self, accumulator, part):
        return accumulator.add(part)

    def merge_accumulators(self, accumulators):
        return JobSummary.merge(accumulators)

    def extract_output(self, accumulator):
        return JobSummary.merge([accumulator])  # counts in key order


def _json_line(value) -> str:
    return json.dumps(value, sort_keys=True)


def _write_part(value, folder: str, encode) -> None:
    import hashlib

    from beam.contract.files import write_text

    line = encode(value)
    write_text(FileSystems.join(folder, hashlib.sha256(line.encode()).hexdigest()[:20] + ".json"), line + "\n")


def write_parts(pcoll: beam.PCollection, output: str, name: str, label: str, encode=_json_line):
    """Write each element of a PCollection, as the line `encode` makes of it (JSON with
    sorted keys unless told), as a file of its own in OUTPUT/_job/NAME/, named by its
    content. Fused into the stage that makes the elements: Beam's WriteToText of one file
    took 4-5 stages of its own (each ~30 ms of a local multi-process job, ~12 in all)."""
    return pcoll | label >> beam.Map(_write_part, job_path(output, name), encode)


@dataclass
class JobOutputs:
    """The job's small outputs, read back by the driver."""

    label_map: dict[str, int]
    shards: list[dict]  # ShardInfo.to_dict() of every shard with records, sorted by name
    shard_counts: dict[str, int]  # {split: number of shards}
    summary: JobSummary


def _lines(folder: str) -> list[str]:
    """The lines of the files `write_parts` wrote into this folder (none if it is absent)."""
    lines = []
    for path in _matching(FileSystems.join(folder, "*.json")):
        with FileSystems.open(path) as handle:
            lines += [line for line in handle.read().decode().splitlines() if line.strip()]
    return lines


def read_job_outputs(output: str) -> JobOutputs:
    """The label map, shard list, shard counts and summary a finished job wrote (absent ones empty)."""
    label_map = _lines(job_path(output, LABEL_MAP_OUTPUT))
    counts = _lines(job_path(output, SHARD_COUNTS_OUTPUT))
    summary = _lines(job_path(output, SUMMARY_OUTPUT))
    shards = sorted((json.loads(line) for line in _lines(job_path(output, SHARD_LIST_OUTPUT))),
                    key=lambda s: s["name"])
    return JobOutputs(label_map=json.loads(label_map[0]) if label_map else {}, shards=shards,
                      shard_counts=json.loads(counts[0]) if counts else {},
                      summary=JobSummary.merge(JobSummary.from_json(line) for line in summary))


def publish(output: str, names: list[str]) -> None:
    """Move these files from OUTPUT/_job/ to OUTPUT (a rename locally; on GCS Beam's copy
    and delete, in batches)."""
    if names:
        FileSystems.rename([job_path(output, n) for n in names], [FileSystems.join(output, n) for n in names])

