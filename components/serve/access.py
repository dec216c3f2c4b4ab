"""Who may reach `detpipe serve`: the address it listens on and the optional bearer token.

Loopback unless told otherwise: a server started on a laptop or a shared VM is not open to the
network by accident. Inside a Vertex AI container (the contract sets `AIP_HTTP_PORT`) it listens
on every interface, as the contract requires: Vertex's front end reaches it from outside the
container. A token, when one is set, guards the predict route (401 without it); health stays
open, as load balancers and Vertex's health checks send no token.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"
VERTEX_PORT_ENV = "AIP_HTTP_PORT"  # set by Vertex AI in a serving container
TOKEN_ENV = "DETPIPE_SERVE_TOKEN"


def listen_host(host: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The address to bind: `host` when given, else every interface inside a Vertex AI container,
    else loopback.

    >>> listen_host(None, {})
    '127.0.0.1'
    >>> listen_host(None, {"AIP_HTTP_PORT": "8080"})
    '0.0.0.0'
    >>> listen_host("10.0.0.5", {"AIP_HTTP_PORT": "8080"})
    '10.0.0.5'
    """
    if host:
        return host
    return ALL_INTERFACES if environ.get(VERTEX_PORT_ENV) else LOOPBACK


def serve_token(token_file: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The bearer token requests to predict must carry: the first line of `token_file`, else
    $DETPIPE_SERVE_TOKEN, else None (no token asked). An empty token is refused: it would guard
    nothing."""
    if token_file:
        text = Path(token_file).read_text(encoding="utf-8").strip()
        if not text:
            raise ValueError(f"--token-file {token_file} is empty")
        return text.splitlines()[0].strip()
    token = environ.get(TOKEN_ENV)
    if token is not None and not token.strip():
        raise ValueError(f"${TOKEN_ENV} is set but empty")
    return token.strip() if token else None


def authorized(header: str | None, token: str | None) -> bool:
    """Whether an `Authorization` header carries the token (always, when no token is asked).

    >>> authorized(None, None), authorized("Bearer s3cret", "s3cret"), authorized("Bearer other", "s3cret")
    (True, True, False)
    >>> authorized(None, "s3cret"), authorized("s3cret", "s3cret")
    (False, False)
    """
    if token is None:
        return True
    scheme, _, given = (header or "").partition(" ")
    # compare_digest: the time taken does not tell how much of a guess was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
