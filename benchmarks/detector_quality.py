"""Benchmark the trained detector's accuracy at a fixed budget: the current defaults against
the previous defaults (a git revision of this repository, run from its own checkout) and,
with --ablate, against the current code with one recipe change turned off at a time.

Each run is `detpipe train` (every option at its default, `--epochs` the budget) then
`detpipe evaluate` on the same shards, as a child process; its CPU seconds (user + system
of the process and its children) and wall seconds are measured around the train command.
Prints mAP@[.5:.95], AP50, AP75 and per-class AP of each run, and the ratios against the
previous defaults. With --seeds, each configuration trains once per seed (`detpipe train
--seed`) and the ratios are those of the means: on a val split of a few dozen images (raccoon:
43) one run's AP50 moves by about +-0.04 with the seed alone.

Datasets (built once under --work with `detpipe demo-data` and `detpipe data build`):
  demo     `make run`'s demo: 2,048 + 256 images, val fraction 0.1, 8 epochs
  small    demo-data --train 320 --val 80 --object-size 9-22 --image-size 280-400, 15 epochs
  raccoon  tests/data/raccoon (or $DETPIPE_RACCOON), 30 epochs

Usage:
    .venv/bin/python benchmarks/detector_quality.py [--datasets demo,small,raccoon]
        [--baseline-rev 8c8403e] [--ablate] [--seeds 0,1,2] [--work /tmp/detector_quality]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The last revision before the recipe of issue 24 (GIoU + L1 box loss, weight average, the
# heads' initialisation, best-anchor matching, per-class input size).
PREVIOUS_DEFAULTS = "8c8403e"
RACCOON = Path(os.environ.get("DETPIPE_RACCOON", REPO / "tests" / "data" / "raccoon"))


@dataclass(frozen=True)
class Dataset:
    name: str
    epochs: int
    demo_args: tuple[str, ...] = ()  # `detpipe demo-data` options; empty: a folder of VOC files
    val_fraction: float = 0.2


DATASETS = {
    "demo": Dataset("demo", 8, ("--train", "2048", "--val", "256"), val_fraction=0.1),
    "small": Dataset("small", 15, ("--train", "320", "--val", "80", "--object-size", "9-22",
                                   "--image-size", "280-400")),
    "raccoon": Dataset("raccoon", 30),
}
# --ablate: the current code with one change undone (train options).
ABLATIONS = {"huber box loss": ["--box-loss", "huber"], "no weight average": ["--no-ema"],
             "batch 16 (no step floor)": ["--batch-size", "16"]}


def detpipe(*args: str) -> list[str]:
    """`detpipe ARGS` with this environment's packages, from the code of the folder it runs in (`run`'s cwd)."""
    return [sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main(sys.argv[1:]))", *args]


def run(command: list[str], cwd: Path, log: Path) -> tuple[float, float]:
    """Run `command` in `cwd` (its code first on the path); returns (CPU seconds, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    with log.open("w") as out:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[3:])} failed ({done.returncode}); see {log}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def prepare(dataset: Dataset, work: Path) -> Path:
    """The dataset's shards under `work` (built on the first call)."""
    shards = work / f"{dataset.name}_shards"
    if (shards / "manifest.json").exists():
        return shards
    if dataset.demo_args:
        source = work / dataset.name
        run(detpipe("demo-data", str(source), *dataset.demo_args), REPO, work / f"{dataset.name}_demo.log")
    else:
        source = RACCOON
    run(detpipe("data", "build", "--format", "voc", "--images", str(source / "images"), "--annotations",
                str(source / "annotations"), "--output", str(shards), "--val-fraction", str(dataset.val_fraction)),
        REPO, work / f"{dataset.name}_build.log")
    return shards


def checkout(revision: str, work: Path) -> Path:
    """A copy of the repository at `revision` (git worktree), made once."""
    folder = work / f"rev-{revision}"
    if not folder.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), revision], check=True,
                       stdout=subprocess.DEVNULL)
    return folder


