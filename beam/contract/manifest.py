"""`manifest.json`: what the data step wrote, with counts that reconcile.

One definition for its writer (`beam/convert_job.py`) and every reader (the CLI, the data
step's component, the run report, the local run's summary, the trainer's shard list): a
renamed or missing field fails `Manifest.from_dict` at once instead of a template or a
summary far downstream. Pure data; `beam/contract/files.py::read_manifest` reads the file.

>>> boxes = BoxCounts(boxes_in=5, written=4, rejected_by_reason={"invalid_box": 1})
>>> boxes.rejected, BoxCounts.from_dict(boxes.to_dict()) == boxes
(1, True)
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

from beam.contract.shard_names import GZIP_SUFFIX, SHARD_SUFFIX
from beam.contract.train_keys import TRAIN_KEYS_FILE

MANIFEST_FILE = "manifest.json"
LABEL_MAP_FILE = "label_map.json"
# The TF OD API's label map, which readers also take (beam/contract/label_map.py).
OD_API_LABEL_MAP_FILE = "label_map.pbtxt"
LABEL_MAP_FILES = (LABEL_MAP_FILE, OD_API_LABEL_MAP_FILE)
SCHEMA_FILE = "schema.pbtxt"  # TFDV's schema of the train split (inferred, or the one given)
ANOMALIES_FILE = "anomalies.txt"
STATS_HTML_FILE = "stats.html"  # TFDV's statistics of both splits, as a page
_STATS_FILE = "stats-{split}.pb"  # TFDV's statistics of one split (binary proto): stats_file_name
# Rejects: `rejects-00000-of-00001.jsonl`, one file per REJECTS_PER_FILE input records (most
# datasets: one file), one row per rejected image or dropped box, sorted by source inside
# each; `beam/contract/files.py::read_rejects` reads them all.
REJECTS_PER_FILE = 100_000
REJECTS_GLOB = "rejects-*.jsonl"
_REJECTS_FILE = re.compile(r"^rejects-\d{5}-of-\d{5}\.jsonl$")
# What builds before the sharded rejects wrote (recognised, so --overwrite removes it).
OLD_REJECTS_FILE = "rejects.jsonl"
# 2: box-level rejects and the `boxes` counts. A version-1 manifest has no box counts.
MANIFEST_VERSION = 2

# The job's scratch folder in OUTPUT (beam/job_outputs.py): removed when the build ends; a
# build that was killed leaves it, and nothing else a reader takes.
JOB_DIR = "_job"
# Every name a build writes at the top of its output folder besides the shards (the job's
# scratch folder included); `--overwrite` removes these and the shards, nothing else.
BUILD_FILES = (MANIFEST_FILE, OLD_REJECTS_FILE, LABEL_MAP_FILE, SCHEMA_FILE, ANOMALIES_FILE, STATS_HTML_FILE,
               _STATS_FILE.format(split="train"), _STATS_FILE.format(split="val"), TRAIN_KEYS_FILE, JOB_DIR)
_SHARD = re.compile(rf"^(train|val)-\d{{5}}-of-\d{{5}}{re.escape(SHARD_SUFFIX)}({re.escape(GZIP_SUFFIX)})?$")


def written_by_build(name: str) -> bool:
    """Whether a build writes a file of this name (a shard, or one of BUILD_FILES).

    >>> [written_by_build(n) for n in ("val-00001-of-00002.tfrecord.gz", "stats.html", "notes.txt")]
    [True, True, False]
    """
    name = name.rstrip("/")
    return name in BUILD_FILES or bool(_SHARD.match(name)) or is_rejects_file(name)


def stats_file_name(split: str) -> str:
    """TFDV's statistics of one split (binary proto).

    >>> stats_file_name("train") in BUILD_FILES
    True
    """
    return _STATS_FILE.format(split=split)


def rejects_file_count(records_in: int) -> int:
    """How many rejects files a job over `records_in` records writes.

    >>> rejects_file_count(10), rejects_file_count(250_000)
    (1, 3)
    """
    return max(1, -(-records_in // REJECTS_PER_FILE))


def rejects_file_name(index: int, count: int) -> str:
    """The name of rejects file `index` of `count`.

    >>> rejects_file_name(0, 1), is_rejects_file(rejects_file_name(0, 1))
    ('rejects-00000-of-00001.jsonl', True)
    """
    return f"rejects-{index:05d}-of-{count:05d}.jsonl"


def is_rejects_file(name: str) -> bool:
    return bool(_REJECTS_FILE.match(name))


def earlier_build_problem(names: list[str]) -> str | None:
    """Why a non-empty folder with these entries is not recognised as an earlier build (None
    when it is: it has a manifest, or holds nothing but names a build writes)."""
    if MANIFEST_FILE in names or all(written_by_build(n) for n in names):
        return None
    foreign = sorted(n for n in names if not written_by_build(n))
    return (f"it is not an earlier build (no {MANIFEST_FILE}; {len(foreign)} other file(s): "
            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''})")


def output_folder_problem(output: str, names: list[str], overwrite: bool, unrecognised_ok: bool) -> str | None:
    """Why a build may not go into `output`, which holds `names` (None: it may). An empty
    folder, or one holding only JOB_DIR (a build that did not finish), is built into; a
    non-empty one only with `overwrite`, and then only if it is an earlier build or
    `unrecognised_ok`.

    >>> output_folder_problem("out", ["_job"], False, False) is None
    True
    >>> output_folder_problem("out", ["notes.txt"], True, False).startswith("out: it is not an earlier build")
    True
    """
    if not names or names == [JOB_DIR]:
        return None
    if not overwrite:
        return f"{output} is not empty (an earlier build?): choose an empty folder, or pass --overwrite to replace " \
               "what a build wrote there"
    problem = None if unrecognised_ok else earlier_build_problem(names)
    return problem and (f"{output}: {problem}; choose another folder, or pass --overwrite-unrecognised to build "
                        "there anyway (other files are kept)")


class ManifestError(ValueError):
    """A manifest this detpipe cannot read (another version, or a field missing)."""


@dataclass(frozen=True)
class BoxCounts:
    """The boxes of the images written to one split: boxes in = written + rejected."""

    boxes_in: int
    written: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())

    def to_dict(self) -> dict:
        return {"in": self.boxes_in, "written": self.written, "rejected": self.rejected,
                "rejected_by_reason": dict(sorted(self.rejected_by_reason.items()))}

    @classmethod
    def from_dict(cls, data: dict) -> "BoxCounts":
        return cls(boxes_in=data["in"], written=data["written"], rejected_by_reason=dict(data["rejected_by_reason"]))


@dataclass(frozen=True)
class Manifest:
    """Counts per split and reason (images and boxes), the shard list, anomalies and options."""

    format: str
    records_in: int
    written: dict[str, int]  # images per split
    rejected_by_reason: dict[str, int]  # images rejected whole
    boxes: dict[str, BoxCounts]  # per split, for the images written
    color_modes: dict[str, int]
    exif_orientation: dict
    num_classes: int
    shards: list[dict]  # ShardInfo.to_dict() of each shard, sorted by name
    anomalies: list[str]
    anomalies_allowed: bool
    options: dict
    seconds: float
    version: int = MANIFEST_VERSION
    # Boxes written per split and class name. Absent ({}) in manifests written before it.
    class_boxes: dict[str, dict[str, int]] = field(default_factory=dict)
    # With a split file: {"listed", "matched", "unknown", "unknown_examples"}; None without one.
    split_file: dict | None = None
    # Same-class box pairs on one image with IoU above "iou_above": {"iou_above", "pairs", "examples"}.
    near_duplicates: dict = field(default_factory=lambda: {"iou_above": 0.8, "pairs": 0, "examples": []})
    # Images written as PNG, by the source's format (beam/contract/images.py): {"BMP": 3, ...}.
    converted_formats: dict[str, int] = field(default_factory=dict)
    # The photos in tiles as training would cut them (components/detector/tile_counts.py):
    # {"mode", "whole": {device: why whole photos}, "layouts": [{"devices", "tile", "overlap",
    # "reason", "splits": {split: {"photos", "tiles", "boxes", "boxes_whole_in_a_tile"}}}]}.
    tiles: dict = field(default_factory=dict)
    # Every image written was decoded by TensorFlow's own decoders at build time
    # (beam/contract/decoding.py). False in manifests written before that check: the trainer
    # then checks the images itself before its first step.
    decoded_with_tensorflow: bool = False

    @property
    def written_total(self) -> int:
        return sum(self.written.values())

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())

    @property
    def boxes_rejected_by_reason(self) -> dict[str, int]:
        """Dropped boxes of every split, by reason."""
        return dict(sorted(sum((Counter(c.rejected_by_reason) for c in self.boxes.values()), Counter()).items()))

    def reconcile_problems(self) -> list[str]:
        """What does not add up: images in = written + rejected; per split, boxes in = written + rejected."""
        problems = []
        if self.written_total + self.rejected != self.records_in:
            problems.append(f"images: {self.records_in} in, {self.written_total} written, {self.rejected} rejected")
        for split, counts in self.boxes.items():
            if counts.written + counts.rejected != counts.boxes_in:
                problems.append(f"{split} boxes: {counts.boxes_in} in, {counts.written} written, "
                                f"{counts.rejected} rejected")
        for layout in self.tiles.get("layouts", []):
            for split, counted in layout["splits"].items():
                boxes = self.boxes[split].written if split in self.boxes else 0
                if (counted["photos"], counted["boxes"]) != (self.written.get(split, 0), boxes):
                    problems.append(f"{split} in tiles of {layout['tile']}px: {counted['photos']} photos and "
                                    f"{counted['boxes']} boxes counted, {self.written.get(split, 0)} and {boxes} "
                                    "written")
        return problems

    def to_dict(self) -> dict:
        data = asdict(self)
        data["boxes"] = {split: counts.to_dict() for split, counts in self.boxes.items()}
        data["written_total"], data["rejected"] = self.written_total, self.rejected
        data["rejected_by_reason"] = dict(sorted(self.rejected_by_reason.items()))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Manifest":
        if data.get("version") != MANIFEST_VERSION:
            raise ManifestError(f"manifest version {data.get('version')} is not {MANIFEST_VERSION} (written by "
                                "another detpipe): rebuild the dataset with `detpipe data build`")
        # Added later: older manifests lack them.
        optional = {"class_boxes", "split_file", "near_duplicates", "converted_formats", "tiles",
                    "decoded_with_tensorflow"}
        try:
            values = {f.name: data[f.name] for f in fields(cls) if f.name not in optional or f.name in data}
        except KeyError as err:
            raise ManifestError(f"manifest has no {err.args[0]!r} field") from err
        values["boxes"] = {split: BoxCounts.from_dict(counts) for split, counts in data["boxes"].items()}
        return cls(**values)



def tile_lines(manifest: Manifest) -> list[str]:
    """The tile counts, a line per layout and split, for the console (none when seen whole).

    >>> m = {"mode": "auto", "whole": {}, "layouts": [{"devices": ["gpu", "cpu"], "tile": 512, "overlap": 32,
    ...      "reason": "...", "splits": {"train": {"photos": 3, "tiles": 75, "boxes": 40, "boxes_whole_in_a_tile": 39}}}]}
    >>> tile_lines(Manifest("voc", 3, {"train": 3}, {}, {}, {}, {}, 1, [], [], False, {}, 0.0, tiles=m))
    ['tiles of 512px overlapping by 32px (train --tile auto on a gpu or cpu): train 3 photos -> 75 tiles, 39 of 40 boxes whole in a tile']
    """
    lines = []
    for layout in manifest.tiles.get("layouts", []):
        where = " or ".join(layout["devices"])
        head = (f"tiles of {layout['tile']}px overlapping by {layout['overlap']}px (train --tile "
                f"{manifest.tiles['mode']}" + ("" if where == "any" else f" on a {where}") + ")")
        lines.append(head + ": " + "; ".join(
            f"{split} {c['photos']} photos -> {c['tiles']} tiles, {c['boxes_whole_in_a_tile']} of {c['boxes']} boxes "
            "whole in a tile" for split, c in layout["splits"].items()))
    return lines


def near_duplicate_line(manifest: Manifest) -> str:
    """The warning about near-duplicate boxes, for the console and the logs ("" when none)."""
    dup = manifest.near_duplicates
    if not dup["pairs"]:
        return ""
    return (f"{dup['pairs']} near-duplicate box pair(s) (same class, IoU > {dup['iou_above']}: the same object "
            f"labelled twice?), kept; e.g. {'; '.join(dup['examples'])}")
