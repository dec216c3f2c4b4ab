"""`detpipe serve`: an HTTP server on Vertex AI's custom-container contract.

Routes and port come from the environment Vertex sets (`AIP_HTTP_PORT`, default 8080;
`AIP_HEALTH_ROUTE`, default /health; `AIP_PREDICT_ROUTE`, default /predict). The model
loads once, in a thread at start-up; until it has loaded, health and predict answer 503,
and again once the server drains to stop (components/serve/server.py).

Request and its checks: components/serve/requests.py. Concurrent requests are answered by
one call of the model (components/serve/batching.py).
Response: {"predictions": [{"detection_boxes": [...], "detection_scores": [...],
           "detection_classes": [...], "detection_class_names": [...], "num_detections": N}]}
A bad request gets a 4xx with one JSON line naming the problem ({"error": "instances[2]: ..."}).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import tensorflow as tf
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from components.serve.access import authorized
from components.serve.batching import Batcher, batch_policy
from components.serve.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_INSTANCES
from components.export.predictor import Predictor
from components.serve.requests import RequestError, parse_request, read_body

logger = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """What `detpipe serve` takes besides the model and the address (its --help says each)."""

    max_instances: int = DEFAULT_MAX_INSTANCES
    max_batch_size: int | None = None  # None: what suits the machine (batching.batch_policy)
    batch_timeout_ms: float | None = None
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    token: str | None = None  # a bearer token predict requests must carry (components/serve/access.py)


@dataclass
class ServeState:
    """What the routes and the server's stop share; read and written on the event loop."""

    predictor: Predictor | None = None
    error: str | None = None
    batcher: Batcher | None = None  # None: batching off (its policy is the batcher's)
    draining: bool = False
    in_flight: int = 0


@dataclass(frozen=True)
class Routes:
    port: int = 8080
    health: str = "/health"
    predict: str = "/predict"

    @classmethod
    def from_env(cls, environ=os.environ) -> "Routes":
        return cls(int(environ.get("AIP_HTTP_PORT", 8080)), environ.get("AIP_HEALTH_ROUTE", "/health"),
                   environ.get("AIP_PREDICT_ROUTE", "/predict"))


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def create_app(model_dir: str, routes: Routes = Routes(), options: ServeOptions = ServeOptions(),
               load: Callable[[str], Predictor] = Predictor.load) -> FastAPI:
    """The server app; `load` runs once, in a thread, when the server starts. `app.state.serve`
    is its `ServeState`."""
    state = ServeState()
    # Requests are checked (JSON, base64, each image decoded once by Pillow) on a few threads,
    # not the event loop's nor one per request: at most this many images are decoded at once.
    parsers = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="check-request")

    def load_model() -> None:
        try:
            predictor = load(model_dir)
            policy = batch_policy(options.max_batch_size, options.batch_timeout_ms, predictor.config.model_batch,
                                  len(tf.config.list_physical_devices("GPU")))
            if policy.enabled:
                state.batcher = Batcher(predictor.detect, policy, in_flight=lambda: state.in_flight)
            state.predictor = predictor
            batching = (f"up to {policy.max_batch_size} images a call, waiting at most {policy.timeout_ms:g} ms "
                        f"({policy.reason})" if policy.enabled else "off")
            logger.info("serve: model loaded from %s; batching %s", model_dir, batching)
        except Exception as err:  # the server stays up and says why in health
            state.error = _first_line(err)
            logger.error("serve: could not load the model from %s: %s", model_dir, state.error)

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=load_model, name="load-model", daemon=True).start()
        yield
        if state.batcher is not None:
            state.batcher.close()
            logger.info("serve: %s", state.batcher.stats.line())
        parsers.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="detpipe", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state

    def unavailable() -> JSONResponse:
        if state.draining:
            reason = "the server is stopping: send the request again (to another replica)"
        elif state.error:
            reason = f"the model failed to load: {state.error}"
        else:
            reason = "the model is loading"
        return JSONResponse({"error": reason}, status_code=503)

    @app.get(routes.health)
    def health():
        if state.predictor is None or state.draining:
            return unavailable()
        if state.batcher is None:
            return {"status": "ok", "batching": "off"}
        return {"status": "ok", "batching": {"max_batch_size": state.batcher.policy.max_batch_size,
                                             "timeout_ms": state.batcher.policy.timeout_ms,
                                             **dataclasses.asdict(state.batcher.stats)}}

    async def predictions(predictor: Predictor, images: list[bytes], threshold: float | None,
                          limit: int | None) -> list[dict]:
        try:
            if state.batcher is None:
                return await run_in_threadpool(predictor.predict, images, threshold, limit)
            own = predictor.threshold(threshold)
            out, first = await asyncio.wrap_future(state.batcher.submit(images, own))
        except tf.errors.InvalidArgumentError as err:  # an image the checks passed (model_image_bytes) and the model did not
            raise RequestError(400, f"the model cannot decode an image of the request: "
                                    f"{err.message.splitlines()[0][:200]}") from None
        return [predictor.answer(out, first + i, own, limit) for i in range(len(images))]

    @app.post(routes.predict)
    async def predict(request: Request):
        predictor = state.predictor
        if not authorized(request.headers.get("authorization"), options.token):
            return JSONResponse({"error": "a bearer token is required: send 'Authorization: Bearer TOKEN'"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if predictor is None or state.draining:
            return unavailable()
        state.in_flight += 1
        try:
            body = await read_body(request.stream(), request.headers.get("content-length"), options.body_timeout_s)
            images, threshold, limit = await asyncio.get_running_loop().run_in_executor(
                parsers, parse_request, body, options.max_instances, predictor.config.max_detections)
            return {"predictions": await predictions(predictor, images, threshold, limit)}
        except RequestError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        except ClientDisconnect:
            return JSONResponse({"error": "the client went away"}, status_code=400)
        finally:
            state.in_flight -= 1

    @app.exception_handler(Exception)
    async def internal_error(_request, err):  # one JSON line, never a traceback in the response
        logger.exception("serve: internal error")
        return JSONResponse({"error": f"internal error: {type(err).__name__}"}, status_code=500)

    return app
