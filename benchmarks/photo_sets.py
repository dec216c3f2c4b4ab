"""The photos a benchmark trains on: a folder of images with its annotations, or the synthetic
demo set written once under the work folder. Shared by the benchmarks that take `--images
--annotations | --demo N`."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.demo_data import write_demo_dataset


def add_photo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--images", help="a folder of photos (with --annotations: VOC XML)")
    parser.add_argument("--annotations")
    parser.add_argument("--demo", type=int, default=0, help="a synthetic set of this many images instead")


def photo_paths(args: argparse.Namespace, work: Path) -> tuple[str, str]:
    """The images and annotations to build shards from (the demo set written under `work` once)."""
    if not args.demo:
        if not (args.images and args.annotations):
            raise SystemExit("give --images and --annotations, or --demo N")
        return args.images, args.annotations
    demo = work / "demo"
    if not (demo / "annotations").exists():
        write_demo_dataset(demo, num_train=args.demo - args.demo // 5, num_val=args.demo // 5, seed=11)
    return str(demo / "images"), str(demo / "annotations")
