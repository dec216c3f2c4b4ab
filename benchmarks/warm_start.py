"""Benchmark warm-started retraining against retraining from scratch, as a scheduled run meets
it, on real photos (a VOC folder: `--images DIR --annotations DIR`, e.g. raccoon) or the demo,
over seeds. For each seed, every option at its default unless named:

  champions   `base`: trained from scratch (--epochs) on the first 1/(1 + --new-share) of the
              images (by name; 5/6 at the default 0.2);
              `full`: the same on all of them. Each is registered in its own registry as v1.
  unchanged   a retrain on the champion `full`'s own files: from scratch (another seed) and
              warm-started from it (the pipeline's schedule), each decided against it.
  20% new     a retrain on all the images (the last 1/6 are new; --new-share 0.2: 20% more
              than the champion saw) against the champion `base`:
              from scratch (that is `full`'s training) and warm-started from `base`.

Each challenger is scored with its champion re-scored on the same val images (the full set's
val split; the hash split keeps the base set's val images in it) by the pipeline's own
evaluation and its default rule (not_worse, max regression 0.01). Prints per seed and on
average: mAP, AP75, their difference from the champion, the training's CPU seconds and its
ratio to the from-scratch retrain's, and the decision. Nothing asserts on time.

`--warm-share`, `--warm-lr` and `--warm-ema` try another warm-start schedule
(components/train/plan.py's FINE_TUNE_EPOCH_SHARE, FINE_TUNE_LR_SHARE and FINE_TUNE_EMA_SHARE)
without editing the plan: how the default was chosen. The retrain from the champion decides
as the pipeline does: with more than warm_start.MAX_NEW_SHARE of the images new to it (e.g.
`--new-share 0.5`) it trains from scratch, and the run says so. Trained models are kept under
--work and reused by a rerun with the same options (delete them after changing the code).

Usage:
    .venv/bin/python benchmarks/warm_start.py --images tests/data/raccoon/images \\
        --annotations tests/data/raccoon/annotations --seeds 0,1,2 --work /tmp/warm_raccoon
    .venv/bin/python benchmarks/warm_start.py --demo 576 --seeds 0,1,2 --work /tmp/warm_demo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from beam.convert_job import build_dataset
from beam.options import ConvertOptions
from components.detector.artifacts import TrainConfigFile
from components.evaluate.champion import evaluate_against_champion
from components.evaluate.evaluator import evaluate_detector
from components.evaluate.metrics_file import METRICS_FILE, chosen_threshold
from components.export.saved_model import export_trained
from components.model_registry.decision import PromotionRule
from components.register.register import register_run
from components.model_registry.registry import Registry
from components.model_registry.warm_source import warm_source
from components.train import plan
from components.train.trainer import TrainConfig, train_detector
from pipeline.demo_data import write_demo_dataset

VAL_FRACTION = 0.2  # the CLI's default split
RULE = PromotionRule("not_worse", 0.01, 0.0)  # the pipeline's default


@dataclass
class Row:
    seed: int
    scenario: str  # "unchanged" | "20% new" (--new-share)
    name: str  # "from scratch" | "warm start"
    epochs: int
    cpu_seconds: float
    metrics: dict
    champion: dict  # the champion's metrics on the same val images
    verdict: str

    def delta(self, key: str) -> float:
        return self.metrics[key] - self.champion[key]


def _subset(images: Path, annotations: Path, out: Path, count: int) -> tuple[Path, Path]:
    """The first `count` images (by name) with an annotation, as links under `out`."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    paths = [p for p in sorted(images.iterdir()) if (annotations / f"{p.stem}.xml").exists()][:count]
    for path in paths:
        for source, folder in ((path, "images"), (annotations / f"{path.stem}.xml", "annotations")):
            target = out / folder / source.name
            if not target.exists():
                os.symlink(source.resolve(), target)
    return out / "images", out / "annotations"


def _build(images: Path, annotations: Path, out: Path, base_label_map: dict | None = None) -> Path:
    if not (out / "manifest.json").exists():
        result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                              val_fraction=VAL_FRACTION, base_label_map=base_label_map,
                                              allow_anomalies=True))
        if not result.ok:
            raise SystemExit(f"the data build failed: {result}")
    return out


def _train(config: TrainConfig) -> float:
    """Train unless done before; the training's process CPU seconds (kept beside the model)."""
    timing = Path(config.output_dir) / "cpu_seconds.json"
    if not timing.exists():
        cpu = time.process_time()
        train_detector(config)
        timing.write_text(json.dumps(time.process_time() - cpu))
    return json.loads(timing.read_text())


