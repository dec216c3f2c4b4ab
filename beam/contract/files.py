"""Small files the job writes beside the shards, locally or on gs:// (Beam FileSystems)."""

from __future__ import annotations

import json

from apache_beam.io.filesystems import FileSystems

from beam.contract.manifest import MANIFEST_FILE, REJECTS_GLOB, Manifest
from beam.contract.rejects import Reject


def write_text(path: str, text: str) -> None:
    """Create (or replace) a file, even an empty one."""
    with FileSystems.create(path) as handle:
        handle.write(text.encode())


def write_json(path: str, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str):
    with FileSystems.open(path) as handle:
        return json.loads(handle.read())


def read_rejects(dataset_dir: str) -> list[Reject]:
    """Every row of the dataset's rejects files (`rejects-*.jsonl`; none when there are none),
    in file order."""
    rows = []
    for match in sorted(FileSystems.match([FileSystems.join(dataset_dir, REJECTS_GLOB)])[0].metadata_list,
                        key=lambda m: m.path):
        with FileSystems.open(match.path) as handle:
            rows += [Reject.from_dict(json.loads(line)) for line in handle.read().decode().splitlines() if line.strip()]
    return rows


def read_manifest(dataset_dir: str) -> Manifest:
    """DATASET/manifest.json, local or gs://."""
    return Manifest.from_dict(read_json(FileSystems.join(dataset_dir, MANIFEST_FILE)))
