"""Benchmark the data job's Example encoding: the contract's codec (beam/contract/codec.py,
what the job's workers run, one record at a time) against tfx_bsl's C++
`RecordBatchToExamplesEncoder` on the same records, the Arrow batch it needs built from
them included (the job holds one record at a time, not a batch). Prints microseconds a
record, the ratio, and whether the two write the same bytes and the same values.

Usage:
    .venv/bin/python benchmarks/example_coding.py [--records 5000] [--image-kib 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000, help="records encoded (default 5000)")
    parser.add_argument("--image-kib", type=int, default=20, help="size of each record's image bytes (default 20)")
    args = parser.parse_args()

    import pyarrow as pa
    from tfx_bsl.coders import example_coder

    from beam.contract import feature_keys as K
    from beam.contract.codec import BYTES, FEATURE_KINDS, FLOATS, INTS, decode_example, example_bytes

    rng = random.Random(0)

    def features(i: int) -> dict[str, list]:
        n = rng.randint(1, 8)
        coords = {key: [rng.random() for _ in range(n)] for key in K.BOX_KEYS}
        return {K.FORMAT: [b"jpeg"], K.HEIGHT: [480], K.WIDTH: [640], K.FILENAME: [f"f{i}.jpg".encode()],
                K.SOURCE_ID: [f"f{i}".encode()], K.KEY_SHA256: [b"ab" * 32], **coords,
                K.CLASS_TEXT: [b"raccoon"] * n, K.CLASS_LABEL: [1] * n, K.DIFFICULT: [0] * n}

    rows = [features(i) for i in range(args.records)]
    image = b"\xff\xd8" + bytes(args.image_kib * 1024)

    started = time.perf_counter()
    ours = [example_bytes(row, image) for row in rows]
    ours_s = time.perf_counter() - started

    arrow = {BYTES: pa.large_list(pa.large_binary()), FLOATS: pa.large_list(pa.float32()),
             INTS: pa.large_list(pa.int64())}
    started = time.perf_counter()
    columns = {K.ENCODED: pa.array([[image]] * len(rows), arrow[BYTES])}
    columns.update({key: pa.array([row[key] for row in rows], arrow[kind]) for key, kind in FEATURE_KINDS.items()})
    theirs = example_coder.RecordBatchToExamplesEncoder().encode(pa.RecordBatch.from_pydict(dict(sorted(
        columns.items()))))
    theirs_s = time.perf_counter() - started

    per = 1e6 / len(rows)
    print(f"{len(rows)} records of {args.image_kib} KiB images")
    print(f"  contract codec (per record):        {ours_s * per:7.1f} us/record")
    print(f"  tfx_bsl encoder (Arrow batch built): {theirs_s * per:7.1f} us/record  ({theirs_s / ours_s:.2f}x)")
    same_bytes = sum(a == b for a, b in zip(ours, theirs))
    same_values = sum(decode_example(a) == decode_example(b) for a, b in zip(ours, theirs))
    print(f"  same bytes: {same_bytes} of {len(rows)}; same values: {same_values} of {len(rows)}")


if __name__ == "__main__":
    main()
