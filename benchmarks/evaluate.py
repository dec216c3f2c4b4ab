"""Benchmark COCO evaluation: faster-coco-eval (what `detpipe evaluate` uses) against
pycocotools (the reference) on the same predictions, in one run; also the paired
bootstrap of the champion comparison (1000 resamples) against re-running pycocotools'
evaluation on each resample, extrapolated from a few.

The predictions are the seeded synthetic sets of tests/scenes.py (several classes and
sizes, jittered boxes, confused labels, low-score clutter). Prints seconds of each and the
ratios; both libraries' mAP is printed too, to show they measure the same thing.

Usage:
    .venv/bin/python benchmarks/evaluate.py [--images 500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_seconds(run, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=500, help="val images in the set (default 500)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the fastest counts (default 3)")
    args = parser.parse_args()

    import numpy as np
    from components.evaluate.bootstrap import match_table, paired_bootstrap
    from components.detector.coco_metrics import ImageDetections, coco_box_metrics
    from tests.scenes import NAMES, pycocotools_evaluation, scene

    truths, found = scene(0, images=args.images)
    rng = np.random.default_rng(1)  # the "champion": the same detections, boxes jittered more
    other = [ImageDetections(d.image_id, [tuple(np.clip(np.array(b) + rng.normal(0, 0.02, 4), 0, 1)) for b in d.boxes],
                             d.scores, d.labels) for d in found]
    print(f"{args.images} val images, {sum(len(t.boxes) for t in truths)} boxes, "
          f"{sum(len(d.boxes) for d in found)} detections")

    def reference():
        return float(pycocotools_evaluation(truths, found, NAMES).stats[0])

    fast_s, fast = best_seconds(lambda: coco_box_metrics(truths, found, NAMES)["mAP"], args.repeats)
    ref_s, ref = best_seconds(reference, args.repeats)
    print(f"faster-coco-eval: {fast_s:.3f} s (mAP {fast:.6f})")
    print(f"pycocotools:      {ref_s:.3f} s (mAP {ref:.6f})")
    print(f"ratio pycocotools / faster-coco-eval: {ref_s / fast_s:.1f}x")

    boot_s, boot = best_seconds(lambda: paired_bootstrap(match_table(truths, found, NAMES),
                                                         match_table(truths, other, NAMES), resamples=1000), 1)
    resample_s = 2 * ref_s  # two models a resample, pycocotools each time
    print(f"paired bootstrap, 1000 resamples, 2 models: {boot_s:.2f} s "
          f"(ΔmAP {boot.delta_map.delta:+.4f}, 95% CI {boot.delta_map.low:+.4f} .. {boot.delta_map.high:+.4f})")
    print(f"re-running pycocotools on each resample instead: about {1000 * resample_s:.0f} s "
          f"(ratio {1000 * resample_s / boot_s:.0f}x)")


if __name__ == "__main__":
    main()
