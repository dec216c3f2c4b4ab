"""Running the `detpipe serve` app under uvicorn, and stopping it the way Vertex AI stops a
replica.

When Vertex AI scales a replica down (or a node goes), it sends SIGTERM and stops routing
to it. Requests already in flight are answered; requests still arriving (routed before the
balancer heard) get 503, which Vertex AI's and most clients' retries send elsewhere; health
answers 503; once nothing is in flight (or after `DRAIN_LIMIT_S`) the server stops and
the process exits 0. A second SIGTERM, or a Ctrl-C, stops at once as uvicorn does (it still
finishes the responses under way).
"""

from __future__ import annotations

import logging
import signal
import time

import uvicorn
from fastapi import FastAPI

from components.serve.app import ServeState

logger = logging.getLogger(__name__)

DRAIN_LIMIT_S = 60.0  # the longest the server waits for requests in flight after SIGTERM
MAX_CONNECTIONS = 256  # open connections; more are answered 503 by uvicorn (a bound on the memory of bodies)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM handled as described above."""

    def __init__(self, config: uvicorn.Config, state: ServeState):
        super().__init__(config)
        self._state = state
        self._drain_ends: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM and self._drain_ends is None:
            # Not recorded as captured: uvicorn raises captured signals again after it stops,
            # and SIGTERM's default action would end the process with 143, not 0.
            self._state.draining = True
            self._drain_ends = time.monotonic() + DRAIN_LIMIT_S
            logger.info("serve: SIGTERM: answering the %d request(s) in flight, 503 to new ones, then stopping",
                        self._state.in_flight)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_ends is not None and (self._state.in_flight == 0 or time.monotonic() > self._drain_ends):
            if self._state.in_flight:
                logger.warning("serve: stopping with %d request(s) still in flight after %g s",
                               self._state.in_flight, DRAIN_LIMIT_S)
            return True
        return await super().on_tick(counter)


def run_server(app: FastAPI, host: str, port: int) -> None:
    """Serve `app` (of `create_app`) until stopped; returns after a graceful stop."""
    config = uvicorn.Config(app, host=host, port=port, log_level="info", limit_concurrency=MAX_CONNECTIONS,
                            timeout_graceful_shutdown=DRAIN_LIMIT_S)
    # uvicorn raises a Ctrl-C again after its graceful shutdown, for the handler it found:
    # none here, the command is done (not pipeline/interrupt.py's).
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        DrainingServer(config, app.state.serve).run()
    finally:
        signal.signal(signal.SIGINT, previous)
