"""Benchmark time budgets against the fixed 10 epochs on photos no choice saw.

For each seed the photos are built into shards (val 20% by the hash split of that seed: the test
photos here; neither the stopping rule, which scores a carve of train, nor anything else reads
them). Then, each on this machine alone:
- `--epochs 10` on the whole train split (the release before budgets: its default);
- one budgeted training per `--budgets` value (`--time-budget`, epochs 0: the fit part of train,
  the held-out curve, patience, the best point's weights).
Each is scored on the test photos (COCO mAP / AP50 / AP75). Prints per seed and on average: the
figures, the gain over the 10 epochs, the wall seconds, the epochs trained and why each stopped,
and for a stop before the budget's end what stopping saved (the budget's seconds not used). It
also projects the default budget's training on GPUs from the rate measured here and the probe's
assumed rates per device kind (a projection, not a measurement: no GPU ran it).

Trained models are kept under --work and reused by a rerun with the same options (delete them
after changing the code). Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/time_budget.py --images tests/data/raccoon/images \\
        --annotations tests/data/raccoon/annotations --seeds 0,1,2 --budgets 5m,20m --work /tmp/budget_raccoon
    .venv/bin/python benchmarks/time_budget.py --demo 2048 --seeds 0 --budgets 20m --work /tmp/budget_demo
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ as a package

from beam.convert_job import build_dataset  # noqa: E402
from beam.options import ConvertOptions  # noqa: E402
from benchmarks.photo_sets import add_photo_options, photo_paths  # noqa: E402
from components.evaluate.evaluator import evaluate_detector  # noqa: E402
from components.train.time_budget import GPU_AUTO_SECONDS, MAX_BUDGET_EPOCHS, budget_seconds  # noqa: E402
from components.train.trainer import TrainConfig, TrainResult, train_detector  # noqa: E402

VAL_FRACTION = 0.2
BASELINE_EPOCHS = 10  # the default before time budgets
# Training rates of the tiny model at 320 px relative to this CPU, for the projection only: the
# probe's assumed GPU rate (400 images/s, components/probe/checks.py) scaled by the devices'
# FP32/TF32 dense throughput relative to a T4; not measured here.
GPU_SPEEDUP_OVER_T4 = {"L4": 1.5, "A100": 4.0, "H100": 7.0}
T4_IMAGES_PER_SECOND = 400.0


def trained(config: TrainConfig, name: str, train: Callable[[TrainConfig], TrainResult] = train_detector) -> dict:
    """Train (or reuse) with `train` (`train_detector`; `train_and_refit`: the pipeline's train
    step, its refit included) and score on the test photos."""
    out = Path(config.output_dir)
    record = out / "bench.json"
    if record.exists():
        return json.loads(record.read_text())
    began = time.monotonic()
    result = train(config)
    seconds = time.monotonic() - began
    metrics = evaluate_detector(str(out), config.data_dir, str(out / "eval")).metrics
    row = {"metrics": {k: metrics[k] for k in ("mAP", "AP50", "AP75")}, "seconds": round(seconds, 1),
           "epochs": result.epochs, "steps": result.steps, "stopped": result.stopped or "epochs",
           "images_per_second": result.images_per_second, "num_train": result.num_train}
    record.write_text(json.dumps(row))
    print(f"  {name}: test mAP {metrics['mAP']:.4f} AP50 {metrics['AP50']:.4f} AP75 {metrics['AP75']:.4f}, "
          f"{seconds:.0f} s, {result.epochs:g} epochs, stopped: {result.stopped}", flush=True)
    return row


def run_seed(images: str, annotations: str, seed: int, work: Path, budgets: list[str]) -> dict:
    data = work / f"data-{seed}"
    if not (data / "manifest.json").exists():
        build_dataset(ConvertOptions(images=images, annotations=annotations, output=str(data), seed=seed,
                                     val_fraction=VAL_FRACTION))
    base = TrainConfig(data_dir=str(data), output_dir="", seed=seed)
    print(f"seed {seed}:", flush=True)
    rows = {"10 epochs": trained(replace(base, output_dir=str(work / f"epochs-{seed}"), epochs=BASELINE_EPOCHS),
                                  f"{BASELINE_EPOCHS} epochs")}
    for budget in budgets:
        rows[budget] = trained(replace(base, output_dir=str(work / f"budget-{budget}-{seed}"), time_budget=budget),
                                f"budget {budget}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_photo_options(parser)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budgets", default="5m,10m,20m,40m")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    images, annotations = photo_paths(args, work)
    budgets = args.budgets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {seed: run_seed(images, annotations, seed, work, budgets) for seed in seeds}
    print("\nmean over seeds " + ", ".join(map(str, seeds)) + " (test photos: the val split, which no choice read)")
    print("| training | test mAP | AP50 | AP75 | gain in mAP | wall s | epochs | stopped (runs) | budget unused |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = statistics.mean(results[s]["10 epochs"]["metrics"]["mAP"] for s in seeds)
    for name in ["10 epochs", *budgets]:
        rows = [results[s][name] for s in seeds]
        mean = {k: statistics.mean(r["metrics"][k] for r in rows) for k in ("mAP", "AP50", "AP75")}
        reasons = {}
        for r in rows:
            reasons[r["stopped"].split(":")[0]] = reasons.get(r["stopped"].split(":")[0], 0) + 1
        unused = "" if name == "10 epochs" else \
            f"{statistics.mean(max(0.0, budget_seconds(name) - r['seconds']) for r in rows):.0f} s"
        print(f"| {name} | {mean['mAP']:.4f} | {mean['AP50']:.4f} | {mean['AP75']:.4f} | {mean['mAP'] - base:+.4f} | "
              f"{statistics.mean(r['seconds'] for r in rows):.0f} | {statistics.mean(r['epochs'] for r in rows):.1f} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))} | {unused} |")
    fit = results[seeds[0]][budgets[0]]["num_train"]
    print(f"\nprojected (not measured): the default budget on a GPU ({GPU_AUTO_SECONDS:g} s, at most "
          f"{MAX_BUDGET_EPOCHS} epochs) of {fit} fit images, at the probe's assumed T4 rate x each device's speed-up:")
    for device, speedup in GPU_SPEEDUP_OVER_T4.items():
        rate = T4_IMAGES_PER_SECOND * speedup
        seconds = MAX_BUDGET_EPOCHS * fit / rate
        print(f"  {device}: {rate:.0f} images/s: {MAX_BUDGET_EPOCHS} epochs in {seconds:.0f} s "
              f"({seconds / GPU_AUTO_SECONDS:.0%} of the budget; the curve may stop it sooner)")


if __name__ == "__main__":
    main()
