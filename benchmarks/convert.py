"""Benchmark `detpipe data build` against the tools it replaces, and against the machine.

Baselines, on the same images, in the same invocation:
  - the converter: a single-process converter in the style of the TF OD API's
    `create_pascal_tf_record.py` (read the XML and the image bytes, check it is a JPEG with
    PIL, build the Example with the same keys, append it to one TFRecord file). No
    validation beyond that, no statistics, no split, no sharding;
  - the two-step a user would otherwise run: that converter, then TFDV statistics over its
    output (`tfdv.generate_statistics_from_tfrecord`);
  - the decode ceiling: read and fully decode every image (PIL) in one process, times the
    usable CPUs: what any job that must look at every pixel could reach here. Measured in
    each repeat, as the two-step is, just before it.

For each dataset size (default 2,000 and 20,000 demo images) it prints images/s of each,
their ratios, and the job's peak resident memory per process (the driver, and each worker
process, sampled every 0.1 s). Each `detpipe data build` runs as a process of its own, as a
user runs it, and its wall time (start-up included) is what counts. `--workers` runs it
with each worker count given (default: its own choice, and 1 and 2). From the smallest and
largest sizes it also prints each one's start and rate once running (benchmarks/rates.py),
what a dataset larger than those sees.

`--dataset NAME=DIR` (repeatable) runs the same comparison on real photo sets in the VOC
layout (DIR/images, DIR/annotations), e.g. the repository's raccoon set, instead of demo sets.

Usage:
    .venv/bin/python benchmarks/convert.py [--sizes 2000 20000] [--image-size 128 128] [--workdir DIR] [--repeat 3]
    .venv/bin/python benchmarks/convert.py --dataset raccoon=tests/data/raccoon --sizes 1024 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
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


def two_step_seconds(images: Path, annotations: Path, root: Path) -> tuple[int, float, float]:
    """(records, converter seconds, TFDV seconds over its output)."""
    import tensorflow_data_validation as tfdv

    started = time.perf_counter()
    count = baseline_convert(images, annotations, root / "baseline.tfrecord")
    convert_s = time.perf_counter() - started
    started = time.perf_counter()
    tfdv.generate_statistics_from_tfrecord(str(root / "baseline.tfrecord"), output_path=str(root / "baseline-stats.pb"))
    return count, convert_s, time.perf_counter() - started


def decode_seconds(images: Path) -> tuple[int, float]:
    """Read and fully decode every image in this process: (images, seconds)."""
    import PIL.Image

    files = sorted(p for p in images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    started = time.perf_counter()
    for path in files:
        with PIL.Image.open(io.BytesIO(path.read_bytes())) as image:
            image.load()
    return len(files), time.perf_counter() - started


def timed_build(images: Path, annotations: Path, output: Path, workers: int | None) -> dict:
    """One `detpipe data build` in a process of its own: wall seconds, and the peak RSS of the
    driver and of each worker process (its children), in MiB."""
    import psutil

    cmd = [sys.executable, "-m", "pipeline.cli", "data", "build", "--format", "voc", "--images", str(images),
           "--annotations", str(annotations), "--output", str(output), "--max-reject-fraction", "1"]
    if workers:
        cmd += ["--direct-num-workers", str(workers)]
    # Its log goes to a file: a pipe read only after the exit fills up (64 KiB; ~60,000
    # records' progress lines) and the build then blocks on its next log line.
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        driver, peaks = psutil.Process(proc.pid), {}
        while proc.poll() is None:
            try:
                peaks[proc.pid] = max(peaks.get(proc.pid, 0), driver.memory_info().rss)
                for child in driver.children(recursive=True):
                    # ours (beam/local_worker.py) or Beam's own; not the commands that only hand
                    # their job to a worker started early (--attach)
                    command = " ".join(child.cmdline())
                    if (("beam.local_worker" in command and "--attach" not in command) or "sdk_worker_main" in command
                            ) and child.name().startswith("python"):
                        peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.1)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"data build failed ({proc.returncode}): {log.read().decode()[-2000:]}")
    workers_mib = [v / 2**20 for k, v in peaks.items() if k != proc.pid]
    job_s = json.loads((output / "manifest.json").read_text())["seconds"]  # build_dataset's own time
    return {"seconds": wall, "job_seconds": job_s, "driver_mib": peaks.get(proc.pid, 0) / 2**20,
            "worker_mib": workers_mib}


def make_demo(root: Path, count: int, image_size: tuple[int, int]) -> Path:
    from pipeline.demo_data import write_demo_dataset

    target = root / f"demo-{count}-{image_size[0]}-{image_size[1]}"
    if not (target / "coco.json").exists():
        big = image_size[0] > 128
        write_demo_dataset(target, num_train=count, num_val=0, seed=1, image_size=image_size,
                           **({"object_size": (40, 160)} if big else {}))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=(2000, 20000), help="dataset sizes (default 2000 20000)")
    parser.add_argument("--image-size", type=int, nargs=2, default=(128, 128), metavar=("MIN", "MAX"),
                        help="demo image sides in pixels (default 128 128, the built-in demo; e.g. 480 640 for "
                             "photo-sized images)")
    parser.add_argument("--workers", type=int, nargs="+", default=(0, 1, 2),
                        help="worker counts to run the job with (0: its own choice; default 0 1 2)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=DIR",
                        help="also a real VOC photo set (DIR/images, DIR/annotations), e.g. raccoon=tests/data/raccoon")
    parser.add_argument("--workdir", help="keep generated data here (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the two-step and the builds this many times in turn and print each one's ratio and "
                             "their median (this machine's speed moves between runs; default 1)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="detpipe-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    from components.probe.machine_facts import usable_cpus

    cpus = usable_cpus()["usable"]
    memory, own_seconds = {}, {}  # own_seconds[name][size]: seconds without the process start, one per repeat
    ratios: dict[str, list[float]] = {}  # "label, size": the job's own time against the two-step, each repeat
    shares: dict[str, list[float]] = {}  # "label, size": the job's own rate as a share of the ceiling, each repeat
    sets = [(size, make_demo(root, size, tuple(args.image_size)),
             f"{size} demo images ({args.image_size[0]}-{args.image_size[1]} px JPEG)") for size in args.sizes]
    for named in args.dataset:
        name, _, folder = named.partition("=")
        sets.append((name, Path(folder), f"{name} ({folder})"))
    for size, demo, title in sets:
        images, annotations = demo / "images", demo / "annotations"
        print(f"\n== {title}, {cpus} usable CPUs ==")
        for repeat in range(args.repeat):
            if args.repeat > 1:
                print(f"-- repeat {repeat + 1} of {args.repeat}")
            decoded, decode_s = decode_seconds(images)  # in each repeat, as the two-step: the machine's speed moves
            ceiling = decoded / decode_s * cpus
            print(f"decode ceiling (read + full decode, one process x {cpus}): {ceiling:8.1f} images/s")
            count, convert_s, tfdv_s = two_step_seconds(images, annotations, root)
            two_step = count / (convert_s + tfdv_s)
            own_seconds.setdefault("two-step", {}).setdefault(count, []).append(convert_s + tfdv_s)
            print(f"converter (TF OD API style, 1 process):             {count / convert_s:8.1f} images/s")
            print(f"two-step (converter, then TFDV over its output):     {two_step:8.1f} images/s "
                  f"(TFDV {tfdv_s:.1f} s of {convert_s + tfdv_s:.1f} s)")
            for workers in args.workers:
                out = root / f"out-{size}-{workers}"
                shutil.rmtree(out, ignore_errors=True)
                run = timed_build(images, annotations, out, workers or None)
                rate = count / run["seconds"]
                label = f"{workers} worker(s)" if workers else "default workers"
                per_worker = ", ".join(f"{m:.0f}" for m in sorted(run["worker_mib"])) or "in-process"
                job_rate = count / run["job_seconds"]
                print(f"detpipe data build, {label:16s}:             {rate:8.1f} images/s ({run['seconds']:.1f} s "
                      "whole process) = {:.2f}x the two-step, {:.2f}x the converter, {:.0%} of the ceiling; "
                      "peak MiB: driver {:.0f}, workers {}".format(rate / two_step, rate * convert_s / count,
                                                                  rate / ceiling, run["driver_mib"], per_worker))
                print(f"  without the process start (build_dataset's own {run['job_seconds']:.1f} s, as the baselines "
                      f"are timed): {job_rate:.1f} images/s = {job_rate / two_step:.2f}x the two-step, "
                      f"{job_rate / ceiling:.0%} of the ceiling")
                ratios.setdefault(f"{label}, {size} images", []).append(job_rate / two_step)
                shares.setdefault(f"{label}, {size} images", []).append(job_rate / ceiling)
                own_seconds.setdefault(f"data build, {label}", {}).setdefault(count, []).append(run["job_seconds"])
                peak = memory.setdefault(workers, {}).get(size, (0, 0))
                memory[workers][size] = (max([peak[0], run["driver_mib"], *run["worker_mib"]]),
                                         max([peak[1], *run["worker_mib"]]))
    if args.repeat > 1:
        print(f"\nthe job's own time against the two-step's in each of {args.repeat} repeats (median):")
        for name, values in ratios.items():
            print(f"  {name:30s}: {', '.join(f'{v:.2f}x' for v in values)} (median {statistics.median(values):.2f}x)")
        print(f"the job's own rate as a share of the decode ceiling in each of {args.repeat} repeats (median):")
        for name, values in shares.items():
            print(f"  {name:30s}: {', '.join(f'{v:.0%}' for v in values)} (median {statistics.median(values):.0%})")
    if len(args.sizes) > 1 and not args.dataset:
        _print_rates({name: {count: statistics.median(values) for count, values in by_count.items()}
                      for name, by_count in own_seconds.items()})
        small, large = min(args.sizes), max(args.sizes)
        for workers, peaks in memory.items():
            line = (f"peak memory of one process, {large} / {small} images, {workers or 'default'} worker(s): "
                    f"{peaks[large][0] / peaks[small][0]:.2f}x")
            if peaks[small][1]:  # worker processes of their own (not in-process)
                line += f"; of one worker process alone: {peaks[large][1] / peaks[small][1]:.2f}x"
            print(line)


def _print_rates(own_seconds: dict[str, dict[int, float]]) -> None:
    """Each one's start and rate once running from its smallest and largest run (what a
    larger dataset sees), the rates against the two-step's."""
    from benchmarks.rates import start_and_rate

    rates = {}
    print("\nfrom the smallest and largest sizes, without the process start:")
    for name, seconds in own_seconds.items():
        (few, few_s), (many, many_s) = min(seconds.items()), max(seconds.items())
        start, rates[name] = start_and_rate(few, few_s, many, many_s)
        print(f"  {name:30s}: {start:5.1f} s to start, then {rates[name]:8.1f} images/s = "
              f"{rates[name] / rates['two-step']:.2f}x the two-step's")


if __name__ == "__main__":
    main()
