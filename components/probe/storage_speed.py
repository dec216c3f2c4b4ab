"""Read speed of the real shards, and how much the training input needs.

Reads whole records for a few seconds (local path or gs:// through tf.io), so the
figure includes the file system the training job will actually read from.
"""

from __future__ import annotations

import time

import tensorflow as tf

from beam.contract.shard_names import ANY_SHARD


def measure_read_speed(data_dir: str, seconds: float = 3.0) -> dict:
    """MB/s and records/s reading the shards of `data_dir` for about `seconds`."""
    files = sorted(tf.io.gfile.glob(f"{data_dir.rstrip('/')}/{ANY_SHARD}"))
    if not files:
        return {"measured": False, "reason": f"no {ANY_SHARD} shards in {data_dir}"}
    records = size = 0
    started = time.perf_counter()
    for path in files:
        compression = "GZIP" if path.endswith(".gz") else ""
        for record in tf.data.TFRecordDataset(path, compression_type=compression):
            records += 1
            size += len(record.numpy())
            if time.perf_counter() - started > seconds:
                break
        if time.perf_counter() - started > seconds:
            break
    elapsed = max(time.perf_counter() - started, 1e-9)
    return {"measured": True, "data_dir": data_dir, "records": records, "bytes": size, "seconds": round(elapsed, 3),
            "mb_per_s": round(size / elapsed / 1e6, 2), "records_per_s": round(records / elapsed, 1),
            "mean_record_bytes": int(size / records) if records else 0}


def needed_mb_per_s(images_per_second: float, mean_record_bytes: int) -> float:
    """Read rate the trainer needs at `images_per_second` (one record per image)."""
    return images_per_second * mean_record_bytes / 1e6
