"""Large photos with small objects: training on tiles at full resolution against whole photos resized.

Writes a generated set of large photos (default 48 photos of 1,600-2,400 px with 10-30 objects
of 10-24 px, three classes; `pipeline.demo_data`'s shapes), builds the shards, and trains the
same detector twice with every other default: `--tile auto` (tiles chosen from the boxes) and
`--tile none` (whole photos shrunk to the input size). Each is evaluated on the whole val
photos (COCO figures in the photos' own pixels). Prints the tiling decision, AP50, mAP, AP75,
per-class AP50 and the training process's CPU seconds of each, in one run. With `--decide
NAME=SHARDS` (repeatable), also what `--tile auto` decides for other datasets (the demo,
raccoon: whole photos expected), for a GPU's and a CPU's budget, without training.

Usage:
    .venv/bin/python benchmarks/tiling.py [--photos 48] [--epochs N] [--workdir DIR]
        [--photo-size 1600,2400] [--object-size 10,24] [--objects 10,30] [--decide NAME=SHARDS ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _pair(text: str) -> tuple[int, int]:
    low, high = (int(v) for v in text.split(","))
    return low, high


def make_shards(workdir: Path, photos: int, photo_size, object_size, objects) -> Path:
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from pipeline.demo_data import write_demo_dataset

    shards = workdir / "shards"
    if not (shards / "manifest.json").exists():
        raw = workdir / "photos"
        write_demo_dataset(raw, num_train=photos, num_val=0, seed=11, object_size=object_size,
                           image_size=photo_size, objects=objects)
        result = build_dataset(ConvertOptions(images=str(raw / "images"), annotations=str(raw / "annotations"),
                                              output=str(shards), val_fraction=0.25))
        if not result.ok:
            raise SystemExit(f"the data build found anomalies: {result.anomalies}")
    return shards


def run(shards: Path, out: Path, tile: str, epochs: int) -> dict:
    """Train and evaluate one way; a run already in `out` (an earlier invocation with the same
    --workdir) is reused, its CPU seconds then unknown (its wall seconds are recorded)."""
    from components.detector.artifacts import CONFIG_FILE, TrainConfigFile
    from components.evaluate.evaluator import evaluate_detector
    from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics
    from components.train.trainer import TrainConfig, train_detector

    cpu = None
    if not (out / "eval" / METRICS_FILE).exists() or not (out / "model" / CONFIG_FILE).exists():
        started = time.process_time()
        # Without tiles the fitted shape refuses such boxes (PoorAnchors): trained anyway, to measure.
        train_detector(TrainConfig(data_dir=str(shards), output_dir=str(out / "model"), epochs=epochs, tile=tile,
                                   allow_poor_anchors=tile == "none"))
        cpu = time.process_time() - started
        evaluate_detector(str(out / "model"), str(shards), str(out / "eval"))
    written = TrainConfigFile.read(out / "model")
    return {"tiling": written.result.get("decisions", {}).get("tiling", ""), "tiled": written.tiling,
            "image_size": written.image_size, "cpu": cpu, "wall": written.result.get("seconds", float("nan")),
            "metrics": EvalMetrics.read(out / "eval" / METRICS_FILE).metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=int, default=48, help="generated photos (a quarter go to val); 0: only "
                        "--decide")
    parser.add_argument("--epochs", type=int, default=None, help="default: train's (every default)")
    parser.add_argument("--photo-size", type=_pair, default=(1600, 2400), help="MIN,MAX side in pixels")
    parser.add_argument("--object-size", type=_pair, default=(10, 24), help="MIN,MAX object side in pixels")
    parser.add_argument("--objects", type=_pair, default=(10, 30), help="MIN,MAX objects per photo")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--decide", action="append", default=[], metavar="NAME=SHARDS",
                        help="also print --tile auto's decision for these shards (repeatable)")
    args = parser.parse_args()
    args.epochs = args.epochs or 10  # the default before time budgets (its figures in docs/measurements.md)

    from beam.contract.label_map import read_dataset_label_map
    from components.detector.tile_counts import count_tiles

    for name, shards in (item.split("=", 1) for item in args.decide):
        decided = count_tiles(shards, read_dataset_label_map(shards), "auto", splits=("train",))
        for device, why in decided["whole"].items():
            print(f"{name} on a {device}: {why}")
        for layout in decided["layouts"]:
            print(f"{name} on a {' or '.join(layout['devices'])}: {layout['reason']}")
    if not args.photos:
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-tiling-"))
    shards = make_shards(workdir, args.photos, args.photo_size, args.object_size, args.objects)
    results = {tile: run(shards, workdir / f"tile-{tile}", tile, args.epochs) for tile in ("auto", "none")}
    classes = sorted(k[len("AP50/"):] for k in results["auto"]["metrics"] if k.startswith("AP50/"))
    print(f"\n{args.photos} photos of {args.photo_size[0]}-{args.photo_size[1]} px, objects of "
          f"{args.object_size[0]}-{args.object_size[1]} px, {args.epochs} epochs; shards: {shards}")
    for tile, found in results.items():
        print(f"--tile {tile}: {found['tiling'] or 'whole photos'}")
    print("| run | input | train CPU s | train wall s | AP50 | mAP | AP75 | " + " | ".join(f"AP50 {c}" for c in classes) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(classes))
    for tile, found in results.items():
        m = found["metrics"]
        shape = f"tiles of {found['tiled'].tile}px" if found["tiled"] else f"whole, {found['image_size']}px"
        cpu = "reused" if found["cpu"] is None else f"{found['cpu']:.0f}"
        print(f"| --tile {tile} | {shape} | {cpu} | {found['wall']:.0f} | {m['AP50']:.3f} | {m['mAP']:.3f} | {m['AP75']:.3f} | "
              + " | ".join(f"{m.get(f'AP50/{c}', float('nan')):.3f}" for c in classes) + " |")


if __name__ == "__main__":
    main()
