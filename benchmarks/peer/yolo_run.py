"""Train and predict with Ultralytics YOLO, the peer of `benchmarks/peer_yolo.py`.

Run by that benchmark with the peer's own Python (an environment it builds, never detpipe's):
imports only Ultralytics and the standard library. One JSON argument:
    {"model": "yolov8n.yaml", "data": ".../data.yaml", "imgsz": 320, "batch": 16, "seed": 0,
     "minutes": 10 | null, "epochs": 100, "workers": 2, "project": DIR, "name": NAME,
     "test_images": [paths], "out": ".../peer.json"}
With `minutes` the peer's own `time=` (hours) sets the training's length, as its users give it;
without, `epochs`. The model is built from its YAML (no pretrained weights, like detpipe's from
scratch). Writes `out`: the training's seconds, epochs run, and per test image its
detections (normalised xyxy, scores, 0-based classes) at conf 0.001, the peer's own
evaluation setting, at most 100 a photo (COCO's cap, detpipe's evaluator's too).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from ultralytics import YOLO


def main() -> None:
    args = json.loads(sys.argv[1])
    run_dir = Path(args["project"]) / args["name"]
    train = dict(data=args["data"], imgsz=args["imgsz"], batch=args["batch"], seed=args["seed"], device="cpu",
                 workers=args["workers"], project=args["project"], name=args["name"], exist_ok=True,
                 pretrained=False, plots=False, amp=False, verbose=False, epochs=args["epochs"])
    if args.get("minutes"):
        train["time"] = args["minutes"] / 60.0
    began = time.monotonic()
    YOLO(args["model"]).train(**train)
    seconds = time.monotonic() - began
    with open(run_dir / "results.csv") as handle:
        epochs = sum(1 for _ in csv.DictReader(handle))
    best = YOLO(str(run_dir / "weights" / "best.pt"))
    detections = []
    paths = args["test_images"]
    for start in range(0, len(paths), 16):
        for result in best.predict(paths[start:start + 16], imgsz=args["imgsz"], conf=0.001, iou=0.7, max_det=100,
                                   device="cpu", verbose=False):
            boxes = result.boxes
            detections.append({"file": Path(result.path).name, "boxes": boxes.xyxyn.tolist(),
                               "scores": boxes.conf.tolist(), "classes": [int(c) for c in boxes.cls.tolist()]})
    Path(args["out"]).write_text(json.dumps({"train_seconds": round(seconds, 1), "epochs": epochs,
                                             "detections": detections}))


if __name__ == "__main__":
    main()