def _champion(registry: Registry, model: Path, data: Path, work: Path) -> str:
    """Register `model` as the registry's first version and make it the champion (blessed when it
    beats the box-prior baseline, else by hand)."""
    if not registry.champion_version():
        evaluation = work / f"eval-{model.name}-own"
        _, first = evaluate_against_champion(str(model), str(data), str(evaluation), RULE, registry=registry.store.uri)
        export_trained(str(model), str(work / f"{model.name}-saved"), *chosen_threshold(str(evaluation / METRICS_FILE)))
        done = register_run(registry, str(work / f"{model.name}-saved"), str(data), str(evaluation / METRICS_FILE),
                            first, {"sha256": model.name}, model.name, train_dir=str(model))
        if done.status == "rejected":  # a weak first model (few images): promoted by hand, as a person can
            registry.set_champion(done.version, f"the benchmark's champion although {done.reason}",
                                  by="benchmarks/warm_start.py", expected=None)
            print(f"{model.name}: promoted by hand ({done.reason})", flush=True)
    return registry.champion_version()


def _warm(registry: Registry, champion: str, data: Path, out: Path, seed: int, epochs: int) -> float:
    with tempfile.TemporaryDirectory() as fetched:
        source = warm_source("auto", registry, champion, fetched)
        return _train(TrainConfig(str(data), str(out), epochs=epochs, seed=seed, init_from=source.folder,
                                  init_name=source.name, init_note=source.note, init_champion=True))


def _decide(model: Path, data: Path, evaluation: Path, registry: Registry, champion: str) -> tuple[dict, str]:
    result, record = evaluate_against_champion(str(model), str(data), str(evaluation), RULE,
                                               registry=registry.store.uri, model_name=registry.model_name,
                                               champion=champion)
    return result.metrics, record.verdict


def scenarios(new_share: float) -> tuple[str, str]:
    return "unchanged", f"{new_share:.0%} new"


def run_seed(seed: int, images: Path, annotations: Path, work: Path, epochs: int, schedule: str,
             new_share: float) -> list[Row]:
    total = sum(1 for p in images.iterdir() if (annotations / f"{p.stem}.xml").exists())
    name = f"base{new_share:g}"
    base_images, base_annotations = _subset(images, annotations, work / name, round(total / (1 + new_share)))
    base = _build(base_images, base_annotations, work / f"{name}_shards")
    label_map = json.loads((base / "label_map.json").read_text())
    full = _build(images, annotations, work / "full_shards", base_label_map=label_map)
    runs = work / f"seed{seed}"
    champions = {}
    for key, folder, data in (("base", name, base), ("full", "full", full)):
        cpu = _train(TrainConfig(str(data), str(runs / f"champion-{folder}"), epochs=epochs, seed=seed))
        registry = Registry.open(str(runs / f"registry-{folder}"))
        champions[key] = (registry, _champion(registry, runs / f"champion-{folder}", data, runs), cpu, folder)
    own = {key: evaluate_detector(str(runs / f"champion-{folder}"), str(full), str(runs / f"eval-champion-{folder}"),
                                  raise_on_gate=False).metrics for key, (*_, folder) in champions.items()}
    warm_epochs = plan.fine_tune_epochs(TrainConfig("", "", epochs=epochs))[0]
    rows = []
    for scenario, champion in zip(scenarios(new_share), ("full", "base")):
        registry, version, _, folder = champions[champion]
        scratch = runs / ("scratch-unchanged" if scenario == "unchanged" else "champion-full")
        scratch_cpu = _train(TrainConfig(str(full), str(scratch), epochs=epochs, seed=seed + 1000)) \
            if scenario == "unchanged" else champions["full"][2]
        warm = runs / f"warm-{folder}-{schedule}"
        warm_cpu = _warm(registry, version, full, warm, seed, epochs)
        started = TrainConfigFile.read(warm).result["warm_start"]
        if not started["used"]:  # e.g. too much of the data is new to the champion: as the pipeline would
            print(f"seed {seed} {scenario}: the retrain from the champion trained from scratch: {started['reason']}")
        warm_run_epochs = warm_epochs if started["used"] else epochs
        for name, model, cpu, n in (("from scratch", scratch, scratch_cpu, epochs),
                                    ("warm start", warm, warm_cpu, warm_run_epochs)):
            metrics, verdict = _decide(model, full, runs / f"eval-{scenario[:2]}-{model.name}", registry, version)
            rows.append(Row(seed, scenario, name, n, cpu, metrics, own[champion], verdict))
            print(f"seed {seed} {scenario} {name}: mAP {metrics['mAP']:.3f} (champion {own[champion]['mAP']:.3f}), "
                  f"{verdict}", flush=True)
    return rows


