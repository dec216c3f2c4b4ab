"""Benchmark warm-started retraining against retraining from scratch, as a scheduled run
meets it: a champion trained on the demo, then 20% new images, then a challenger trained
from scratch and one warm-started from the champion, each compared with the champion on
the same (new) val split by the pipeline's own evaluation and promotion rule.

Steps (plain functions, in this process, every option at its default unless named):
  1. `demo-data` (make run's 2,048 + 256 images, or --images N) under --work;
     the base set is the first 5/6 of the images, so the full set adds 20% new ones.
  2. The base set built and a champion trained --epochs (8) from scratch, exported,
     evaluated and registered as v1 (the first version: blessed when it beats the
     box-prior baseline) in a registry under --work.
  3. The full set built against the champion's label map, as the data step does.
  4. Challengers on the full set: from scratch (--epochs), warm-started with the default
     fine-tuning epochs, and warm-started for --warm-epochs (2) as the issue describes.
     Each is scored with the champion re-scored on the same val images, and decided on
     (not_worse, the pipeline's default rule).

Prints for each model: epochs, steps, train seconds (the train function's wall time),
process CPU seconds during training, the ratio of each to the champion's, mAP/AP50/AP75
on the full val split and the decision. Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/warm_start.py [--work /tmp/warm_start] [--epochs 8] [--warm-epochs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from beam.convert_job import build_dataset
from beam.options import ConvertOptions
from components.detector.artifacts import TrainConfigFile
from components.evaluate.champion import evaluate_against_champion
from components.evaluate.metrics_file import METRICS_FILE
from components.export.saved_model import export_trained
from components.registry.decision import PromotionRule
from components.registry.register import register_run
from components.registry.registry import Registry
from components.registry.warm_source import warm_source
from components.train.trainer import TrainConfig, train_detector
from pipeline.demo_data import write_demo_dataset

VAL_FRACTION = 0.1  # make run's
NEW_SHARE = 0.2  # the full set has this many more images than the base set


@dataclass
class Row:
    name: str
    epochs: int
    steps: int
    seconds: float
    cpu_seconds: float
    metrics: dict
    decision: str


def _subset(images: Path, annotations: Path, out: Path, count: int) -> tuple[Path, Path]:
    """The first `count` images (by name) and their annotations, as links under `out`."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    for path in sorted(images.iterdir())[:count]:
        for source, folder in ((path, "images"), (annotations / f"{path.stem}.xml", "annotations")):
            target = out / folder / source.name
            if not target.exists():
                os.symlink(source.resolve(), target)
    return out / "images", out / "annotations"


def _build(images: Path, annotations: Path, out: Path, base_label_map: dict | None = None) -> Path:
    if not (out / "manifest.json").exists():
        result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                              val_fraction=VAL_FRACTION, base_label_map=base_label_map))
        if not result.ok:
            raise SystemExit("dataset anomalies: " + "; ".join(result.anomalies))
    return out


def _train(config: TrainConfig) -> tuple[float, float, dict]:
    started, cpu = time.monotonic(), time.process_time()
    result = train_detector(config)
    return time.monotonic() - started, time.process_time() - cpu, result.to_dict()


def _decide(name: str, model: Path, data: Path, work: Path, registry: Registry, champion: str, seconds: float,
            cpu: float, result: dict) -> Row:
    evaluation = work / f"eval-{name}"
    metrics, record = evaluate_against_champion(str(model), str(data), str(evaluation),
                                                PromotionRule("not_worse", 0.01, 0.0), registry=registry.store.uri,
                                                model_name=registry.model_name, champion=champion)
    epochs = result["steps"] // max(1, result["num_train"] // result["batch_size"])
    return Row(name, epochs, result["steps"], seconds, cpu, metrics.metrics,
               f"{record.verdict}: {record.reason}"), record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "warm_start"))
    parser.add_argument("--images", type=int, default=2304, help="demo images in all (default 2,304: make run's)")
    parser.add_argument("--epochs", type=int, default=8, help="epochs from scratch (default 8: make run's)")
    parser.add_argument("--warm-epochs", type=int, default=2, help="the second warm start's epochs (default 2)")
    args = parser.parse_args()
    work = Path(args.work)
    demo = work / "demo"
    if not (demo / "images").is_dir():
        write_demo_dataset(demo, num_train=args.images, num_val=0)
    base_count = round(args.images / (1 + NEW_SHARE))
    base_images, base_annotations = _subset(demo / "images", demo / "annotations", work / "base", base_count)
    base = _build(base_images, base_annotations, work / "base_shards")
    registry = Registry.open(str(work / "registry"))

    champion_dir = work / "champion"
    if not (champion_dir / "model.keras").exists():
        seconds, cpu, result = _train(TrainConfig(str(base), str(champion_dir), epochs=args.epochs))
        (work / "champion_time.json").write_text(json.dumps({"seconds": seconds, "cpu": cpu, "result": result}))
    timing = json.loads((work / "champion_time.json").read_text())
    if not registry.champion_version():
        _, first = evaluate_against_champion(str(champion_dir), str(base), str(work / "eval-champion-base"),
                                             PromotionRule("not_worse", 0.01, 0.0), registry=registry.store.uri)
        export_trained(str(champion_dir), str(work / "champion_saved"),
                       metrics_file=str(work / "eval-champion-base" / METRICS_FILE))
        done = register_run(registry, str(work / "champion_saved"), str(base),
                            str(work / "eval-champion-base" / METRICS_FILE), first, {"sha256": "base"}, "champion",
                            train_dir=str(champion_dir))
        if done.status != "blessed":
            raise SystemExit(f"the champion was not blessed: {done.reason}")
    champion = registry.champion_version()

    label_map = TrainConfigFile.read(champion_dir).label_map
    full = _build(demo / "images", demo / "annotations", work / "full_shards", base_label_map=label_map)
    rows = [_decide("champion", champion_dir, full, work, registry, "", timing["seconds"], timing["cpu"],
                    timing["result"])[0]]
    rows[0].decision = f"{champion}, trained on the base set"
    runs = [("from scratch", {"init_note": "the from-scratch challenger (warm_start never)"}),
            ("warm start, default epochs", {}),
            (f"warm start, {args.warm_epochs} epochs", {"fine_tune_epochs": args.warm_epochs})]
    for name, options in runs:
        out = work / name.replace(" ", "_").replace(",", "")
        with tempfile.TemporaryDirectory() as fetched:
            if "init_note" not in options:
                source = warm_source("auto", registry, champion, fetched)
                options = {"init_from": source.folder, "init_name": source.name, "init_note": source.note, **options}
            seconds, cpu, result = _train(TrainConfig(str(full), str(out), epochs=args.epochs, **options))
        print(f"{name}: {result['warm_start']['line']}", flush=True)
        rows.append(_decide(name, out, full, work, registry, champion, seconds, cpu, result)[0])

    print(f"\ndemo: base {base_count} images, full {args.images} (+{NEW_SHARE:.0%}); val split of the full set")
    print("| model | epochs | steps | train s | CPU s | time / champion's | mAP | AP50 | AP75 | decision |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        m = row.metrics
        print(f"| {row.name} | {row.epochs} | {row.steps} | {row.seconds:.0f} | {row.cpu_seconds:.0f} | "
              f"{row.seconds / rows[0].seconds:.2f} (CPU {row.cpu_seconds / rows[0].cpu_seconds:.2f}) | "
              f"{m['mAP']:.3f} | {m['AP50']:.3f} | {m['AP75']:.3f} | {row.decision} |")


if __name__ == "__main__":
    main()
