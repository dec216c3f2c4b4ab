"""What `detpipe serve` takes from a request: the body, read within bounds, and the predict
request in it, checked. Every problem is a `RequestError`: a 4xx and one line naming it.

Request: {"instances": [{"image_bytes": {"b64": "..."}}, ...],
          "parameters": {"score_threshold": 0.3, "max_detections": 100}}
         An instance may also be {"b64": "..."}: what a Vertex AI batch prediction job with a
         file list (instances_format "file-list") sends for each file. Other keys of an
         instance (a "key" to match answers with) are left alone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import time
from collections.abc import AsyncIterator

from components.serve.limits import DEFAULT_BODY_TIMEOUT_S, MAX_BODY_BYTES
from components.export.predictor import BadImage, model_image_bytes

PARAMETERS = ("score_threshold", "max_detections")
TOP_LEVEL = ("instances", "parameters")


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _too_large(size: str) -> RequestError:
    return RequestError(413, f"the request is {size}, over the {MAX_BODY_BYTES:,}-byte limit of Vertex AI online "
                             "prediction: send fewer or smaller images")


async def read_body(chunks: AsyncIterator[bytes], declared_length: str | None,
                    timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> bytes:
    """The body from its `chunks`, holding at most `MAX_BODY_BYTES` whatever the sender does.

    Over the limit (declared, or counted as it arrives when sent chunked or without a length)
    the rest is read and dropped before the 413: a server that answers mid-upload and closes
    makes the client see a broken pipe instead of the answer. A body still arriving after
    `timeout_s` (a slow or stalled sender) is a 408, a body over the limit still arriving then
    a 413; either way the connection ends."""
    deadline = time.monotonic() + timeout_s
    declared = int(declared_length) if declared_length and declared_length.isdigit() else None
    over = declared is not None and declared > MAX_BODY_BYTES
    parts, size = [], 0
    iterator = chunks.__aiter__()
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            chunk = await asyncio.wait_for(iterator.__anext__(), left)
        except StopAsyncIteration:
            break
        except TimeoutError:
            if over:
                break
            raise RequestError(408, f"the request body did not arrive within {timeout_s:g} s ({size:,} bytes came)")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            over, parts = True, []
        if not over:
            parts.append(chunk)
    if over:
        raise _too_large(f"{declared:,} bytes" if declared is not None
                         else f"{size:,} bytes or more (sent without a Content-Length)")
    return b"".join(parts)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise RequestError(400, f"the key {json.dumps(key)} appears twice in one object")
        seen[key] = value
    return seen


def _json(body: bytes):
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise RequestError(400, "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise RequestError(400, f"the request body is not valid JSON ({err.msg} at character {err.pos})") from None
    except RecursionError:
        raise RequestError(400, "the request body is not valid JSON: nested too deeply") from None
    except ValueError as err:  # an integer of more than 4,300 digits
        raise RequestError(400, f"the request body holds a number too long to read ({str(err).split(';')[0]})") from None


def _number(params: dict, key: str, low: float, high: float, integer: bool = False):
    value = params.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (integer and value != int(value)):
        kind = "a whole number" if integer else "a number"
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise RequestError(400, f"parameters.{key} must be {kind} in [{low:g}, {high:g}], got {shown}")
    return int(value) if integer else float(value)


def _image(index: int, instance) -> bytes:
    where = f"instances[{index}]"
    if isinstance(instance, dict) and "image_bytes" not in instance and "b64" in instance:
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
    """(model-ready image bytes, score threshold, max detections) of a predict request (a body
    `read_body` bounded), or a `RequestError` naming the first problem."""
    payload = _json(body)
    if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
        raise RequestError(400, 'the request needs "instances": a list of {"image_bytes": {"b64": ...}}')
    unknown = [key for key in payload if key not in TOP_LEVEL]
    if unknown:
        raise RequestError(400, f"unknown key {json.dumps(unknown[0])[:60]} in the request (it takes "
                                f"{', '.join(TOP_LEVEL)})")
    instances = payload["instances"]
    if not instances:
        raise RequestError(400, '"instances" is empty')
    if len(instances) > max_instances:
        raise RequestError(400, f"{len(instances)} instances, over the limit of {max_instances} a request")
    params = payload.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, '"parameters" must be an object')
    unknown = [key for key in params if key not in PARAMETERS]
    if unknown:
        raise RequestError(400, f"unknown parameter {json.dumps(unknown[0])[:60]} (the parameters are "
                                f"{', '.join(PARAMETERS)})")
    threshold = _number(params, "score_threshold", 0.0, 1.0)
    limit = _number(params, "max_detections", 1, max_detections, integer=True)
    return [_image(i, instance) for i, instance in enumerate(instances)], threshold, limit
