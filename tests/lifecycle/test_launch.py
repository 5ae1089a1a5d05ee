"""The one health probe (`launch.health`): what the health wait, status, port-forward and the bench all ask."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdctl.bench.runner import probe
from pdctl.errors import LaunchError
from pdctl.lifecycle.hosts.launch import health
from pdctl.lifecycle.hosts.wait import default_check
from pdctl.plan import ProcessSpec
from pdctl.remote.local import LocalTransport
from tests.conftest import free_port


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_health_says_ok_or_why_not(server: str) -> None:
    local = LocalTransport()
    assert health(local, f"{server}/health") == "ok"
    assert health(local, f"{server}/sick") == "HTTP 503"
    assert health(local, f"http://127.0.0.1:{free_port()}/health") == "ConnectError"


def test_the_health_wait_and_the_bench_use_the_same_probe(server: str) -> None:
    local = LocalTransport()
    spec = ProcessSpec(name="decode-0", role="decode", node="local", host="127.0.0.1", argv=("true",), env={},
                       workdir="/tmp", log_path="/tmp/x.log", health_url=f"{server}/sick", url=server, ports=())
    assert default_check(spec, local) == "HTTP 503"
    assert probe.healthy(local, server)
    probe.wait_healthy([(local, server)], timeout_s=5.0)
    down = f"http://127.0.0.1:{free_port()}"
    assert not probe.healthy(local, down)
    with pytest.raises(LaunchError) as err:
        probe.wait_healthy([(local, down)], timeout_s=0.0)
    assert err.value.message == f"{down}/health on local did not answer 200 within 0 s"
