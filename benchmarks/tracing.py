"""Measure what graph building costs a short training run, against the way it was built
before (the baseline, in the same invocation).

Every training process, probe, tuning trial, export and evaluation traces its TensorFlow
graphs before the first step; on a short run (a test, a trial, a small dataset on a CPU)
that is most of its time. Two of those costs were removable, and the baseline puts them
back:
- the learning rate rebuilt for every ask (Keras's AdamW asks once per decayed variable,
  and CosineDecay's warmup is a cond): `ScaledSchedule` builds it once a graph;
- the whole train step traced twice (Keras builds the compiled loss's trackers inside the
  first trace on one device, and TF retraces a function that made variables):
  `build_for_fit` builds them first.

Each run is a process of its own (TensorFlow imported before the clock starts): a
deterministic `train_detector` of `--steps` steps on demo images. It prints the seconds of
each, their ratio, and whether the final weights are identical (they must be: only graph
building differs).

Usage:
    .venv/bin/python benchmarks/tracing.py [--steps 6] [--image-size 96] [--repeat 2] [--work /tmp/tracing]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _train(data: str, out: str, steps: int, image_size: int, baseline: bool) -> dict:
    """Seconds of one `train_detector` run and its weights' digest; called in a child process."""
    import shutil
    import time

    import tensorflow  # noqa: F401  (imported before the clock starts)

    from components.train import loop
    from components.train.schedules import ScaledSchedule
    from components.train.trainer import TrainConfig, train_detector

    if baseline:
        ScaledSchedule.__call__ = ScaledSchedule._rate  # every ask builds the rate again
        loop.build_for_fit = lambda model, element_spec: None  # the trackers are made in the first trace
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    result = train_detector(TrainConfig(data_dir=data, output_dir=out, epochs=10**6, max_steps=steps, batch_size=8,
                                        image_size=image_size, deterministic=True))
    return {"seconds": time.perf_counter() - started, "weights": result.weights_sha256}


def run(data: str, out: str, steps: int, image_size: int, baseline: bool) -> dict:
    child = subprocess.run([sys.executable, __file__, "--child", data, out, str(steps), str(image_size),
                            str(int(baseline))], capture_output=True, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if child.returncode:
        raise SystemExit(f"training run failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _shards(work: Path) -> str:
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from pipeline.demo_data import write_demo_dataset

    shards = work / "shards"
    if not (shards / "manifest.json").exists():
        write_demo_dataset(work / "demo", num_train=56, num_val=8)
        build_dataset(ConvertOptions(images=str(work / "demo" / "images"), annotations=str(work / "demo" / "annotations"),
                                     output=str(shards)))
    return str(shards)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        data, out, steps, size, baseline = sys.argv[2:7]
        print(json.dumps(_train(data, out, int(steps), int(size), baseline == "1")))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "detpipe_tracing"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = _shards(work)
    seconds: dict[str, list[float]] = {"baseline": [], "now": []}
    weights: set[str] = set()
    for i in range(args.repeat):
        for name in ("baseline", "now"):  # alternated, so a slow spell of the machine hits both
            got = run(data, str(work / f"model_{name}"), args.steps, args.image_size, name == "baseline")
            seconds[name].append(got["seconds"])
            weights.add(got["weights"])
            print(f"run {i + 1} {name:8s} {got['seconds']:6.1f} s  weights {got['weights'][:12]}", flush=True)
    base, now = statistics.median(seconds["baseline"]), statistics.median(seconds["now"])
    print(f"\n{args.steps} steps at {args.image_size} px, median of {args.repeat}: baseline {base:.1f} s, "
          f"now {now:.1f} s = {base / now:.2f}x faster; weights "
          + ("identical in every run" if len(weights) == 1 else f"DIFFER ({len(weights)} digests)"))


if __name__ == "__main__":
    main()
