"""`detpipe serve`: an HTTP server on Vertex AI's custom-container contract.

Routes and port come from the environment Vertex sets (`AIP_HTTP_PORT`, default 8080;
`AIP_HEALTH_ROUTE`, default /health; `AIP_PREDICT_ROUTE`, default /predict). The model
loads once, in a thread at start-up; until it has loaded, health and predict answer 503.

Request: {"instances": [{"image_bytes": {"b64": "..."}}, ...],
          "parameters": {"score_threshold": 0.3, "max_detections": 100}}
         An instance may also be {"b64": "..."}: what a Vertex AI batch prediction job with a
         file list (instances_format "file-list") sends for each file.
Response: {"predictions": [{"detection_boxes": [...], "detection_scores": [...],
           "detection_classes": [...], "detection_class_names": [...], "num_detections": N}]}
A bad request gets a 4xx with one JSON line naming the problem ({"error": "instances[2]: ..."}).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from components.serve.predictor import BadImage, Predictor, model_image_bytes

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1_500_000  # Vertex AI's limit on an online prediction request
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024  # an oversized body is read and dropped up to this, then the connection ends
DEFAULT_MAX_INSTANCES = 32


@dataclass(frozen=True)
class Routes:
    port: int = 8080
    health: str = "/health"
    predict: str = "/predict"

    @classmethod
    def from_env(cls, environ=os.environ) -> "Routes":
        return cls(int(environ.get("AIP_HTTP_PORT", 8080)), environ.get("AIP_HEALTH_ROUTE", "/health"),
                   environ.get("AIP_PREDICT_ROUTE", "/predict"))


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _number(params: dict, key: str, low: float, high: float, integer: bool = False):
    value = params.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (integer and value != int(value)):
        kind = "a whole number" if integer else "a number"
        raise RequestError(400, f"parameters.{key} must be {kind} in [{low:g}, {high:g}], got {json.dumps(value)}")
    return int(value) if integer else float(value)


def _image(index: int, instance) -> bytes:
    where = f"instances[{index}]"
    if isinstance(instance, dict) and "image_bytes" not in instance and set(instance) == {"b64"}:
        instance = {"image_bytes": instance}  # a file of a Vertex AI batch job's file list
    if not isinstance(instance, dict) or "image_bytes" not in instance:
        raise RequestError(400, f'{where}: no "image_bytes"')
    encoded = instance["image_bytes"]
    if not isinstance(encoded, dict) or not isinstance(encoded.get("b64"), str):
        raise RequestError(400, f'{where}: image_bytes must be {{"b64": "<base64 of a JPEG or PNG>"}}')
    try:
        data = base64.b64decode(encoded["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"{where}: image_bytes.b64 is not valid base64") from None
    try:
        return model_image_bytes(data)
    except BadImage as err:
        raise RequestError(400, f"{where}: {err}") from None


def parse_request(body: bytes, max_instances: int, max_detections: int) -> tuple[list[bytes], float | None, int | None]:
    """(model-ready image bytes, score threshold, max detections) of a predict request, or a
    `RequestError` naming the first problem."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"the request is {len(body):,} bytes, over the {MAX_BODY_BYTES:,}-byte limit "
                                "of Vertex AI online prediction: send fewer or smaller images")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RequestError(400, "the request body is not valid JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
        raise RequestError(400, 'the request needs "instances": a list of {"image_bytes": {"b64": ...}}')
    instances = payload["instances"]
    if not instances:
        raise RequestError(400, '"instances" is empty')
    if len(instances) > max_instances:
        raise RequestError(400, f"{len(instances)} instances, over the limit of {max_instances} a request")
    params = payload.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, '"parameters" must be an object')
    threshold = _number(params, "score_threshold", 0.0, 1.0)
    limit = _number(params, "max_detections", 1, max_detections, integer=True)
    return [_image(i, instance) for i, instance in enumerate(instances)], threshold, limit


def create_app(model_dir: str, routes: Routes = Routes(), max_instances: int = DEFAULT_MAX_INSTANCES,
               load: Callable[[str], Predictor] = Predictor.load) -> FastAPI:
    """The server app; `load` runs once, in a thread, when the server starts."""
    state: dict = {"predictor": None, "error": None}

    def load_model() -> None:
        try:
            state["predictor"] = load(model_dir)
            logger.info("serve: model loaded from %s", model_dir)
        except Exception as err:  # the server stays up and says why in health
            state["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.error("serve: could not load the model from %s: %s", model_dir, state["error"])

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=load_model, name="load-model", daemon=True).start()
        yield

    app = FastAPI(title="detpipe", lifespan=lifespan, docs_url=None, redoc_url=None)

    def not_ready() -> JSONResponse:
        reason = f"the model failed to load: {state['error']}" if state["error"] else "the model is loading"
        return JSONResponse({"error": reason}, status_code=503)

    @app.get(routes.health)
    def health():
        return not_ready() if state["predictor"] is None else {"status": "ok"}

    @app.post(routes.predict)
    async def predict(request: Request):
        predictor = state["predictor"]
        if predictor is None:
            return not_ready()
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            # Read (and drop) what the client is sending before answering: a server that
            # answers mid-upload and closes makes the client see a broken pipe, not the 413.
            drained = 0
            async for chunk in request.stream():
                drained += len(chunk)
                if drained > DRAIN_LIMIT_BYTES:
                    break
            return JSONResponse({"error": f"the request is {int(declared):,} bytes, over the {MAX_BODY_BYTES:,}-byte "
                                          "limit of Vertex AI online prediction"}, status_code=413)
        try:
            images, threshold, limit = parse_request(await request.body(), max_instances,
                                                     predictor.config.max_detections)
        except RequestError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        return {"predictions": await run_in_threadpool(predictor.predict, images, threshold, limit)}

    @app.exception_handler(Exception)
    async def internal_error(_request, err):  # one JSON line, never a traceback in the response
        logger.exception("serve: internal error")
        return JSONResponse({"error": f"internal error: {type(err).__name__}"}, status_code=500)

    return app
