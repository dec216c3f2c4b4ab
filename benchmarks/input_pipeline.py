"""Benchmark the training input pipeline against a naive one and against this host's ceiling.

All three read the same shards in one run and do the same per-image work where it applies:
  - detpipe: `components.train.input_pipeline.train_dataset` (parallel interleaved reads,
    parallel parse/decode/scale jitter, AUTOTUNE, prefetch), as training uses it; the pixels'
    flip and photometric jitter are left to the train step, as on a GPU host, so they are
    not timed here (`--op-costs` times them on this CPU, per image and on a whole batch);
  - naive: the pipeline of common tutorials with the same parse, resize and augmentation,
    every step per image on the host (`per_image_element`, TensorFlow's own image ops):
    one sequential TFRecordDataset, `map` without parallel calls, no prefetch,
    with tf.data's automatic map parallelization turned off so it is truly sequential;
  - naive-tf: the same code as tf.data runs it by default (TF 2.16 parallelizes stateless
    maps on its own), for reference;
  - detpipe-noaug: the same with augmentation off;
  - ceiling: read + decode + resize with every core and nothing else (no augmentation,
    no boxes, no padding): what this host can feed at most with a whole decode. detpipe and
    the naive pipelines decode a JPEG at 1/2, 1/4 or 1/8 scale when it is that much larger than
    the model needs (records.decode_at_least), so on large photos they can pass it. It hands
    on float32 images in [0, 1], as when the aims were set; detpipe hands on uint8 (a quarter
    of the bytes, finished in the step), so the table also shows
  - ceiling-uint8: the same rounded back to uint8: the ceiling for a pipeline that hands on uint8.

Prints, for each input size the trainer picks (128 for the demo, 320, 512 and 640 for photos),
images/s of each, the ratios detpipe/ceiling (aim >= 85%) and detpipe/naive-tf (aim >= 1.1x),
and the images/s per usable CPU core that a GPU host gets from detpipe. With --op-costs, also
what each step of the per-image work costs on one thread (where an input pipeline's time goes);
with --levers, tf.data's settings one at a time on detpipe's pipeline.

Usage:
    .venv/bin/python benchmarks/input_pipeline.py [--data SHARD_DIR] [--images 1500]
        [--sizes 128,320,512,640] [--batch-size 16] [--batches 40] [--op-costs] [--levers] [--workdir DIR]
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
    """The tutorial pipeline: the same augmentation as detpipe's, all of it per image on the
    host with TensorFlow's own image ops (`per_image_element`), then `padded_batch`. `sequential` also turns off tf.data's automatic map parallelization,
    which TF 2.16 applies by default, so the maps really run one element at a time."""
    import tensorflow as tf

    from components.train import input_pipeline as ip

    ds = tf.data.TFRecordDataset(ip.shard_files(data_dir, "train")).shuffle(1024, seed=0).repeat()
    ds = ds.enumerate().map(lambda i, s: ip.per_image_element(s, i, config))
    return ip._padded_batch(ds, config.batch_size, config.image_size, drop_remainder=True)


def _sequential(ds):
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    return ds.with_options(options)


def ceiling_dataset(data_dir: str, image_size: int, batch_size: int, uint8: bool = False):
    """Read + decode + resize with every core, nothing else: float32 in [0, 1] as the issue's
    ceiling was measured, or with `uint8` rounded back to uint8 as detpipe hands images on."""
    import tensorflow as tf

    from beam.contract import feature_keys as K
    from components.train import augment
    from components.train import input_pipeline as ip

    files = ip.shard_files(data_dir, "train")
    spec = {K.ENCODED: tf.io.FixedLenFeature([], tf.string)}

    def decode_resize(serialized):
        encoded = tf.io.parse_single_example(serialized, spec)[K.ENCODED]
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        if uint8:
            return augment.resize_uint8(image, [image_size, image_size])
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


def best_rates(pipelines: dict, size: int, batches: int, batch: int, repeats: int) -> dict[str, float]:
    """The best images/s of each pipeline (name: a function making it), rounds alternating so a
    noisy moment hurts all alike."""
    best = {name: 0.0 for name in pipelines}
    for round_ in range(repeats):
        for name, make in pipelines.items():
            rate = images_per_second(make(), batches, batch)
            best[name] = max(best[name], rate)
            print(f"{size}px round {round_ + 1}: {name:45s} {rate:8.1f} images/s", flush=True)
    return best


def op_costs(data_dir: str, size: int, repeats: int = 100) -> dict[str, float]:
    """Milliseconds of each step of one training example's work on one thread, on the first
    train image of the shards at `size` (a tf.function per step, so its call overhead, about
    0.1 ms here, is in each figure)."""
    import tensorflow as tf

    from components.detector.records import parse_example
    from components.train import augment
    from components.train import input_pipeline as ip

    serialized = next(iter(tf.data.TFRecordDataset(ip.shard_files(data_dir, "train")[:1])))
    example = parse_example(serialized)
    image, boxes, labels = example["image"], example["boxes"], example["labels"]
    resized = tf.image.resize(image, [size, size])
    seed = tf.constant([1, 2], tf.int64)
    batch = 16
    images = tf.stack([resized] * batch)
    draws = tf.stack([augment.draw(0.25, True, seed + i, seed - i) for i in range(batch)])
    steps = {  # name: (work, images it does)
        "parse + decode": (lambda: parse_example(serialized)["image"], 1),
        "resize to the model": (lambda: tf.image.resize(image, [size, size]), 1),
        "scale jitter (crop/pad + resize)": (
            lambda: augment.scale_jitter(image, boxes, labels, 0.25, seed, size)[0], 1),
        "draws + box flip (host, detpipe)": (
            lambda: augment.flip_boxes(boxes, augment.draw(0.25, True, seed, seed)), 1),
        "x / 255 (per image, naive)": (lambda: resized / 255.0, 1),
        "flip (per image, always, naive)": (lambda: tf.image.flip_left_right(resized), 1),
        "brightness (per image, naive)": (lambda: tf.image.stateless_random_brightness(resized, 0.1, seed), 1),
        "contrast (per image, naive)": (lambda: tf.image.stateless_random_contrast(resized, 0.9, 1.1, seed), 1),
        "clip (per image, naive)": (lambda: tf.clip_by_value(resized, 0.0, 1.0), 1),
        "finish one image (finish_one: on the host, on a CPU without XLA)": (
            lambda: augment.finish_one(resized, draws[0]), 1),
        f"finish a batch of {batch} whole, per image (the train step on a GPU; here on the CPU)": (
            lambda: augment.finish(images, draws), batch),
    }
    costs = {}
    for name, (step, count) in steps.items():
        run = tf.function(step)
        run()
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        costs[name] = 1000 * (time.perf_counter() - started) / repeats / count
    return costs


def measure(data: str, size: int, batch: int, batches: int, repeats: int, strength: float) -> dict[str, float]:
    """The best images/s of each pipeline at one input size, rounds alternating so a noisy
    moment hurts all alike."""
    from components.train.input_pipeline import InputConfig, train_dataset

    config = InputConfig(image_size=size, batch_size=batch, augment_strength=strength)
    pipelines = {
        "detpipe": lambda: train_dataset(data, config),
        "detpipe-noaug": lambda: train_dataset(data, replace(config, augment=False)),
        "naive": lambda: _sequential(naive_dataset(data, config)),
        "naive-tf": lambda: naive_dataset(data, config),
        "ceiling": lambda: ceiling_dataset(data, size, batch),
        "ceiling-uint8": lambda: ceiling_dataset(data, size, batch, uint8=True),
    }
    return best_rates(pipelines, size, batches, batch, repeats)


def _with_options(ds, **settings):
    """`ds` with tf.data options set by dotted name, e.g. threading__max_intra_op_parallelism=1."""
    import tensorflow as tf

    options = tf.data.Options()
    for name, value in settings.items():
        group, field = name.split("__")
        setattr(getattr(options, group), field, value)
    return ds.with_options(options)


def levers(data: str, size: int, batch: int, batches: int, repeats: int, strength: float) -> dict[str, float]:
    """tf.data's performance guide, one lever at a time on detpipe's pipeline (the best images/s
    of each, rounds alternating): the settings training could take, measured here before any is
    kept. Prefetching to the device is Keras' and tf.distribute's job once a GPU is there."""
    from beam.data_workers import usable_cpu_count
    from components.train.input_pipeline import InputConfig, train_dataset

    config = InputConfig(image_size=size, batch_size=batch, augment_strength=strength)
    cores = usable_cpu_count()
    variants = {
        "detpipe (as training runs it)": lambda: train_dataset(data, config),
        f"map parallelism fixed at {cores} (not AUTOTUNE)": lambda: train_dataset(data, replace(config,
                                                                                               parallelism=cores)),
        "one intra-op thread per element": lambda: _with_options(train_dataset(data, config),
                                                                 threading__max_intra_op_parallelism=1),
        f"private thread pool of {cores}": lambda: _with_options(train_dataset(data, config),
                                                                 threading__private_threadpool_size=cores),
        "AUTOTUNE RAM budget 1 GiB": lambda: _with_options(train_dataset(data, config),
                                                           autotune__ram_budget=1 << 30),
        "--cache memory (encoded records)": lambda: train_dataset(data, replace(config, cache="memory")),
        "--deterministic (ordered map)": lambda: train_dataset(data, replace(config, deterministic=True)),
    }
    return best_rates(variants, size, batches, batch, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a folder of train shards (default: demo data written to --workdir)")
    parser.add_argument("--images", type=int, default=1500, help="demo images to write without --data")
    parser.add_argument("--sizes", default="128,320,512,640", help="input sizes, comma-separated")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--augment-strength", type=float, default=0.25, help="the trainer's default")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per pipeline")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds; the best of each is kept")
    parser.add_argument("--op-costs", action="store_true", help="also time each step of one example's work")
    parser.add_argument("--levers", action="store_true",
                        help="also time tf.data's settings one at a time on detpipe's pipeline")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    from beam.data_workers import usable_cpu_count

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-input-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = args.data or str(make_shards(workdir, args.images))
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {size: measure(data, size, args.batch_size, args.batches, args.repeats, args.augment_strength)
               for size in sizes}
    cores = usable_cpu_count()
    print(f"\nshards: {data}; {cores} usable CPUs; batch {args.batch_size}, {args.batches} batches, best of "
          f"{args.repeats}, augment strength {args.augment_strength}")
    print("| input | detpipe | without augmentation | naive | naive-tf | ceiling | detpipe / ceiling "
          "| detpipe / naive-tf | ceiling-uint8 | detpipe / ceiling-uint8 | detpipe per core |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, best in results.items():
        print(f"| {size} px | {best['detpipe']:,.0f}/s | {best['detpipe-noaug']:,.0f}/s | {best['naive']:,.0f}/s "
              f"| {best['naive-tf']:,.0f}/s | {best['ceiling']:,.0f}/s "
              f"| {100 * best['detpipe'] / best['ceiling']:.0f}% (aim >= 85%) "
              f"| {best['detpipe'] / best['naive-tf']:.2f}x (aim >= 1.1x) | {best['ceiling-uint8']:,.0f}/s "
              f"| {100 * best['detpipe'] / best['ceiling-uint8']:.0f}% | {best['detpipe'] / cores:,.0f}/s |")
    if args.levers:
        for size in sizes:
            found = levers(data, size, args.batch_size, args.batches, args.repeats, args.augment_strength)
            base = found["detpipe (as training runs it)"]
            print(f"\n| {size} px: one lever at a time | images/s | against detpipe |\n|---|---|---|")
            for name, rate in found.items():
                print(f"| {name} | {rate:,.0f}/s | {rate / base:.2f}x |")
    if args.op_costs:
        for size in sizes:
            costs = op_costs(data, size)
            print(f"\none example's steps at {size} px, one thread (ms): "
                  + ", ".join(f"{name} {ms:.2f}" for name, ms in costs.items()))


if __name__ == "__main__":
    main()
