"""Benchmark a tuned training against the defaults on images neither the search nor training saw.

For each seed: the photos are built into shards (val 20% by the hash split of that seed); the
defaults train on the whole train split; `detpipe tune` searches on the train split alone
(trials on its fit part, scored on its held-out part) at `--trials` (default `auto`: what the
pipeline would decide here, which on a machine without a GPU is no search) and the winner's
values train on the whole train split. Both are scored on the val split, which the search never
read. Prints per seed and on average: what `auto` decided, the winner's and the defaults' score
on the tuning split, val mAP / AP50 / AP75 of both and the gain, and the CPU seconds of the search
and of a training (and their ratio). Nothing asserts on time.

Trained models and searches are kept under --work and reused by a rerun with the same options
(delete them after changing the code).

Usage:
    .venv/bin/python benchmarks/tuning.py --images tests/data/raccoon/images \\
        --annotations tests/data/raccoon/annotations --seeds 0,1,2 --trials 8 --work /tmp/tune_raccoon
    .venv/bin/python benchmarks/tuning.py --demo 480 --seeds 0,1,2 --trials 8 --work /tmp/tune_demo
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ as a package

from beam.convert_job import build_dataset  # noqa: E402
from beam.options import ConvertOptions  # noqa: E402
from benchmarks.photo_sets import add_photo_options, photo_paths  # noqa: E402
from components.evaluate.evaluator import evaluate_detector  # noqa: E402
from components.train.trainer import TrainConfig, train_detector  # noqa: E402
from components.tune.hparams_file import BEST_FILE, BestHparams  # noqa: E402
from components.tune.search import TuneConfig, tune  # noqa: E402

VAL_FRACTION = 0.2  # the CLI's default split


def _trained(config: TrainConfig, name: str) -> tuple[dict, float]:
    """Train (or reuse) and evaluate on val: the metrics and the training's CPU seconds."""
    out = Path(config.output_dir)
    record = out / "bench.json"
    if record.exists():
        saved = json.loads(record.read_text())
        return saved["metrics"], saved["cpu"]
    began = time.process_time()
    train_detector(config)
    cpu = time.process_time() - began
    metrics = evaluate_detector(str(out), config.data_dir, str(out / "eval")).metrics
    record.write_text(json.dumps({"metrics": metrics, "cpu": cpu}))
    print(f"  {name}: val mAP {metrics['mAP']:.4f} (training {cpu:.0f} CPU s)", flush=True)
    return metrics, cpu


def _searched(config: TuneConfig) -> tuple[BestHparams, float]:
    out = Path(config.output_dir)
    record = out / "bench_cpu.json"
    if record.exists() and (out / BEST_FILE).exists():
        return BestHparams.from_dict(json.loads((out / BEST_FILE).read_text())), json.loads(record.read_text())["cpu"]
    began = time.process_time()
    result = tune(config)
    cpu = time.process_time() - began
    record.write_text(json.dumps({"cpu": cpu}))
    return result.best, cpu


def run_seed(images: str, annotations: str, seed: int, work: Path, args) -> dict:
    data = work / f"data-{seed}"
    if not (data / "manifest.json").exists():
        build_dataset(ConvertOptions(images=images, annotations=annotations, output=str(data), seed=seed,
                                     val_fraction=VAL_FRACTION))
    base = TrainConfig(data_dir=str(data), output_dir="", epochs=args.epochs, seed=seed)
    print(f"seed {seed}:", flush=True)
    defaults, train_cpu = _trained(replace(base, output_dir=str(work / f"defaults-{seed}")), "defaults")
    best, search_cpu = _searched(TuneConfig(data_dir=str(data), output_dir=str(work / f"tune-{seed}-{args.trials}"),
                                            trials=args.trials, seed=seed, train={"epochs": args.epochs}))
    print(f"  search: {best.decision}", flush=True)
    if best.trials:
        tuned, _ = _trained(replace(base, output_dir=str(work / f"tuned-{seed}-{args.trials}"), **best.hparams), "tuned")
    else:
        tuned = defaults  # `auto` decided against a search: the defaults are what the pipeline trains
    return {"seed": seed, "decision": best.decision, "trials": best.trials, "tuning_best": best.score,
            "tuning_defaults": best.defaults_score, "hparams": best.hparams, "defaults": defaults, "tuned": tuned,
            "gain": tuned["mAP"] - defaults["mAP"], "search_cpu": search_cpu if best.trials else 0.0,
            "train_cpu": train_cpu}


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_photo_options(parser)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--trials", default="auto", help="the search's trials (default auto, as the pipeline)")
    parser.add_argument("--epochs", type=int, default=10, help="the training tuned (the release before budgets)")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    images, annotations = photo_paths(args, work)
    rows = [run_seed(images, annotations, int(s), work, args) for s in args.seeds.split(",")]
    print("\n| seed | trials | tuning split: winner / defaults | val mAP defaults | tuned | gain | AP50 d/t | "
          "AP75 d/t | search CPU s | x training |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d, t = r["defaults"], r["tuned"]
        print(f"| {r['seed']} | {r['trials']} | {_f(r['tuning_best'])} / {_f(r['tuning_defaults'])} | {d['mAP']:.3f} | "
              f"{t['mAP']:.3f} | {r['gain']:+.3f} | {d['AP50']:.3f}/{t['AP50']:.3f} | {d['AP75']:.3f}/{t['AP75']:.3f} | "
              f"{r['search_cpu']:.0f} | {r['search_cpu'] / r['train_cpu']:.1f} |")
    gains = [r["gain"] for r in rows]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    print(f"\nmean val mAP gain {statistics.mean(gains):+.4f} (sd {spread:.4f}, min {min(gains):+.4f}, max "
          f"{max(gains):+.4f}) over {len(rows)} seed(s); decisions: {sorted({r['decision'] for r in rows})}")
    for r in rows:
        print(f"seed {r['seed']} chose " + ", ".join(f"{k}={v:.3g}" for k, v in r["hparams"].items()))


if __name__ == "__main__":
    main()
