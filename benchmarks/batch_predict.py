"""Benchmark `detpipe predict --images` (the Beam RunInference job) against the in-process
predictor loop a user would write (read each file, check it, `Predictor.predict` in batches
of 16, write one JSON line each), on the same folder of images and the same exported model,
in one invocation.

The model is a small detector trained for a few steps on demo images and exported (the
weights do not change the cost); the images are real photos of `--image-size` pixels
rendered by `demo-data`. The job runs with 1 worker (in this process) and with 2 worker
processes, each on the first quarter of the images and on all of them; each job is timed
whole (listing, workers' start, TensorFlow and the model loaded in each worker, writing),
the loop from loading the model. From the two sizes it prints the job's fixed cost and its
rate once running (what a job over 200,000 photos sees), against the loop's rate once its
model is loaded. Also checks that each job's lines equal the loop's (boxes 1e-3, scores
1e-4). Nothing asserts on time.

Usage:
    .venv/bin/python benchmarks/batch_predict.py [--images 4000]  (20000 for steadier rates) [--image-size 480-640] [--work /tmp/batch_predict]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LOOP_BATCH = 16


def _model(work: Path) -> Path:
    """A small trained and exported detector (cached under `work`)."""
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from components.export.saved_model import export_trained
    from components.train.trainer import TrainConfig, train_detector
    from pipeline.demo_data import write_demo_dataset

    exported = work / "exported"
    if (exported / "saved_model.pb").exists():
        return exported
    write_demo_dataset(work / "train_demo", num_train=96, num_val=32)
    build_dataset(ConvertOptions(images=str(work / "train_demo" / "images"),
                                 annotations=str(work / "train_demo" / "annotations"), output=str(work / "shards")))
    train_detector(TrainConfig(str(work / "shards"), str(work / "model"), epochs=2, batch_size=8))
    export_trained(str(work / "model"), str(exported))
    return exported


def _loop(model: Path, paths: list[str]) -> tuple[list[dict], float]:
    """The loop's lines, and the seconds it took to load the model (its start)."""
    from components.export.predictor import BadImage, Predictor, model_image_bytes

    started = time.monotonic()
    predictor = Predictor.load(str(model))
    load_s = time.monotonic() - started
    lines, batch = [], []

    def flush():
        for (path, _), p in zip(batch, predictor.predict([data for _, data in batch])):
            lines.append({"image": path, **p})
        batch.clear()

    for path in paths:
        try:
            batch.append((path, model_image_bytes(Path(path).read_bytes())))
        except (OSError, BadImage):
            continue
        if len(batch) == LOOP_BATCH:
            flush()
    flush()
    return lines, load_s


def _close(a: dict, b: dict) -> bool:
    import numpy as np

    n = a["num_detections"]
    if n != b["num_detections"] or a["detection_classes"][:n] != b["detection_classes"][:n]:
        return False
    return (np.allclose(a["detection_boxes"][:n], b["detection_boxes"][:n], atol=1e-3)
            and np.allclose(a["detection_scores"][:n], b["detection_scores"][:n], atol=1e-4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--image-size", default="480-640", help="MIN-MAX pixels of each side (default 480-640)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "batch_predict"))
    args = parser.parse_args()
    from benchmarks.rates import start_and_rate
    from components.serve.batch_job import PREDICTIONS, BatchOptions, list_images, predict_images, read_lines
    from pipeline.demo_data import write_demo_dataset

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = _model(work)
    low, high = (int(v) for v in args.image_size.split("-"))
    photos = work / f"photos-{args.images}-{args.image_size}"
    if not (photos / "images").is_dir():
        write_demo_dataset(photos, num_train=args.images, num_val=0, image_size=(low, high),
                           object_size=(low // 8, high // 3))
    paths = list_images(str(photos / "images"))

    started = time.monotonic()
    loop, load_s = _loop(model, paths)
    loop_s = time.monotonic() - started
    loop_rate = len(paths) / (loop_s - load_s)  # once running, as the job's rate below
    print(f"in-process loop: {len(paths)} images in {loop_s:.1f} s = {len(paths) / loop_s:.1f} images/s; "
          f"{load_s:.1f} s to load the model, then {loop_rate:.1f} images/s", flush=True)
    expected = {line["image"]: line for line in loop}

    quarter = work / f"{photos.name}-quarter"  # the first quarter of the images, linked: the job's fixed cost
    if not quarter.is_dir():
        quarter.mkdir()
        for path in paths[:len(paths) // 4]:
            os.link(path, quarter / Path(path).name)
    for workers in (1, 2):
        seconds = {}
        for folder in (quarter, photos / "images"):
            out = work / f"out-{workers}-{time.time_ns()}"
            summary = predict_images(BatchOptions(str(model), str(folder), str(out), num_workers=workers))
            seconds[summary.images_in] = summary.seconds
        lines = [json.loads(line) for line in read_lines(str(out), PREDICTIONS)]
        same = sum(_close(line, expected[line["image"]]) for line in lines)
        (few, few_s), (many, many_s) = sorted(seconds.items())
        fixed, marginal = start_and_rate(few, few_s, many, many_s)
        print(f"Beam job, {workers} worker(s): {many} images in {many_s:.1f} s = {many / many_s:.1f} images/s, "
              f"{many / many_s * loop_s / len(paths):.2f}x the whole loop ({few} images: {few_s:.1f} s); "
              f"from the two: {fixed:.1f} s to start, then {marginal:.1f} images/s = {marginal / loop_rate:.2f}x "
              f"the loop once running; {same} of {len(lines)} lines equal to the loop's", flush=True)


if __name__ == "__main__":
    main()
