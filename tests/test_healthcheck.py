"""The image's HEALTHCHECK: passes for a pipeline step (nothing listens), probes the health
route of a server. Servers here listen on 127.0.0.1 only and stop after the test."""

import http.server
import socket
import threading

import pytest

from pipeline.healthcheck import check


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """An HTTP server on 127.0.0.1 whose /health answers with the status the test sets."""
    state = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["status"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], state
    httpd.shutdown()
    httpd.server_close()


def test_nothing_listening_is_a_healthy_pipeline_step():
    healthy, why = check(port=_free_port(), timeout=2)
    assert healthy and "not serving" in why


def test_a_server_is_healthy_only_while_its_route_answers_2xx(server):
    port, state = server
    assert check(port=port, route="/health", timeout=2)[0]
    state["status"] = 503
    healthy, why = check(port=port, route="/health", timeout=2)
    assert not healthy and "503" in why
    assert not check(port=port, route="/other", timeout=2)[0]