def train_and_evaluate(label: str, code: Path, shards: Path, epochs: int, extra: list[str], work: Path) -> dict:
    out = work / "runs" / f"{shards.name}-{label.replace(' ', '_')}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    cpu, wall = run(detpipe("train", "--data", str(shards), "--output", str(out / "model"), "--epochs",
                            str(epochs), "--no-export", *extra), code, out / "train.log")
    run(detpipe("evaluate", "--model", str(out / "model"), "--data", str(shards), "--output", str(out / "eval")),
        code, out / "evaluate.log")
    metrics = json.loads((out / "eval" / "metrics.json").read_text())["metrics"]
    return {"label": label, "cpu": cpu, "wall": wall, **metrics}


METRICS = ("mAP", "AP50", "AP75")


def mean_row(label: str, rows: list[dict]) -> dict:
    """The mean of several seeds' rows of one configuration (metrics, per-class AP, CPU and wall)."""
    keys = ["cpu", "wall", *(k for k in rows[0] if k in METRICS or k.startswith("AP/"))]
    return {"label": label, **{k: sum(r[k] for r in rows) / len(rows) for k in keys}}


def print_table(dataset: Dataset, rows: list[dict], ratios: bool = True) -> None:
    """The runs' table, then (with `ratios`) each later row's ratios against the first."""
    classes = sorted(k for k in rows[0] if k.startswith("AP/"))
    print(f"\n## {dataset.name}: {dataset.epochs} epochs, every option at its default")
    head = ["run", "train CPU s", "wall s", "mAP", "AP50", "AP75", *(c[3:] for c in classes)]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in rows:
        cells = [row["label"], f"{row['cpu']:.0f}", f"{row['wall']:.0f}",
                 *(f"{row[k]:.3f}" for k in (*METRICS, *classes))]
        print("| " + " | ".join(cells) + " |")
    base = rows[0]
    for row in rows[1:] if ratios else []:
        print(f"{row['label']} / {base['label']}: mAP {row['mAP'] / max(base['mAP'], 1e-9):.2f}x, "
              f"AP50 {row['AP50'] / max(base['AP50'], 1e-9):.2f}x, AP75 {row['AP75'] / max(base['AP75'], 1e-9):.2f}x, "
              f"CPU {row['cpu'] / base['cpu']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="demo,small,raccoon", help="comma-separated: " + ", ".join(DATASETS))
    parser.add_argument("--baseline-rev", default=PREVIOUS_DEFAULTS,
                        help=f"git revision whose defaults are the baseline (default {PREVIOUS_DEFAULTS}); "
                             "'none' skips it")
    parser.add_argument("--ablate", action="store_true", help="also run the current code with each change off")
    parser.add_argument("--seeds", default="0",
                        help="comma-separated training seeds; each configuration trains once per seed and the "
                             "ratios compare the means (default 0: one run each)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/detector_quality"), help="folder for data and runs")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.datasets.split(","):
        if name not in DATASETS:
            raise SystemExit(f"unknown dataset {name!r}: use {', '.join(DATASETS)}")
        dataset = DATASETS[name]
        shards = prepare(dataset, args.work)
        runs = []
        if args.baseline_rev != "none":
            old = checkout(args.baseline_rev, args.work)
            runs.append(("previous defaults", old, []))
        runs.append(("current defaults", REPO, []))
        if args.ablate:
            runs += [(f"current, {label}", REPO, extra) for label, extra in ABLATIONS.items()]
        rows, means = [], []
        for label, code, extra in runs:
            mine = []
            for seed in seeds:
                tagged = label if len(seeds) == 1 else f"{label}, seed {seed}"
                print(f"{name}: training {tagged} ...", flush=True)
                mine.append(train_and_evaluate(tagged, code, shards, dataset.epochs, [*extra, "--seed", str(seed)],
                                               args.work))
            rows += mine
            if len(seeds) > 1:
                means.append(mean_row(f"{label}, mean of {len(seeds)}", mine))
        print_table(dataset, rows, ratios=len(seeds) == 1)
        if len(seeds) > 1:
            print_table(dataset, means)


if __name__ == "__main__":
    main()
