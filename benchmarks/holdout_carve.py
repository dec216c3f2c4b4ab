"""What a budgeted run should hand over: the model of the fit part its held-out curve watched
(the default), or a second training on the whole train split for the epochs the curve chose;
and whether the stopping rule's smoothing and plan-tied patience beat the rule before them.

For each seed the photos are built into shards (val 20% by the hash split of that seed: the
test photos; nothing here reads them but the final scores). Then, each on this machine alone:
- `fit part`: the budgeted training (`--time-budget`, default `auto`): the train split less its
  held-out carve, the curve, the best point's weights; it trains E epochs;
- `whole split, E epochs`: `--epochs E` on the whole train split (the carve's images trained
  too; no curve, the last weights): what the curve chose, spent on every image;
- with `--raw-rule`, also the budgeted training under the rule before (patience 10 on single
  scores: no smoothing, no patience tied to the plan).
Each is scored on the test photos (COCO mAP / AP50 / AP75); printed per seed and on average,
with the wall seconds (the whole-split option costs a second training). Models are kept under
--work and reused by a rerun with the same options. Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/holdout_carve.py --images tests/data/raccoon/images \\
        --annotations tests/data/raccoon/annotations --seeds 0,1,2 --raw-rule --work /tmp/carve_raccoon
    .venv/bin/python benchmarks/holdout_carve.py --demo 2600 --seeds 0,1,2 --work /tmp/carve_demo
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ as a package

from beam.convert_job import build_dataset  # noqa: E402
from beam.options import ConvertOptions  # noqa: E402
from benchmarks.photo_sets import add_photo_options, photo_paths  # noqa: E402
from benchmarks.seed_tables import per_seed_line  # noqa: E402
from benchmarks.time_budget import VAL_FRACTION, trained  # noqa: E402
from components.train import curve, time_budget  # noqa: E402
from components.train.trainer import TrainConfig  # noqa: E402

RAW_PATIENCE = 10  # the rule before: a fixed patience on single scores


def _raw_rule(config: TrainConfig, name: str) -> dict:
    """A budgeted training under the rule before: plateaued() on unsmoothed scores, patience fixed."""
    smoothed = curve.plateaued
    curve.plateaued = lambda scores, patience, every: time_budget.plateaued(scores, patience, every, window=1)
    try:
        return trained(replace(config, patience=RAW_PATIENCE), name)
    finally:
        curve.plateaued = smoothed


def run_seed(images: str, annotations: str, seed: int, work: Path, budget: str, raw: bool) -> dict:
    data = work / f"data-{seed}"
    if not (data / "manifest.json").exists():
        build_dataset(ConvertOptions(images=images, annotations=annotations, output=str(data), seed=seed,
                                     val_fraction=VAL_FRACTION))
    base = TrainConfig(data_dir=str(data), output_dir="", seed=seed, time_budget=budget)
    print(f"seed {seed}:", flush=True)
    rows = {"fit part": trained(replace(base, output_dir=str(work / f"fit-{budget}-{seed}")), "fit part")}
    epochs = max(1, math.ceil(rows["fit part"]["epochs"]))
    rows["whole split"] = trained(replace(base, output_dir=str(work / f"whole-{budget}-{seed}-{epochs}"),
                                          epochs=epochs), f"whole split, {epochs} epochs")
    if raw:
        rows["rule before"] = _raw_rule(replace(base, output_dir=str(work / f"raw-{budget}-{seed}")), "rule before")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_photo_options(parser)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", default="auto")
    parser.add_argument("--raw-rule", action="store_true", help="also train under the stopping rule before")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    images, annotations = photo_paths(args, work)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {seed: run_seed(images, annotations, seed, work, args.budget, args.raw_rule) for seed in seeds}
    names = list(results[seeds[0]])
    print(f"\nmean over seeds {', '.join(map(str, seeds))}, --time-budget {args.budget} (test photos: the val split)")
    print("| training | test mAP | AP50 | AP75 | wall s | epochs | train images | stopped (runs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        rows = [results[s][name] for s in seeds]
        mean = {k: statistics.mean(r["metrics"][k] for r in rows) for k in ("mAP", "AP50", "AP75")}
        reasons: dict[str, int] = {}
        for r in rows:
            reasons[r["stopped"].split(":")[0]] = reasons.get(r["stopped"].split(":")[0], 0) + 1
        print(f"| {name} | {mean['mAP']:.4f} | {mean['AP50']:.4f} | {mean['AP75']:.4f} | "
              f"{statistics.mean(r['seconds'] for r in rows):.0f} | {statistics.mean(r['epochs'] for r in rows):.1f} | "
              f"{statistics.mean(r['num_train'] for r in rows):.0f} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))} |")
    print(per_seed_line(results, seeds, names))


if __name__ == "__main__":
    main()
