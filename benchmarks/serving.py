"""Benchmark `detpipe serve` with and without dynamic batching, at 1, 4 and 16 concurrent clients.

One run starts the server twice on the same exported model: with batching as `serve` sets it
by default (or --max-batch-size N), and with `--max-batch-size 1` (each request its own call
of the model, the baseline). Each client sends single-image requests over HTTP/1.1 keep-alive
on 127.0.0.1, real photos (raccoon by default), one after another. Prints, per number of
clients: requests/s, p50 and p99 latency of each server, the ratio batched / unbatched, and
whether every answer of the batched server equals, to the last digit, the answer of the
unbatched server for the same photo. The batched server's own count of model calls is in its
log line, quoted at the end. Bounded in count; 127.0.0.1 only.

Usage:
    .venv/bin/python benchmarks/serving.py [--model EXPORT_DIR] [--images DIR] [--requests 10]
        [--clients 1,4,16] [--max-batch-size N] [--batch-timeout-ms MS]
--requests is per client. Without --model it exports a freshly built (untrained) tiny detector
first (not timed); answers are compared all the same, but a trained model's say more.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fresh_export(folder: Path) -> str:
    import keras

    from components.detector.model import build_model_for
    from components.export.saved_model import export_saved_model

    keras.utils.set_random_seed(0)
    export_saved_model(build_model_for("tiny", 128, 1), {"raccoon": 1}, 128, str(folder), score_threshold=0.05)
    return str(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`detpipe serve` in a subprocess, its log in a file."""

    def __init__(self, model: str, extra: list[str], log: Path):
        self.port, self.log = free_port(), log
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "--model", model, "--host",
                                      "127.0.0.1", "--port", str(self.port), *extra], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=log.open("w"))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"the server did not become healthy: {log.read_text()[-2000:]}")

    def stop(self) -> str:
        """SIGTERM, as Vertex AI stops a replica; the server's batching line."""
        self.proc.terminate()
        self.proc.wait(timeout=60)
        lines = [line for line in self.log.read_text().splitlines() if "calls of the model" in line]
        return lines[-1].split("serve: ")[-1] if lines else ""


def run_clients(port: int, bodies: list[bytes], clients: int, per_client: int) -> tuple[list[float], dict]:
    """Latencies (s) of every request and {photo index: the distinct answer texts}; every
    answer must be 200."""
    latencies, answers, errors = [], {}, []
    lock = threading.Lock()

    def client(k: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for n in range(per_client):
            index = (k * per_client + n) % len(bodies)
            started = time.perf_counter()
            connection.request("POST", "/predict", bodies[index], {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
            elapsed = time.perf_counter() - started
            with lock:
                if response.status != 200:
                    errors.append(f"{response.status} {text[:200]!r}")
                latencies.append(elapsed)
                answers.setdefault(index, set()).add(text)
        connection.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    return latencies, answers


def measure(server: Server, bodies: list[bytes], levels: list[int], per_client: int) -> dict:
    run_clients(server.port, bodies, 2, 4)  # warm-up: the first calls of a model are slow
    figures = {}
    for clients in levels:
        started = time.perf_counter()
        latencies, answers = run_clients(server.port, bodies, clients, per_client)
        seconds = time.perf_counter() - started
        figures[clients] = {"rps": len(latencies) / seconds, "p50": float(np.percentile(latencies, 50)),
                            "p99": float(np.percentile(latencies, 99)), "answers": answers}
    return figures


def largest_difference(a: bytes, b: bytes) -> str:
    """How far two answers to one photo are apart: the largest difference of a box
    coordinate or score when they hold the same detections, else what differs."""
    x, y = (json.loads(t)["predictions"][0] for t in (a, b))
    if x["detection_classes"] != y["detection_classes"]:
        return f"different detections ({x['num_detections']} against {y['num_detections']})"
    values = [np.asarray(d["detection_boxes"] + [[s] * 4 for s in d["detection_scores"]], float) for d in (x, y)]
    return f"{float(np.abs(values[0] - values[1]).max()) if values[0].size else 0.0:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="output of `detpipe export` (default: export an untrained tiny model)")
    parser.add_argument("--images", default=str(REPO.parent / "shared" / "datasets" / "raccoon" / "images"))
    parser.add_argument("--requests", type=int, default=10, help="requests per client at each level (default 10)")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated (default 1,4,16)")
    parser.add_argument("--max-batch-size", help="the batched server's --max-batch-size (default: serve's)")
    parser.add_argument("--batch-timeout-ms", help="the batched server's --batch-timeout-ms (default: serve's)")
    args = parser.parse_args()

    model = args.model or fresh_export(Path(tempfile.mkdtemp(prefix="detpipe-bench-")) / "exported")
    photos = sorted(Path(args.images).glob("*.jpg"))[:64]
    bodies = [json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(p.read_bytes()).decode()}}]}).encode()
              for p in photos]
    levels = list(dict.fromkeys(int(n) for n in args.clients.split(",")))
    batched_options = [*(["--max-batch-size", args.max_batch_size] if args.max_batch_size else []),
                       *(["--batch-timeout-ms", args.batch_timeout_ms] if args.batch_timeout_ms else [])]
    logs = Path(tempfile.mkdtemp(prefix="detpipe-serve-bench-"))
    print(f"model {model}; {len(photos)} photos from {args.images}; single-image requests, {args.requests} per "
          f"client; {os.cpu_count()} CPUs")
    results, calls = {}, {}
    for name, extra in (("unbatched", ["--max-batch-size", "1"]), ("batched", batched_options)):
        server = Server(model, extra, logs / f"{name}.log")
        try:
            results[name] = measure(server, bodies, levels, args.requests)
        finally:
            calls[name] = server.stop()
    print(f"{'clients':>7} | {'unbatched req/s':>15} {'p50 ms':>7} {'p99 ms':>7} | {'batched req/s':>13} "
          f"{'p50 ms':>7} {'p99 ms':>7} | {'throughput':>10} {'p99':>6} | answers")
    for clients in levels:
        a, b = results["unbatched"][clients], results["batched"][clients]
        both = [i for i in b["answers"] if i in a["answers"]]
        differ = [largest_difference(*sorted(a["answers"][i] | b["answers"][i])[:2])
                  for i in both if len(a["answers"][i] | b["answers"][i]) > 1]
        print(f"{clients:>7} | {a['rps']:>15.1f} {a['p50'] * 1e3:>7.0f} {a['p99'] * 1e3:>7.0f} | {b['rps']:>13.1f} "
              f"{b['p50'] * 1e3:>7.0f} {b['p99'] * 1e3:>7.0f} | {b['rps'] / a['rps']:>9.2f}x {b['p99'] / a['p99']:>5.2f}x"
              f" | {len(both) - len(differ)}/{len(both)} identical" + (f"; the others differ by {', '.join(differ)}"
                                                                          if differ else ""))
    print(f"batched server: {calls['batched']}")


if __name__ == "__main__":
    main()