def print_table(rows: list[Row], label: str, new_share: float) -> None:
    print(f"\n{label}")
    print("| seed | data | retrain | epochs | CPU s | CPU / scratch | mAP | ΔmAP | AP75 | ΔAP75 | decision |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        scratch = next(r for r in rows if (r.seed, r.scenario, r.name) == (row.seed, row.scenario, "from scratch"))
        print(f"| {row.seed} | {row.scenario} | {row.name} | {row.epochs} | {row.cpu_seconds:.0f} | "
              f"{row.cpu_seconds / scratch.cpu_seconds:.2f} | {row.metrics['mAP']:.3f} | {row.delta('mAP'):+.3f} | "
              f"{row.metrics['AP75']:.3f} | {row.delta('AP75'):+.3f} | {row.verdict} |")
    print("\nmeans over seeds")
    print("| data | retrain | mAP | ΔmAP | ΔAP75 | CPU / scratch | rejected |")
    print("|---|---|---|---|---|---|---|")
    for scenario in scenarios(new_share):
        for name in ("from scratch", "warm start"):
            mine = [r for r in rows if (r.scenario, r.name) == (scenario, name)]
            scratch = [r for r in rows if (r.scenario, r.name) == (scenario, "from scratch")]
            print(f"| {scenario} | {name} | {statistics.mean(r.metrics['mAP'] for r in mine):.3f} | "
                  f"{statistics.mean(r.delta('mAP') for r in mine):+.3f} | "
                  f"{statistics.mean(r.delta('AP75') for r in mine):+.3f} | "
                  f"{sum(r.cpu_seconds for r in mine) / sum(r.cpu_seconds for r in scratch):.2f} | "
                  f"{sum(r.verdict == 'rejected' for r in mine)} of {len(mine)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, help="a folder of photos (with --annotations: VOC XMLs)")
    parser.add_argument("--annotations", type=Path)
    parser.add_argument("--demo", type=int, default=0, help="the demo with this many images instead")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "warm_start")
    parser.add_argument("--epochs", type=int, default=10, help="epochs from scratch (default 10: the CLI's)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--warm-share", type=float, default=plan.FINE_TUNE_EPOCH_SHARE,
                        help="a warm start's epochs as a share of --epochs (default: the plan's)")
    parser.add_argument("--warm-lr", type=float, default=plan.FINE_TUNE_LR_SHARE,
                        help="a warm start's peak learning rate as a share of a from-scratch run's (default: the plan's)")
    parser.add_argument("--warm-ema", type=float, default=plan.FINE_TUNE_EMA_SHARE,
                        help="the share of a warm start the weight average spans (default: the plan's)")
    parser.add_argument("--new-share", type=float, default=0.2,
                        help="the full set's images beyond the base champion's, as a share of them (default 0.2)")
    args = parser.parse_args()
    if args.demo:
        args.images, args.annotations = args.work / "demo" / "images", args.work / "demo" / "annotations"
        if not args.images.is_dir():
            write_demo_dataset(args.work / "demo", num_train=args.demo, num_val=0)
    elif not (args.images and args.annotations):
        parser.error("give --images and --annotations (VOC), or --demo N")
    plan.FINE_TUNE_EPOCH_SHARE, plan.FINE_TUNE_LR_SHARE = args.warm_share, args.warm_lr
    plan.FINE_TUNE_EMA_SHARE = args.warm_ema
    schedule = f"share{args.warm_share:g}-lr{args.warm_lr:g}-ema{args.warm_ema:g}"
    rows = [row for seed in (int(s) for s in args.seeds.split(","))
            for row in run_seed(seed, args.images, args.annotations, args.work, args.epochs, schedule, args.new_share)]
    print_table(rows, f"{args.images.parent.name}: {args.epochs} epochs from scratch; warm start {schedule}; "
                      f"{args.new_share:.0%} new images in the second case; val: the full set's", args.new_share)


if __name__ == "__main__":
    main()
