"""Benchmark the converted files of `detpipe export` against the trained model they came from:
each format converted, re-scored on the val split (components/export/converted.py, the code the
export step runs) and timed one image a call on this machine, with the trained model timed the
same way in the same run as the baseline (Keras `predict_on_batch` of one image, what the
SavedModel computes). Prints per format: mAP, its difference, size, ms/image and the speed
ratio against the baseline. Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/export_formats.py --model TRAIN_DIR --data DATA_DIR [--formats tflite,onnx]
        [--calibration-images N] [--output DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BASELINE_CALLS = 50  # one-image calls of the trained model timed for the baseline


def _baseline_ms(model_dir: str) -> float:
    """The trained model, one image a call (after one warm-up call), in ms."""
    import numpy as np

    from components.detector.artifacts import load_trained
    from components.detector.detect import BatchDetector

    model, config = load_trained(model_dir)
    detector = BatchDetector(model, config.image_size, 1)
    image = np.random.default_rng(0).random((1, config.image_size, config.image_size, 3), dtype=np.float32)
    detector(image)
    started = time.perf_counter()
    for _ in range(BASELINE_CALLS):
        detector(image)
    return (time.perf_counter() - started) / BASELINE_CALLS * 1000


def main() -> int:
    from components.export.converted import export_files
    from components.export.file_formats import CALIBRATION_IMAGES, FORMATS, ExportSettings, parse_formats
    from components.export.rescore import signed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="output folder of `detpipe train`")
    parser.add_argument("--data", required=True, help="output folder of `detpipe data build` (val re-scores)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="default: every converted format")
    parser.add_argument("--calibration-images", type=int, default=CALIBRATION_IMAGES)
    parser.add_argument("--output", help="where the files go (default: a temporary folder)")
    args = parser.parse_args()
    kinds = parse_formats(args.formats)
    with tempfile.TemporaryDirectory(prefix="export-bench-") as scratch:
        output = args.output or scratch
        started = time.perf_counter()
        scores, errors = export_files(args.model, kinds, output, args.data,  # keep every file: this measures
                                      ExportSettings(calibration_images=args.calibration_images, max_map_loss=1.0,
                                                     max_int8_map_loss=1.0))
        seconds = time.perf_counter() - started
        baseline = _baseline_ms(args.model)
    print(f"converted and re-scored {len(scores)} format(s) in {seconds:.1f} s on {os.cpu_count()} CPU(s)")
    print(f"baseline: the trained model, one image a call: {baseline:.1f} ms/image")
    print(f"{'format':<12} {'mAP':>7} {'ΔmAP':>8} {'AP50':>7} {'size MB':>8} {'ms/image':>9} {'vs model':>9}")
    for s in scores:
        ms = s.seconds_per_image * 1000
        print(f"{s.kind:<12} {s.metrics['mAP']:7.4f} {signed(s.map_difference):>8} {s.metrics['AP50']:7.4f} "
              f"{s.size_bytes / 1e6:8.2f} {ms:9.1f} {baseline / ms:8.2f}x")
    for kind, why in errors.items():
        print(f"{kind:<12} conversion failed: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
