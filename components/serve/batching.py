"""Dynamic batching for `detpipe serve`: images of concurrent requests answered by one call
of the model, as TF Serving's `--enable_batching` and Triton's dynamic batcher do.

A request's images wait at most `timeout_ms` after the first request of a batch arrived,
less when the batch fills up (`max_batch_size` images), and not at all when no other request
is on its way (a lone client pays no wait); while the model runs a batch, the next one
gathers. A request is never split: one with more images than `max_batch_size`
is a call of its own. Each request gets the answer it gets alone: the call runs at the
lowest score threshold of its requests and each request keeps its own detections
(`Predictor.answer`), and the exported model runs its images in fixed chunks (the
SavedModel pads to `ServingConfig.model_batch`), so an image's numbers do not depend on
which others share its call.

Hand-written on a thread and a condition variable: TF Serving's and Triton's batchers are
their servers' own, and nothing on PyPI batches calls of a Python function across requests.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)

# Defaults (docs/serving.md). On a CPU the exported model computes a whole chunk of
# `model_batch` images for one image (it pads), so filling a chunk costs little and a second
# one as much again; but a chunk's last image goes through the convolution kernels' tail path
# (oneDNN): its numbers come out up to ~1e-7 apart from the same image in another slot, the
# slot a request alone gets. The default call leaves that slot to padding, so an answer is
# the one the request gets alone to the last digit (benchmarks/serving.py counts them). On a
# GPU a few chunks cost little more than one.
GPU_CHUNKS = 4
DEFAULT_TIMEOUT_MS = 5.0


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # images in one call of the model; 1: every request is its own call
    timeout_ms: float  # the longest a request waits for others
    reason: str = ""

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 1


def batch_policy(max_batch_size: int | None, timeout_ms: float | None, model_batch: int, gpus: int) -> BatchPolicy:
    """The batching of a server: what was asked, else what suits the machine (see above)."""
    timeout = DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    if max_batch_size is not None:
        return BatchPolicy(max_batch_size, timeout, "--max-batch-size")
    if gpus:
        return BatchPolicy(GPU_CHUNKS * model_batch, timeout, f"{gpus} GPU(s): {GPU_CHUNKS} chunks of {model_batch}")
    size = max(1, model_batch - 1)
    return BatchPolicy(size, timeout, f"CPU: the model's chunk of {model_batch} images, its last slot left to padding")


@dataclass
class _Waiting:
    images: list[bytes]
    threshold: float
    arrived: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class BatchStats:
    requests: int = 0
    calls: int = 0
    images: int = 0
    largest: int = 0

    def line(self) -> str:
        mean = self.images / self.calls if self.calls else 0.0
        return (f"{self.requests} requests, {self.images} images in {self.calls} calls of the model "
                f"(mean {mean:.1f} images a call, largest {self.largest})")


class Batcher:
    """Gathers `submit`ted requests into calls of `run(images, threshold)`, which returns the
    model's outputs with one row per image; each request's future gets its rows.
    `in_flight()`, when given, counts the server's requests under way, those queued here
    included: a batch stops waiting when all of them are in it."""

    def __init__(self, run: Callable[[list[bytes], float], dict[str, np.ndarray]], policy: BatchPolicy,
                 in_flight: Callable[[], int] | None = None):
        self._run, self.policy, self._in_flight = run, policy, in_flight
        self._queue: deque[_Waiting] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self.stats = BatchStats()
        self._worker = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._worker.start()

    def submit(self, images: list[bytes], threshold: float) -> concurrent.futures.Future:
        """A future of (outputs, first row of this request's images)."""
        waiting = _Waiting(images, threshold, time.monotonic())
        with self._changed:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(waiting)
            self._changed.notify()
        return waiting.future

    def close(self) -> None:
        """Stop after the requests already queued are answered."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._worker.join(timeout=60)

    def _queued_images(self) -> int:
        return sum(len(w.images) for w in self._queue)

    def _next_batch(self) -> list[_Waiting]:
        with self._changed:
            while not self._queue and not self._closed:
                self._changed.wait()
            if not self._queue:
                return []
            deadline = self._queue[0].arrived + self.policy.timeout_ms / 1000
            while self._queued_images() < self.policy.max_batch_size and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0 or (self._in_flight is not None and self._in_flight() <= len(self._queue)):
                    break
                self._changed.wait(left)
            batch = [self._queue.popleft()]
            size = len(batch[0].images)
            while self._queue and size + len(self._queue[0].images) <= self.policy.max_batch_size:
                size += len(self._queue[0].images)
                batch.append(self._queue.popleft())
            return batch

    def _loop(self) -> None:
        while batch := self._next_batch():
            try:
                self._answer(batch)
            except Exception:  # one request's images broke the call: each is answered alone
                for waiting in batch:
                    try:
                        self._answer([waiting])
                    except Exception as err:
                        waiting.future.set_exception(err)

    def _answer(self, batch: list[_Waiting]) -> None:
        images = [image for waiting in batch for image in waiting.images]
        out = self._run(images, min(waiting.threshold for waiting in batch))
        self.stats.requests += len(batch)
        self.stats.calls += 1
        self.stats.images += len(images)
        self.stats.largest = max(self.stats.largest, len(images))
        first = 0
        for waiting in batch:
            waiting.future.set_result((out, first))
            first += len(waiting.images)
