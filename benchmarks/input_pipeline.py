"""Benchmark the training input pipeline against a naive one and against this host's ceiling.

All three read the same shards in one run and do the same per-image work where it applies:
  - detpipe: `components.train.input_pipeline.train_dataset` (parallel interleaved reads,
    parallel parse/decode/augment, AUTOTUNE, prefetch), as training uses it;
  - naive: the pipeline of common tutorials with the same parse, resize and augmentation
    functions: one sequential TFRecordDataset, `map` without parallel calls, no prefetch,
    with tf.data's automatic map parallelization turned off so it is truly sequential;
  - naive-tf: the same code as tf.data runs it by default (TF 2.16 parallelizes stateless
    maps on its own), for reference;
  - detpipe-noaug: the same with augmentation off;
  - ceiling: read + decode + resize with every core and nothing else (no augmentation,
    no boxes, no padding): what this host can feed at most.

Prints images/s of each and the ratios detpipe/naive (aim >= 1.8x on 2 cores) and
detpipe/ceiling (aim >= 85%).

Usage:
    .venv/bin/python benchmarks/input_pipeline.py [--data SHARD_DIR] [--images 1500]
        [--image-size 128] [--batch-size 16] [--batches 60] [--workdir DIR]
Without --data it writes the demo dataset and converts it first (not timed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TensorFlow is imported where it runs, after the options are read
    import tensorflow as tf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_shards(workdir: Path, count: int) -> Path:
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from pipeline.demo_data import write_demo_dataset

    shards = workdir / f"shards-{count}"
    if not (shards / "manifest.json").exists():
        demo = workdir / f"demo-{count}"
        write_demo_dataset(demo, num_train=count, num_val=0, seed=1)
        build_dataset(ConvertOptions(images=str(demo / "images"), annotations=str(demo / "annotations"),
                                     output=str(shards), val_fraction=0.0))
    return shards


def naive_dataset(data_dir: str, config) -> "tf.data.Dataset":
    """The tutorial pipeline: the same per-image and per-batch work as detpipe's, done one
    element at a time. `sequential` also turns off tf.data's automatic map parallelization,
    which TF 2.16 applies by default, so the maps really run one element at a time."""
    import tensorflow as tf

    from components.train import input_pipeline as ip

    ds = tf.data.TFRecordDataset(ip.shard_files(data_dir, "train")).shuffle(1024, seed=0).repeat()
    ds = ds.enumerate().map(lambda i, s: ip._train_element(s, i, config))
    return ip._padded_batch(ds, config.batch_size, config.image_size, drop_remainder=True)


def _sequential(ds):
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    return ds.with_options(options)


def ceiling_dataset(data_dir: str, image_size: int, batch_size: int):
    """Read + decode + resize with every core, nothing else."""
    import tensorflow as tf

    from beam.contract import feature_keys as K
    from components.train import input_pipeline as ip

    files = ip.shard_files(data_dir, "train")
    spec = {K.ENCODED: tf.io.FixedLenFeature([], tf.string)}

    def decode_resize(serialized):
        encoded = tf.io.parse_single_example(serialized, spec)[K.ENCODED]
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        return tf.image.resize(image, [image_size, image_size]) / 255.0

    ds = tf.data.Dataset.from_tensor_slices(files).repeat().interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False)
    ds = ds.map(decode_resize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def images_per_second(ds, batches: int, batch_size: int, warmup: int = 5) -> float:
    iterator = iter(ds)
    for _ in range(warmup):  # fill buffers, let AUTOTUNE settle
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a folder of train shards (default: demo data written to --workdir)")
    parser.add_argument("--images", type=int, default=1500, help="demo images to write without --data")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--augment-strength", type=float, default=0.5)
    parser.add_argument("--batches", type=int, default=60, help="timed batches per pipeline")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds; the best of each is kept")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    from components.train.input_pipeline import InputConfig, train_dataset

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-input-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = args.data or str(make_shards(workdir, args.images))
    size, batch = args.image_size, args.batch_size
    config = InputConfig(image_size=size, batch_size=batch, augment_strength=args.augment_strength)
    pipelines = {
        "detpipe": lambda: train_dataset(data, config),
        "detpipe-noaug": lambda: train_dataset(data, replace(config, augment=False)),
        "naive": lambda: _sequential(naive_dataset(data, config)),
        "naive-tf": lambda: naive_dataset(data, config),
        "ceiling": lambda: ceiling_dataset(data, size, batch),
    }
    best = {name: 0.0 for name in pipelines}
    for round_ in range(args.repeats):  # alternate so a noisy moment hurts all three alike
        for name, make in pipelines.items():
            rate = images_per_second(make(), args.batches, batch)
            best[name] = max(best[name], rate)
            print(f"round {round_ + 1}: {name:13s} {rate:8.1f} images/s", flush=True)
    print(f"\nshards: {data}; {os.cpu_count()} CPUs; {size}px, batch {batch}, {args.batches} batches, "
          f"best of {args.repeats}")
    for name, rate in best.items():
        print(f"  {name:13s} {rate:8.1f} images/s")
    print(f"detpipe / naive:    {best['detpipe'] / best['naive']:.2f}x (aim >= 1.8x)")
    print(f"detpipe / naive-tf: {best['detpipe'] / best['naive-tf']:.2f}x "
          "(the same code with TF's default automatic map parallelization)")
    print(f"detpipe / ceiling: {100 * best['detpipe'] / best['ceiling']:.0f}% (aim >= 85%)")
    print(f"detpipe without augmentation / ceiling: {100 * best['detpipe-noaug'] / best['ceiling']:.0f}% "
          "(the same work as the ceiling plus boxes, shuffling and padding)")


if __name__ == "__main__":
    main()
