"""Small files the job writes beside the shards, locally or on gs:// (Beam FileSystems)."""

from __future__ import annotations

import json

from apache_beam.io.filesystems import FileSystems

from beam.manifest import MANIFEST_FILE, Manifest
from beam.source_records import Reject


def write_text(path: str, text: str) -> None:
    """Create (or replace) a file, even an empty one."""
    with FileSystems.create(path) as handle:
        handle.write(text.encode())


def write_json(path: str, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str):
    with FileSystems.open(path) as handle:
        return json.loads(handle.read())


def pop_json(path: str, default):
    """Read and delete a side file the Beam job left (absent when it saw no records)."""
    if not FileSystems.exists(path):
        return default
    data = read_json(path)
    FileSystems.delete([path])
    return data


def write_rejects(path: str, rejects: list[Reject]) -> None:
    """`rejects.jsonl`: one JSON object a line, sorted by source so reruns match."""
    rows = sorted((r.to_dict() for r in rejects), key=lambda d: (d["source"], d["image_id"], d.get("box", -1)))
    write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


def read_rejects(path: str) -> list[Reject]:
    """The rows of `rejects.jsonl` (none when the file is absent)."""
    if not FileSystems.exists(path):
        return []
    with FileSystems.open(path) as handle:
        return [Reject.from_dict(json.loads(line)) for line in handle.read().decode().splitlines() if line.strip()]


def read_manifest(dataset_dir: str) -> Manifest:
    """DATASET/manifest.json, local or gs://."""
    return Manifest.from_dict(read_json(FileSystems.join(dataset_dir, MANIFEST_FILE)))
