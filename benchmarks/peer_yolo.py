"""detpipe against the peer its users would pick instead: Ultralytics YOLO trained from its YAML
on the same photos and split, on this machine, for the same minutes, scored by the same COCO
evaluator on the same test photos (issue 88).

For each seed the photos are built into shards as the other benchmarks build them (val 20% by
the hash split of that seed: the test photos, which no choice on either side reads). Then, each
on this machine alone:
- detpipe: `--time-budget M` for each `--minutes` M, every other default (its held-out carve of
  train, its curve, its refit: `train_and_refit`, what the pipeline's train step runs), scored by
  `evaluate_detector` on the test photos;
- the peer: `YOLO("<model>.yaml").train(time=M/60, imgsz=..., batch=...)` (its own length rule),
  its val set the same carve of train detpipe's curve holds out (`carve_tuning_split`, same share
  and seed), its train set the rest; its `best.pt` predicts the test photos at conf 0.001 (its
  own evaluation setting) and those detections go through detpipe's `coco_box_metrics` against
  the test records' boxes;
- with `--converge-epochs N` (0: skip) the peer trained to convergence: N epochs, no time limit;
- with `--variant mosaic=true,orientations=any` (training settings as `--param` takes them), a
  second detpipe row per budget with those settings (what a recipe change buys beside the peer).

The peer runs in an environment of its own that this script builds once under `--env`
(`PEER_PACKAGES`, pip; torch from this machine's disk where it lies there), never a dependency
of detpipe, never read by `make test`; its code is `benchmarks/peer/yolo_run.py`. Ultralytics
runs offline (YOLO_OFFLINE, its settings under the work folder, a local font for its plots).

Trained models and scores are kept under --work and reused by a rerun with the same options.
Prints per seed and the mean over seeds: test mAP / AP50 / AP75 of both, the ratio, wall seconds
and epochs. Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/peer_yolo.py --images tests/data/raccoon/images \\
        --annotations tests/data/raccoon/annotations --seeds 0,1,2 --minutes 10,25 \\
        --work /tmp/peer_raccoon --env /work/bench_env/peer
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ as a package

import tensorflow as tf  # noqa: E402

from beam.contract import feature_keys as K  # noqa: E402
from beam.contract.label_map import read_dataset_label_map  # noqa: E402
from beam.convert_job import build_dataset  # noqa: E402
from beam.options import ConvertOptions  # noqa: E402
from benchmarks.photo_sets import add_photo_options, photo_paths  # noqa: E402
from benchmarks.seed_tables import per_seed_line  # noqa: E402
from benchmarks.time_budget import VAL_FRACTION, trained  # noqa: E402
from components.detector.coco_metrics import ImageDetections, ImageTruth, coco_box_metrics  # noqa: E402
from components.detector.holdout import FIT, HELD_OUT, carve_tuning_split  # noqa: E402
from components.detector.records import parse_boxes, read_records, shard_files  # noqa: E402
from components.train.config import TrainConfig  # noqa: E402
from components.train.refit import train_and_refit  # noqa: E402
from pipeline.params import typed_values  # noqa: E402

# The peer's environment: pinned, so a rerun measures the same peer. torch and torchvision at the
# releases this machine keeps on disk (/work/.library/env: pip takes them from there).
PEER_PACKAGES = ("torch==2.14.1", "torchvision==0.29.1", "ultralytics==8.4.190")
PEER_RUNNER = Path(__file__).resolve().parent / "peer" / "yolo_run.py"
PEER_BATCH = 16  # Ultralytics' default batch
METRICS = ("mAP", "AP50", "AP75")


def peer_python(env: Path) -> Path:
    """The peer environment's Python, built with `PEER_PACKAGES` the first time."""
    python = env / "bin" / "python"
    if not python.exists():
        print(f"building the peer's environment in {env} ({', '.join(PEER_PACKAGES)}) ...", flush=True)
        subprocess.run(["python3", "-m", "venv", str(env)], check=True)  # the system Python: pip finds torch on disk
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    return python


