"""Measure what the loss's anchor matching adds to a train step's memory, per (anchor, box)
pair, against the constant the memory estimate uses (MATCH_BYTES_PER_PAIR).

Each measurement is a process of its own: build the detector, compile it as training does,
run two real train steps (`fit`, as `--batch-size auto`'s trial steps do) on a synthetic
batch with B boxes an image, and read the process's peak resident memory. The baseline is
the same with 1 box an image, in the same invocation; the difference over the extra
anchor x box pairs is the figure. On a CPU this is RAM; on a GPU run it where the trial
steps' GPU peak is what counts.

Usage:
    .venv/bin/python benchmarks/matching_memory.py [--image-size 256] [--batch 4] [--boxes 300 1000] [--max-level 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _measure(image_size: int, batch: int, boxes: int, max_level: int) -> dict:
    """Peak RSS (bytes) of two train steps in this process; called in a child process."""
    import resource

    import keras
    import tensorflow as tf

    from components.detector.losses import compile_detector
    from components.detector.memory_estimate import anchor_count
    from components.detector.model import ModelConfig, build_detector, synthetic_batch

    config = ModelConfig(num_classes=3, image_size=image_size, max_level=max_level)
    model = build_detector(config)
    compile_detector(model, keras.optimizers.AdamW(1e-4), "giou")
    data = tf.data.Dataset.from_tensors(synthetic_batch(batch, image_size, boxes)).repeat()
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
    return {"anchors": anchor_count(config), "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def measure(image_size: int, batch: int, boxes: int, max_level: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(image_size), str(batch), str(boxes), str(max_level)],
                         capture_output=True, text=True, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_measure(*map(int, sys.argv[2:6]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--boxes", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--max-level", type=int, default=7)
    args = parser.parse_args()

    from components.detector.memory_estimate import MATCH_BYTES_PER_PAIR

    base = measure(args.image_size, args.batch, 1, args.max_level)
    print(f"{args.image_size} px, P3-P{args.max_level} ({base['anchors']} anchors), batch {args.batch}: "
          f"peak {base['peak'] / 2**20:.0f} MiB with 1 box an image (the baseline)")
    for boxes in args.boxes:
        run = measure(args.image_size, args.batch, boxes, args.max_level)
        pairs = args.batch * run["anchors"] * (boxes - 1)
        per_pair = (run["peak"] - base["peak"]) / pairs
        print(f"  {boxes:5d} boxes an image: peak {run['peak'] / 2**20:.0f} MiB, +{(run['peak'] - base['peak']) / 2**20:.0f} "
              f"MiB over the baseline = {per_pair:.1f} bytes an (anchor, box) pair "
              f"({per_pair / MATCH_BYTES_PER_PAIR:.2f}x the estimate's {MATCH_BYTES_PER_PAIR})")


if __name__ == "__main__":
    main()
