"""Files a stranger can send: pictures that are small on disk and huge once decoded."""

import struct
import zlib


def black_png(width: int, height: int) -> bytes:
    """A real black 1-bit PNG of any size, a few kB to a few hundred: the picture a zip bomb
    sends. Written row by row with zlib (Pillow would hold the whole picture to save it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    pack, row, rows = zlib.compressobj(9), bytes(1 + (width + 7) // 8), []
    for _ in range(height):
        rows.append(pack.compress(row))
    rows.append(pack.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1 bit, greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(rows)) + chunk(b"IEND", b"")
