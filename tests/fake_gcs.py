"""An in-memory stand-in for `google.cloud.storage.Client`, at the boundary detpipe uses
(bucket, blob, get_blob, list_blobs, upload/download, generation preconditions). It keeps
what was written; it is the storage, not a made-up answer to a request."""

from __future__ import annotations

import zlib
from pathlib import Path

from google.api_core.exceptions import NotFound, PreconditionFailed


class FakeBlob:
    def __init__(self, bucket: "FakeBucket", name: str):
        self.bucket, self.name = bucket, name

    @property
    def _entry(self):
        return self.bucket.objects.get(self.name)

    @property
    def size(self) -> int:
        return len(self._entry[0])

    @property
    def generation(self) -> int:
        return self._entry[1]

    @property
    def crc32c(self) -> str:  # a stand-in checksum of the bytes
        return format(zlib.crc32(self._entry[0]), "08x")

    def download_as_text(self) -> str:
        if self._entry is None:
            raise NotFound(f"{self.name}")
        return self._entry[0].decode()

    def download_to_filename(self, path: str) -> None:
        Path(path).write_bytes(self._entry[0])

    def upload_from_string(self, data, if_generation_match=None) -> None:
        current = self._entry[1] if self._entry else 0
        if if_generation_match is not None and if_generation_match != current:
            raise PreconditionFailed(f"{self.name}: generation {current}, expected {if_generation_match}")
        self.bucket.next_generation += 1
        self.bucket.objects[self.name] = (data.encode() if isinstance(data, str) else data,
                                          self.bucket.next_generation)

    def upload_from_filename(self, path: str) -> None:
        self.upload_from_string(Path(path).read_bytes())


class FakeBucket:
    def __init__(self, name: str):
        self.name, self.objects, self.next_generation = name, {}, 1000

    def blob(self, name: str) -> FakeBlob:
        return FakeBlob(self, name)

    def get_blob(self, name: str) -> FakeBlob | None:
        return FakeBlob(self, name) if name in self.objects else None


class FakeClient:
    def __init__(self):
        self.buckets: dict[str, FakeBucket] = {}
        self.listings: list[tuple[str, str]] = []

    def bucket(self, name: str) -> FakeBucket:
        return self.buckets.setdefault(name, FakeBucket(name))

    def list_blobs(self, bucket: str, prefix: str = ""):
        self.listings.append((bucket, prefix))
        found = self.bucket(bucket)
        return [FakeBlob(found, n) for n in sorted(found.objects) if n.startswith(prefix)]
