"""Benchmark `detpipe serve` over local HTTP against the same SavedModel called in-process.

Both run the same exported model on the same real photos (raccoon by default), for batches
of 1 and 8 images: the server gets `{"instances": [...]}` requests over HTTP on 127.0.0.1
(base64, JSON, request checks, EXIF check), the baseline calls `Predictor.predict` with the
same bytes. Prints requests/s and images/s of each and the ratio server / in-process (the
HTTP overhead). Requests are sequential, bounded in count, and go to 127.0.0.1 only.

Usage:
    .venv/bin/python benchmarks/serving.py [--model EXPORT_DIR] [--images DIR] [--requests 20]
Without --model it exports a freshly built (untrained) tiny detector first (not timed).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fresh_export(folder: Path) -> str:
    import keras

    from components.export.saved_model import export_saved_model
    from components.detector.model import build_model_for

    keras.utils.set_random_seed(0)
    export_saved_model(build_model_for("tiny", 128, 1), {"raccoon": 1}, 128, str(folder), score_threshold=0.05)
    return str(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def rate(run, requests: int, images_per_request: int) -> tuple[float, float]:
    """(requests/s, images/s) over `requests` calls after one untimed warm-up."""
    run()
    started = time.perf_counter()
    for _ in range(requests):
        run()
    seconds = time.perf_counter() - started
    return requests / seconds, requests * images_per_request / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="output of `detpipe export` (default: export an untrained tiny model)")
    parser.add_argument("--images", default=str(REPO.parent / "shared" / "datasets" / "raccoon" / "images"))
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()

    from components.serve.predictor import Predictor, model_image_bytes

    model = args.model or fresh_export(Path(tempfile.mkdtemp(prefix="detpipe-bench-")) / "exported")
    photos = sorted(Path(args.images).glob("*.jpg"))[:8]
    raw = [p.read_bytes() for p in photos]
    predictor = Predictor.load(model)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "--model", model, "--host", "127.0.0.1",
                             "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc)
        print(f"{len(photos)} photos from {args.images}, {args.requests} sequential requests each")
        for batch in (1, 8):
            chosen = raw[:batch]
            body = json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(b).decode()}}
                                             for b in chosen]}).encode()

            def over_http():
                request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as response:
                    response.read()

            def in_process():
                predictor.predict([model_image_bytes(b) for b in chosen])

            http_rps, http_ips = rate(over_http, args.requests, batch)
            local_rps, local_ips = rate(in_process, args.requests, batch)
            print(f"  batch {batch}: server {http_rps:6.1f} requests/s {http_ips:7.1f} images/s | in-process "
                  f"{local_rps:6.1f} requests/s {local_ips:7.1f} images/s | ratio {http_ips / local_ips:.2f}x")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
