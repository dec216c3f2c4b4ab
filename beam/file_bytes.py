"""A file's bytes as stored, local or gs://, read the cheap way when there are many to read."""

from __future__ import annotations

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam.contract.images import read_image_file


def read_bytes(path: str, filesystem_of=FileSystems.get_filesystem) -> bytes:
    """The image file's bytes as stored (an image named .gz is not decompressed), local or gs://;
    `FileTooLarge` over the limit every image reader shares."""
    with filesystem_of(path).open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return read_image_file(handle)


class FileSystemOf:
    """`FileSystems.get_filesystem`, once per scheme: each call of Beam's looks through every
    filesystem class again (~20 us, as much as reading a small image)."""

    def __init__(self):
        self._by_scheme: dict[str | None, object] = {}

    def __call__(self, path: str):
        scheme = FileSystems.get_scheme(path)
        if scheme not in self._by_scheme:
            self._by_scheme[scheme] = FileSystems.get_filesystem(path)
        return self._by_scheme[scheme]
