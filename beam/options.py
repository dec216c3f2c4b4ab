"""The data step's settings, declared once: `ConvertOptions` (the job) and `GateOptions` (its
dataset gates), with the checks' `CheckOptions` (beam/record_checks.py). Plain data: no Beam,
no TensorFlow, so the pipeline's parameters (pipeline/params.py) and `data build`'s options take
their defaults from here without importing the job.

Example (the CLI does the same)::

    build_dataset(ConvertOptions(images="imgs", annotations="xml", output="out"))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from beam.contract.manifest import SCHEMA_FILE, stats_file_name
from beam.record_checks import CheckOptions
from beam.split import GivenSplit

# Shards of about this many bytes, and at least this many a split (parallel reading).
DEFAULT_TARGET_SHARD_BYTES = 128 * 1024 * 1024
DEFAULT_MIN_SHARDS = 4


@dataclass(frozen=True)
class GateOptions:
    schema_file: str | None = None  # pin a schema (schema.pbtxt of an earlier run)
    max_reject_fraction: float = 0.1
    previous_stats: str | None = None  # stats-train.pb of an earlier run
    drift_threshold: float = 0.1
    # With a pinned (champion's) schema: accept classes it does not list. New classes shift
    # the class distribution, so that drift check is left out when there are any (it would
    # only repeat them); box sizes are still compared.
    allow_new_classes: bool = False
    pinned_by: str = ""  # who pinned the schema, for the messages (e.g. "champion v3")


def with_champion(options: GateOptions, files: dict[str, str], version: str) -> GateOptions:
    """Validate against a champion's files (`schema.pbtxt`, `stats-train.pb`, as the
    registry keeps them) instead of inferring from this data alone."""
    return replace(options, schema_file=files.get(SCHEMA_FILE) or options.schema_file,
                   previous_stats=files.get(stats_file_name("train")) or options.previous_stats,
                   pinned_by=f"champion {version}")


FORMATS = ("voc", "coco", "csv")


@dataclass(frozen=True)
class ConvertOptions:
    images: str
    annotations: str
    output: str
    data_format: str = "voc"  # one of FORMATS
    val_fraction: float = 0.2
    seed: int = 0
    label_map: dict[str, int] | None = None
    # Ids to keep (the champion's): its classes keep their ids, new ones get the next ids.
    base_label_map: dict[str, int] | None = None
    keep_empty: bool = True
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
    min_shards: int = DEFAULT_MIN_SHARDS
    max_pixels: int = CheckOptions.max_pixels
    split_file: str | None = None  # JSON {"train": [ids], "val": [ids]} instead of the hash split
    # A dataset that comes split: the val split's own annotations (VOC folder, COCO/CSV file)
    # and images (default: `images`); `annotations` then holds the train split only.
    val_annotations: str | None = None
    val_images: str | None = None
    gzip: bool = False
    overwrite: bool = False  # remove what an earlier build wrote in the output folder (else refuse a non-empty one)
    overwrite_unrecognised: bool = False  # with overwrite: also build into a folder that is not an earlier build
    exif: str = CheckOptions.exif  # auto | apply | ignore: the frame of the annotations (beam/contract/exif.py)
    bad_box: str = CheckOptions.bad_box  # drop | reject-image: what a box that cannot be trusted costs
    gates: GateOptions = field(default_factory=GateOptions)
    allow_anomalies: bool = False
    runner: str = "DirectRunner"
    num_workers: int | None = None  # DirectRunner worker processes; None: default_workers()
    beam_args: tuple[str, ...] = field(default=())

    @property
    def given_split(self) -> GivenSplit | None:
        """The split the dataset comes with (`val_annotations`), else None (a split file or the hash)."""
        if not self.val_annotations:
            return None
        return GivenSplit(self.val_annotations, self.val_images or self.images)
