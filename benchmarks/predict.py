"""Benchmark batched prediction: `components.detector.detect.BatchDetector` (full batches,
the last one padded inside the graph) against Keras' own `model.predict` on the same
images and the same model, in one run.

`model.predict` is the baseline the evaluator used before; it crashes on a last batch that
is not full (KerasHub's NMS needs a static batch), so the baseline gets a whole number of
batches and BatchDetector gets the same images, and then the same plus one (one padded
batch more). Prints images/s of each and the ratio BatchDetector / model.predict.

Usage:
    .venv/bin/python benchmarks/predict.py [--model-size tiny] [--image-size 128]
        [--batch-size 32] [--batches 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def best_rate(run, count: int, repeats: int) -> float:
    """Images/s of the fastest of `repeats` timed runs, after one untimed warm-up (tracing)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", default="tiny")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from components.detector.detect import BatchDetector
    from components.detector.model import build_model_for

    keras.utils.set_random_seed(0)
    model = build_model_for(args.model_size, args.image_size, 3)
    count = args.batch_size * args.batches
    images = tf.random.stateless_uniform([count + 1, args.image_size, args.image_size, 3], seed=[0, 1])
    whole = images[:count]
    detector = BatchDetector(model, args.image_size, args.batch_size)

    baseline = best_rate(lambda: model.predict(whole, batch_size=args.batch_size, verbose=0), count, args.repeats)
    batched = best_rate(lambda: detector(whole), count, args.repeats)
    plus_one = best_rate(lambda: detector(images), count + 1, args.repeats)
    print(f"{args.model_size} at {args.image_size}px, batch {args.batch_size}, {count} images, "
          f"best of {args.repeats}")
    print(f"  model.predict (full batches only): {baseline:8.1f} images/s")
    print(f"  BatchDetector, same images:        {batched:8.1f} images/s  ratio {batched / baseline:.2f}x")
    print(f"  BatchDetector, {count + 1} images (1 padded batch): {plus_one:8.1f} images/s  "
          f"ratio {plus_one / baseline:.2f}x")


if __name__ == "__main__":
    main()
