"""The chat answer rendered in another API's shape: a decode dying mid-stream, engine errors in any shape."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pdctl.router.api.translated import error_parts
from tests.router.conftest import router_process
from tests.router.test_faults import kill
from tests.support.sim_procs import SERVED, sim_pair

BODIES = {
    "/v1/responses": {"model": SERVED, "input": "stream for a while", "max_output_tokens": 400, "stream": True},
    "/v1/messages": {"model": SERVED, "max_tokens": 400, "stream": True,
                     "messages": [{"role": "user", "content": "stream for a while"}]},
}
ENDS = {"/v1/responses": ["event: error", "event: response.failed"], "/v1/messages": ["event: error"]}


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_decode_dying_mid_stream_ends_it_with_the_apis_error_event(tmp_path: Path, path: str) -> None:
    with (
        sim_pair(tmp_path, speed=20) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
        httpx.Client(timeout=30) as client,
        client.stream("POST", router.url + path, json=BODIES[path]) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("event: ")
        kill(pair.decode)
        rest = [line for line in lines if line.startswith("event: ")]
    assert rest[-len(ENDS[path]):] == ENDS[path]
    assert "event: response.completed" not in rest and "event: message_stop" not in rest


def test_error_bodies_are_read_in_every_shape() -> None:
    assert error_parts(b'{"error": {"message": "bad", "type": "BadRequestError"}}') == ("bad", "BadRequestError")
    assert error_parts(b'{"detail": "Not Found"}') == ("Not Found", "invalid_request_error")
    assert error_parts(b'{"error": "plain"}') == ("plain", "api_error")
    assert error_parts(b"upstream fell over") == ("upstream fell over", "api_error")
