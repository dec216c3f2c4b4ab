"""The sha256 of every file of a registered model version, and the check that a folder the
registry wrote is still what it wrote.

A model is code: TensorFlow runs whatever ops a SavedModel's graph holds (TensorFlow's own
SECURITY.md). The registry cannot vet a graph, but it can make sure the model that is served,
predicted with or warm-started from is byte for byte the one that was registered (after the
evaluation and the promotion decision that read it): `write_checksums` records each file of
a folder in `CHECKSUM_FILE` inside it when the version is written, and `verify_folder` refuses
a folder holding that file in which a listed file changed or went missing. hashlib does the
hashing; the file and the comparison are this module's, as no library keeps a manifest of a
folder that lives locally or on gs://.
"""

from __future__ import annotations

import hashlib
import json
import os

CHECKSUM_FILE = "sha256.json"  # in a folder the registry wrote: {path relative to the folder: sha256}
_CHUNK = 1 << 20


class ModelChanged(ValueError):
    """A file of a registered model differs from what the registry recorded."""


def _open(path: str):
    if "://" in path:  # gs:// (the registry on GCS, Vertex's $AIP_STORAGE_URI)
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb")


def _exists(path: str) -> bool:
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.exists(path)
    return os.path.exists(path)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with _open(path) as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_checksums(folder: str) -> dict[str, str]:
    """{relative path with `/`: sha256} of every file under a local `folder` (but a checksum file)."""
    found = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel != CHECKSUM_FILE:
                found[rel] = file_sha256(path)
    return dict(sorted(found.items()))


def write_checksums(folder: str, checksums: dict[str, str]) -> str:
    """Write `checksums` as the folder's `CHECKSUM_FILE`; its path."""
    path = os.path.join(folder, CHECKSUM_FILE)
    with open(path, "w") as handle:
        json.dump(checksums, handle, indent=1, sort_keys=True)
        handle.write("\n")
    return path


def verify_files(folder: str, recorded: dict[str, str], names=None, named_as: str | None = None) -> None:
    """Raise `ModelChanged`, one line naming every changed or missing file, unless each file of
    `recorded` (or only those in `names`) under `folder` has its recorded sha256. `named_as`:
    the folder the message names (where the files came from, for a local copy)."""
    root = folder.rstrip("/")
    problems = []
    for rel, expected in recorded.items():
        if names is not None and rel not in names:
            continue
        path, shown = f"{root}/{rel}", f"{(named_as or root).rstrip('/')}/{rel}"
        if not _exists(path):
            problems.append(f"{shown} is missing")
        elif file_sha256(path) != expected:
            problems.append(f"{shown} changed")
    if problems:
        raise ModelChanged(f"{'; '.join(problems)} since the registry recorded its sha256 ({CHECKSUM_FILE}): "
                           "refusing to load a model that is not the one registered")


def recorded_checksums(folder: str) -> dict[str, str] | None:
    """The folder's `CHECKSUM_FILE`, or None when the registry did not write the folder."""
    path = f"{folder.rstrip('/')}/{CHECKSUM_FILE}"
    if not _exists(path):
        return None
    with _open(path) as handle:
        return json.loads(handle.read())


def verify_folder(folder: str) -> bool:
    """Check a folder against its `CHECKSUM_FILE` (raises `ModelChanged`); False when it has none
    (a folder the registry did not write: an export, a training output)."""
    recorded = recorded_checksums(folder)
    if recorded is None:
        return False
    verify_files(folder, recorded)
    return True
