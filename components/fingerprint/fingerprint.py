"""A fingerprint of a dataset's source files, so a pipeline's cache key sees new data.

Vertex AI caches a step on its parameter values, and `images=gs://bucket/photos` is the same
string every week; the fingerprint step lists what is behind the paths and hands the data
step a sha256 that changes when a file is added, removed or rewritten.

What identifies a file without reading it: for a local file its path relative to the root,
its size and its mtime (ns); for a gs:// object its name, size, generation and crc32c
(a rewrite gets a new generation even with the same bytes, which errs on retraining).

Example:
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "a.jpg").write_bytes(b"x")
    >>> fp = fingerprint_source(str(root), str(root / "a.jpg"))
    >>> (fp.images, fp.annotations, len(fp.sha256))
    (1, 1, 64)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

# Hidden files and editor/OS litter are not data: `.DS_Store` touched by Finder must not
# force a retrain.
_IGNORED = (".", "~")


@dataclass(frozen=True)
class FileEntry:
    name: str  # relative to the listed root
    size: int
    version: str  # mtime_ns for local files, "generation/crc32c" for gs:// objects


@dataclass(frozen=True)
class SourceFingerprint:
    sha256: str
    images: int  # files under the images path
    annotations: int  # files under the annotations path (1 for a COCO/CSV file)
    total_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def _split_gs(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("gs://"):].partition("/")
    if not bucket:
        raise ValueError(f"not a gs:// URI with a bucket: {uri!r}")
    return bucket, prefix


def _ignored(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base or base.startswith(_IGNORED[0]) or base.endswith(_IGNORED[1])


def list_local(path: str) -> list[FileEntry]:
    """Every file under `path` (or `path` itself when it is a file), sorted by name."""
    if os.path.isfile(path):
        stat = os.stat(path)
        return [FileEntry(os.path.basename(path), stat.st_size, str(stat.st_mtime_ns))]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} does not exist")
    entries = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            if not _ignored(rel):
                stat = os.stat(full)
                entries.append(FileEntry(rel, stat.st_size, str(stat.st_mtime_ns)))
    return sorted(entries, key=lambda e: e.name)


def list_gcs(uri: str, client=None) -> list[FileEntry]:
    """Every object under `uri` (a file or a folder prefix), sorted by name. `client` is a
    `google.cloud.storage.Client` (made here when None)."""
    if client is None:
        from google.cloud import storage

        client = storage.Client()
    bucket, prefix = _split_gs(uri)
    folder = prefix.rstrip("/") + "/" if prefix else ""
    entries = []
    for blob in client.list_blobs(bucket, prefix=prefix.rstrip("/")):
        if blob.name == prefix.rstrip("/"):  # the annotations file itself
            entries.append(FileEntry(blob.name.rsplit("/", 1)[-1], int(blob.size), f"{blob.generation}/{blob.crc32c}"))
        elif blob.name.startswith(folder) and not blob.name.endswith("/") and not _ignored(blob.name):
            entries.append(FileEntry(blob.name[len(folder):], int(blob.size), f"{blob.generation}/{blob.crc32c}"))
    if not entries:
        raise FileNotFoundError(f"nothing under {uri}")
    return sorted(entries, key=lambda e: e.name)


def list_files(path: str, client=None) -> list[FileEntry]:
    return list_gcs(path, client) if path.startswith("gs://") else list_local(path)


def _digest(groups: Iterable[tuple[str, list[FileEntry]]]) -> Iterator[bytes]:
    for label, entries in groups:
        yield f"[{label}]\n".encode()
        for e in entries:
            yield f"{e.name}\t{e.size}\t{e.version}\n".encode()


def fingerprint_source(images: str, annotations: str, client=None, split_file: str = "",
                       val_annotations: str = "", val_images: str = "") -> SourceFingerprint:
    """The sha256 over both listings (and the split file's, when one is given: a new split
    is new data; and those of the val split's own annotations and images, for a dataset
    that comes split). When the annotations lie inside the images folder (a VOC folder with
    both), each file is still listed once per path; that only affects the hash, which
    stays stable."""
    image_files = list_files(images, client)
    annotation_files = list_files(annotations, client)
    groups = [("images", image_files), ("annotations", annotation_files)]
    if split_file:
        groups.append(("split", list_files(split_file, client)))
    if val_annotations:
        val_annotation_files = list_files(val_annotations, client)
        groups.append(("val_annotations", val_annotation_files))
        annotation_files = annotation_files + val_annotation_files
    if val_images and val_images != images:
        val_image_files = list_files(val_images, client)
        groups.append(("val_images", val_image_files))
        image_files = image_files + val_image_files
    digest = hashlib.sha256()
    for chunk in _digest(groups):
        digest.update(chunk)
    return SourceFingerprint(
        sha256=digest.hexdigest(), images=len(image_files), annotations=len(annotation_files),
        total_bytes=sum(e.size for e in image_files) + sum(e.size for e in annotation_files))


def unchanged_data_line(champion: str, recorded: dict, sha256: str) -> str:
    """A line for people when the source's fingerprint is the one `champion` was trained from
    (`recorded`: its version record's "fingerprint"); "" otherwise. Locally the KFP runner has
    no cache, so a run on unchanged files trains on them again: a new version then differs from
    the champion by more training (and its noise), not by new data.

    >>> unchanged_data_line("v3", {"sha256": "ab" * 32}, "ab" * 32)[:63]
    'unchanged data: the same files as v3 (the champion) was trained'
    >>> unchanged_data_line("v3", {"sha256": "ab" * 32}, "cd" * 32), unchanged_data_line("", {}, "cd" * 32)
    ('', '')
    """
    if not champion or recorded.get("sha256") != sha256:
        return ""
    return (f"unchanged data: the same files as {champion} (the champion) was trained on (fingerprint "
            f"{sha256[:12]}): this run trains on them again, so what it gains or loses comes from more training, "
            "not from new data")