def _peer_environ(work: Path, python: Path) -> dict[str, str]:
    """Ultralytics offline: its settings under `work`, and the font its dataset check asks for
    there already (it would download Arial.ttf): matplotlib's DejaVu Sans from the peer's env."""
    config = work / "ultralytics-config"
    config.mkdir(parents=True, exist_ok=True)
    font = config / "Arial.ttf"
    if not font.exists():
        found = sorted(python.parent.parent.glob("lib/python*/site-packages/matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf"))
        if found:
            shutil.copyfile(found[0], font)
    return {**os.environ, "YOLO_CONFIG_DIR": str(config), "YOLO_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def _write_yolo_split(files: list[str], folder: Path) -> list[str]:
    """The records' photos (their own encoded bytes) and YOLO label files (0-based class, centre
    x, centre y, width, height, normalised) under `folder`/images and /labels; the photo paths."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "labels").mkdir(parents=True, exist_ok=True)
    paths = []
    for index, serialized in enumerate(read_records(files, deterministic=True)):
        example = tf.train.Example.FromString(serialized.numpy()).features.feature
        # The record's place and key: byte-identical photos (one key) stay two files, each its labels.
        key = f"{index:05d}-{example[K.KEY_SHA256].bytes_list.value[0].decode()[:16]}"
        fmt = example[K.FORMAT].bytes_list.value[0].decode().lower().replace("jpg", "jpeg")
        image = folder / "images" / f"{key}.{'jpg' if fmt == 'jpeg' else fmt}"
        image.write_bytes(example[K.ENCODED].bytes_list.value[0])
        boxes = parse_boxes(serialized)
        lines = [f"{int(label) - 1} {(x0 + x1) / 2:.6f} {(y0 + y1) / 2:.6f} {x1 - x0:.6f} {y1 - y0:.6f}"
                 for (y0, x0, y1, x1), label in zip(boxes["boxes"].numpy().tolist(), boxes["labels"].numpy().tolist())]
        (folder / "labels" / f"{key}.txt").write_text("".join(line + "\n" for line in lines))
        paths.append(str(image))
    return paths


def yolo_dataset(data: Path, carve: Path, out: Path) -> tuple[Path, list[str]]:
    """The peer's dataset: train = the fit part of the carve, val = its held-out part, test =
    the data's val split; its data.yaml and the test photo paths in the test records' order."""
    yaml = out / "data.yaml"
    test_list = out / "test.json"
    if not yaml.exists():
        _write_yolo_split(shard_files(str(carve), FIT), out / "train")
        _write_yolo_split(shard_files(str(carve), HELD_OUT), out / "val")
        test_list.write_text(json.dumps(_write_yolo_split(shard_files(str(data), "val"), out / "test")))
        names = {index - 1: name for name, index in sorted(read_dataset_label_map(str(data)).items(), key=lambda kv: kv[1])}
        yaml.write_text(f"path: {out}\ntrain: train/images\nval: val/images\nnames:\n"
                        + "".join(f"  {i}: {json.dumps(n)}\n" for i, n in names.items()))
    return yaml, json.loads(test_list.read_text())


def test_truths(data: Path) -> list[ImageTruth]:
    """The test photos' boxes, in record order (image ids 1..n), as detpipe's evaluator reads them."""
    truths = []
    for serialized in read_records(shard_files(str(data), "val"), deterministic=True):
        boxes = parse_boxes(serialized)
        truths.append(ImageTruth(len(truths) + 1, int(boxes["height"]), int(boxes["width"]),
                                 [tuple(b) for b in boxes["boxes"].numpy().tolist()],
                                 [int(v) for v in boxes["labels"].numpy().tolist()]))
    return truths


def peer_trained(python: Path, environ: dict, yaml: Path, test_paths: list[str], data: Path, out: Path,
                 args: argparse.Namespace, seed: int, minutes: float | None, name: str) -> dict:
    """Train (or reuse) the peer and score its test detections with detpipe's evaluator."""
    record = out / "bench.json"
    if record.exists():
        return json.loads(record.read_text())
    out.mkdir(parents=True, exist_ok=True)
    request = {"model": args.peer_model, "data": str(yaml), "imgsz": args.imgsz, "batch": PEER_BATCH, "seed": seed,
               "minutes": minutes, "epochs": args.converge_epochs or 100, "workers": 2, "project": str(out),
               "name": "run", "test_images": test_paths, "out": str(out / "peer.json")}
    began = time.monotonic()
    subprocess.run([str(python), str(PEER_RUNNER), json.dumps(request)], check=True, env=environ,
                   stdout=(out / "peer.log").open("w"), stderr=subprocess.STDOUT)
    seconds = time.monotonic() - began
    peer = json.loads((out / "peer.json").read_text())
    by_file = {d["file"]: d for d in peer["detections"]}
    detections = []
    for image_id, path in enumerate(test_paths, start=1):
        found = by_file.get(Path(path).name, {"boxes": [], "scores": [], "classes": []})
        detections.append(ImageDetections(image_id, [(y0, x0, y1, x1) for x0, y0, x1, y1 in found["boxes"]],
                                          found["scores"], [c + 1 for c in found["classes"]]))
    names = {index: label for label, index in read_dataset_label_map(str(data)).items()}
    metrics = coco_box_metrics(test_truths(data), detections, names)
    row = {"metrics": {k: metrics[k] for k in METRICS}, "seconds": round(seconds, 1),
           "train_seconds": peer["train_seconds"], "epochs": peer["epochs"]}
    record.write_text(json.dumps(row))
    print(f"  {name}: test mAP {metrics['mAP']:.4f} AP50 {metrics['AP50']:.4f} AP75 {metrics['AP75']:.4f}, "
          f"{seconds:.0f} s, {peer['epochs']} epochs", flush=True)
    return row


def run_seed(images: str, annotations: str, seed: int, work: Path, minutes: list[float],
             args: argparse.Namespace, python: Path, environ: dict) -> dict:
    data = work / f"data-{seed}"
    if not (data / "manifest.json").exists():
        build_dataset(ConvertOptions(images=images, annotations=annotations, output=str(data), seed=seed,
                                     val_fraction=VAL_FRACTION))
    base = TrainConfig(data_dir=str(data), output_dir="", seed=seed)
    carve = work / f"carve-{seed}"
    carve_tuning_split(str(data), str(carve), base.holdout, seed)
    yaml, test_paths = yolo_dataset(data, carve, work / f"yolo-{seed}")
    print(f"seed {seed}:", flush=True)
    rows = {}
    variant = typed_values(args.variant.split(",")) if args.variant else {}
    tag = "-".join(f"{k}={v}" for k, v in variant.items())
    for m in minutes:
        rows[f"detpipe {m:g}m"] = trained(replace(base, output_dir=str(work / f"detpipe-{m:g}m-{seed}"),
                                                  time_budget=f"{m:g}m"), f"detpipe {m:g}m", train=train_and_refit)
        if variant:
            rows[f"detpipe {m:g}m {tag}"] = trained(
                replace(base, output_dir=str(work / f"detpipe-{m:g}m-{tag}-{seed}"), time_budget=f"{m:g}m", **variant),
                f"detpipe {m:g}m {tag}", train=train_and_refit)
        rows[f"peer {m:g}m"] = peer_trained(python, environ, yaml, test_paths, data, work / f"peer-{m:g}m-{seed}",
                                            args, seed, m, f"peer {m:g}m")
    if args.converge_epochs:
        label = f"peer {args.converge_epochs} epochs"
        rows[label] = peer_trained(python, environ, yaml, test_paths, data,
                                   work / f"peer-{args.converge_epochs}ep-{seed}", args, seed, None, label)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_photo_options(parser)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--minutes", default="10,25", help="training budgets in minutes, both sides")
    parser.add_argument("--converge-epochs", type=int, default=0,
                        help="also the peer trained this many epochs with no time limit (its convergence); 0: skip")
    parser.add_argument("--peer-model", default="yolov8n.yaml", help="the peer's model YAML (yolo11n.yaml, ...)")
    parser.add_argument("--imgsz", type=int, default=320, help="the peer's input size")
    parser.add_argument("--variant", default="", help="KEY=VALUE,... training settings of a second detpipe row")
    parser.add_argument("--work", required=True)
    parser.add_argument("--env", required=True, help="the peer's environment (built here the first time)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    python = peer_python(Path(args.env))
    environ = _peer_environ(work, python)
    images, annotations = photo_paths(args, work)
    seeds = [int(s) for s in args.seeds.split(",")]
    minutes = [float(m) for m in args.minutes.split(",")]
    results = {seed: run_seed(images, annotations, seed, work, minutes, args, python, environ) for seed in seeds}
    names = list(results[seeds[0]])
    print(f"\nmean over seeds {', '.join(map(str, seeds))} (test photos: the val split, which no choice read); "
          f"peer {args.peer_model} at {args.imgsz} px")
    print("| training | test mAP | AP50 | AP75 | wall s | epochs | mAP / peer's at the same minutes |")
    print("|---|---|---|---|---|---|---|")
    mean = {name: {k: statistics.mean(results[s][name]["metrics"][k] for s in seeds) for k in METRICS}
            for name in names}
    for name in names:
        rows = [results[s][name] for s in seeds]
        peer = "peer " + name.split()[1] if name.startswith("detpipe") else ""
        ratio = f"{mean[name]['mAP'] / mean[peer]['mAP']:.2f}x" if peer in mean and mean[peer]["mAP"] else ""
        print(f"| {name} | {mean[name]['mAP']:.4f} | {mean[name]['AP50']:.4f} | {mean[name]['AP75']:.4f} | "
              f"{statistics.mean(r['seconds'] for r in rows):.0f} | {statistics.mean(r['epochs'] for r in rows):.1f} | "
              f"{ratio} |")
    print(per_seed_line(results, seeds, names))


if __name__ == "__main__":
    main()
