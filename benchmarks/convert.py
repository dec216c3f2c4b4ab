"""Benchmark `detpipe data build` against a plain single-process converter.

The baseline is written in the style of the TF OD API's `create_pascal_tf_record.py`:
read the XML, read the image bytes, check it is a JPEG with PIL, build the Example with
the same keys, and append it to one TFRecord file. It does no validation beyond that,
no statistics, no split and no sharding.

Prints, in one run on the same input:
  - images/s of both and their ratio (detpipe / baseline),
  - the share of detpipe's time that TFDV statistics cost (TFDV run alone over the
    same shards, timed in this process),
  - peak resident memory of `detpipe data build` at two dataset sizes (each in its own
    process) and their ratio.

Usage:
    .venv/bin/python benchmarks/convert.py [--images 2000] [--memory-sizes 1000 10000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the annotation only: the repository goes on sys.path below
    from beam.manifest import Manifest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def baseline_convert(images: Path, annotations: Path, output: Path) -> int:
    """Single-process converter in the TF OD API style; returns records written."""
    import PIL.Image
    import tensorflow as tf

    def feature_bytes(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))

    def feature_floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    def feature_ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    names = sorted({c.text for xml in annotations.glob("*.xml") for c in ET.parse(xml).getroot().iter("name")})
    label_map = {n: i for i, n in enumerate(names, start=1)}
    count = 0
    with tf.io.TFRecordWriter(str(output)) as writer:
        for xml in sorted(annotations.glob("*.xml")):
            root = ET.parse(xml).getroot()
            filename = root.findtext("filename")
            encoded = (images / filename).read_bytes()
            if PIL.Image.open(io.BytesIO(encoded)).format != "JPEG":
                raise ValueError("Image format not JPEG")
            width, height = int(root.findtext("size/width")), int(root.findtext("size/height"))
            xmin, ymin, xmax, ymax, text, label, difficult = [], [], [], [], [], [], []
            for obj in root.findall("object"):
                box = obj.find("bndbox")
                xmin.append(float(box.findtext("xmin")) / width)
                ymin.append(float(box.findtext("ymin")) / height)
                xmax.append(float(box.findtext("xmax")) / width)
                ymax.append(float(box.findtext("ymax")) / height)
                text.append(obj.findtext("name").encode())
                label.append(label_map[obj.findtext("name")])
                difficult.append(int(obj.findtext("difficult") or 0))
            example = tf.train.Example(features=tf.train.Features(feature={
                "image/height": feature_ints([height]), "image/width": feature_ints([width]),
                "image/filename": feature_bytes([filename.encode()]),
                "image/source_id": feature_bytes([filename.encode()]),
                "image/key/sha256": feature_bytes([hashlib.sha256(encoded).hexdigest().encode()]),
                "image/encoded": feature_bytes([encoded]), "image/format": feature_bytes([b"jpeg"]),
                "image/object/bbox/xmin": feature_floats(xmin), "image/object/bbox/xmax": feature_floats(xmax),
                "image/object/bbox/ymin": feature_floats(ymin), "image/object/bbox/ymax": feature_floats(ymax),
                "image/object/class/text": feature_bytes(text), "image/object/class/label": feature_ints(label),
                "image/object/difficult": feature_ints(difficult),
            }))
            writer.write(example.SerializeToString())
            count += 1
    return count


def detpipe_convert(images: Path, annotations: Path, output: Path) -> Manifest:
    from beam.convert_job import ConvertOptions, build_dataset
    from beam.dataset_gates import GateOptions

    result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(output),
                                          gates=GateOptions(max_reject_fraction=1.0)))
    return result.manifest


def tfdv_seconds(shards: Path) -> float:
    """TFDV statistics over the written shards, alone: the cost of the statistics."""
    import tensorflow_data_validation as tfdv

    started = time.perf_counter()
    tfdv.generate_statistics_from_tfrecord(str(shards / "train-*.tfrecord"), output_path=str(shards / "_bench.pb"))
    return time.perf_counter() - started


def peak_memory_mib(images: Path, annotations: Path, output: Path) -> float:
    """Peak RSS of one `detpipe data build` in a process of its own."""
    cmd = [sys.executable, "-m", "pipeline.cli", "data", "build", "--format", "voc", "--images", str(images),
           "--annotations", str(annotations), "--output", str(output), "--max-reject-fraction", "1"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"data build failed with status {status}: {' '.join(cmd)}")
    return usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def make_demo(root: Path, count: int) -> Path:
    from pipeline.demo_data import write_demo_dataset

    target = root / f"demo-{count}"
    if not (target / "coco.json").exists():
        write_demo_dataset(target, num_train=count, num_val=0, seed=1)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000, help="images for the speed comparison (default 2000)")
    parser.add_argument("--memory-sizes", type=int, nargs=2, default=(1000, 10000),
                        help="two dataset sizes for the peak-memory comparison (default 1000 10000)")
    parser.add_argument("--workdir", help="keep generated data here (default: a temporary folder)")
    parser.add_argument("--skip-memory", action="store_true", help="only the speed comparison")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="detpipe-bench-"))
    root.mkdir(parents=True, exist_ok=True)

    demo = make_demo(root, args.images)
    images, annotations = demo / "images", demo / "annotations"
    # Import everything both converters use before timing either: start-up is not throughput.
    import PIL.Image  # noqa: F401
    import tensorflow  # noqa: F401

    import beam.convert_job  # noqa: F401
    started = time.perf_counter()
    count = baseline_convert(images, annotations, root / "baseline.tfrecord")
    base_s = time.perf_counter() - started
    started = time.perf_counter()
    manifest = detpipe_convert(images, annotations, root / "detpipe-out")
    ours_s = time.perf_counter() - started
    stats_s = tfdv_seconds(root / "detpipe-out")
    base_rate, ours_rate = count / base_s, manifest.written_total / ours_s
    print(f"input: {count} demo images (128x128 JPEG) in {root}")
    print(f"baseline single-process converter: {base_s:7.1f} s  {base_rate:7.1f} images/s")
    print(f"detpipe data build (DirectRunner): {ours_s:7.1f} s  {ours_rate:7.1f} images/s")
    print(f"ratio detpipe / baseline: {ours_rate / base_rate:.2f}x")
    print(f"TFDV statistics alone on the same shards: {stats_s:.1f} s = {stats_s / ours_s:.0%} of detpipe's time")

    if args.skip_memory:
        return
    small, large = args.memory_sizes
    mem = {}
    for size in (small, large):
        demo = make_demo(root, size)
        mem[size] = peak_memory_mib(demo / "images", demo / "annotations", root / f"mem-out-{size}")
        print(f"peak memory of data build at {size:>6} images: {mem[size]:8.1f} MiB")
    print(f"peak memory ratio {large} / {small} images: {mem[large] / mem[small]:.2f}x")
    print(f"(this process peak: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
