"""Where the registry keeps its files: a local folder or a gs:// prefix.

Two operations need more than "write a file", and neither tf.io.gfile nor Beam's
FileSystems offers them on gs://, which is why this small interface exists:
- `create`: write a file only if it does not exist yet (claiming a version number when two
  runs finish at once): `O_EXCL` locally, `if_generation_match=0` on GCS;
- `replace`: replace a file atomically and only if nobody else replaced it since we read it
  (`champion.json`): write-then-rename locally, a generation precondition on GCS.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol


class Conflict(RuntimeError):
    """Someone else wrote the file first (a concurrent run): re-read and try again."""


class Store(Protocol):
    uri: str

    def read_text(self, rel: str) -> str | None: ...
    def create(self, rel: str, text: str) -> None: ...
    def replace(self, rel: str, text: str, expected: str | None) -> None: ...
    def list_dirs(self, rel: str) -> list[str]: ...
    def upload_dir(self, local_dir: str, rel: str) -> None: ...
    def download_dir(self, rel: str, local_dir: str) -> None: ...
    def download_file(self, rel: str, local_path: str) -> bool: ...
    def join(self, rel: str) -> str: ...


class LocalStore:
    def __init__(self, root: str):
        self.uri = str(Path(root).resolve())
        self._root = Path(self.uri)

    def join(self, rel: str) -> str:
        return str(self._root / rel)

    def read_text(self, rel: str) -> str | None:
        path = self._root / rel
        return path.read_text() if path.is_file() else None

    def create(self, rel: str, text: str) -> None:
        path = self._root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as err:
            raise Conflict(f"{path} exists") from err
        with os.fdopen(fd, "w") as handle:
            handle.write(text)

    def replace(self, rel: str, text: str, expected: str | None) -> None:
        """Atomic for readers (rename); `expected` (the text read before) guards against a
        concurrent writer as well as a local folder can without a lock."""
        path = self._root / rel
        if self.read_text(rel) != expected:
            raise Conflict(f"{path} changed since it was read")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)

    def list_dirs(self, rel: str) -> list[str]:
        path = self._root / rel
        return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []

    def upload_dir(self, local_dir: str, rel: str) -> None:
        import shutil

        shutil.copytree(local_dir, self._root / rel, dirs_exist_ok=True)

    def download_dir(self, rel: str, local_dir: str) -> None:
        import shutil

        source = self._root / rel
        if not source.is_dir():
            raise FileNotFoundError(f"{source} not found")
        shutil.copytree(source, local_dir, dirs_exist_ok=True)


    def download_file(self, rel: str, local_path: str) -> bool:
        import shutil

        source = self._root / rel
        if not source.is_file():
            return False
        shutil.copyfile(source, local_path)
        return True


class GcsStore:
    """A gs://bucket/prefix through `google.cloud.storage` (its client is the test boundary)."""

    def __init__(self, uri: str, client=None):
        if client is None:
            from google.cloud import storage

            client = storage.Client()
        self.uri = uri.rstrip("/")
        bucket, _, prefix = self.uri[len("gs://"):].partition("/")
        self._client, self._bucket, self._prefix = client, client.bucket(bucket), prefix

    def _name(self, rel: str) -> str:
        return f"{self._prefix}/{rel}" if self._prefix else rel

    def join(self, rel: str) -> str:
        return f"{self.uri}/{rel}"

    def read_text(self, rel: str) -> str | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._bucket.blob(self._name(rel)).download_as_text()
        except NotFound:
            return None

    def create(self, rel: str, text: str) -> None:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._bucket.blob(self._name(rel)).upload_from_string(text, if_generation_match=0)
        except PreconditionFailed as err:
            raise Conflict(f"{self.join(rel)} exists") from err

    def replace(self, rel: str, text: str, expected: str | None) -> None:
        """One object write is atomic on GCS; the generation read now must still be the
        current one when the write lands (0: the object must not exist)."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.get_blob(self._name(rel))
        current = blob.download_as_text() if blob is not None else None
        if current != expected:
            raise Conflict(f"{self.join(rel)} changed since it was read")
        generation = blob.generation if blob is not None else 0
        try:
            self._bucket.blob(self._name(rel)).upload_from_string(text, if_generation_match=generation)
        except PreconditionFailed as err:
            raise Conflict(f"{self.join(rel)} changed since it was read") from err

    def list_dirs(self, rel: str) -> list[str]:
        prefix = self._name(rel).rstrip("/") + "/"
        names = set()
        for blob in self._client.list_blobs(self._bucket.name, prefix=prefix):
            rest = blob.name[len(prefix):]
            if "/" in rest:
                names.add(rest.split("/", 1)[0])
        return sorted(names)

    def upload_dir(self, local_dir: str, rel: str) -> None:
        root = Path(local_dir)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self._bucket.blob(self._name(f"{rel}/{path.relative_to(root).as_posix()}")).upload_from_filename(
                    str(path))

    def download_dir(self, rel: str, local_dir: str) -> None:
        prefix = self._name(rel).rstrip("/") + "/"
        found = False
        for blob in self._client.list_blobs(self._bucket.name, prefix=prefix):
            if blob.name.endswith("/"):
                continue
            target = Path(local_dir) / blob.name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
            found = True
        if not found:
            raise FileNotFoundError(f"nothing under {self.join(rel)}")


    def download_file(self, rel: str, local_path: str) -> bool:
        blob = self._bucket.get_blob(self._name(rel))
        if blob is None:
            return False
        blob.download_to_filename(local_path)
        return True


def open_store(uri: str, client=None) -> Store:
    """The store for a local path or a gs:// URI."""
    if uri.startswith("gs://"):
        return GcsStore(uri, client)
    if "://" in uri:
        raise ValueError(f"a registry is a local folder or a gs:// URI, got {uri!r}")
    return LocalStore(uri)
