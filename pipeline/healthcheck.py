"""The image's HEALTHCHECK: healthy when nothing serves, or when the server's health route
answers 2xx.

One image runs every pipeline step and also serves models on Vertex AI's custom-container
contract (`AIP_HTTP_PORT`, default 8080; `AIP_HEALTH_ROUTE`, default `/health`). A pipeline
step listens on no port, so a refused connection means "not a server" and passes; a
server that listens but does not answer its health route with 2xx fails.

    python -m pipeline.healthcheck        # exit 0 healthy, 1 unhealthy
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = 8080
DEFAULT_ROUTE = "/health"


def check(host: str = "127.0.0.1", port: int = DEFAULT_PORT, route: str = DEFAULT_ROUTE,
          timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, why)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return True, f"nothing listens on {host}:{port}: not serving"
    url = f"http://{host}:{port}{route}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return True, f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as err:  # HTTPError (non-2xx) is a URLError
        return False, f"{url}: {err}"


def main() -> int:
    healthy, why = check(port=int(os.environ.get("AIP_HTTP_PORT", DEFAULT_PORT)),
                         route=os.environ.get("AIP_HEALTH_ROUTE", DEFAULT_ROUTE))
    print(why, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
