"""The router's client-facing limits: slowloris, oversized heads, a connection cap (items 5 and 18)."""

from __future__ import annotations

import contextlib
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import RouterProc, router_process
from tests.router.faults import eventually
from tests.support.sim_procs import SimPair

SLOW = 2000


@pytest.fixture(scope="module")
def guarded(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("guarded"), [pd.prefill_url], [pd.decode_url],
                        "--header-timeout", "5") as r:
        yield r


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def answer(sock: socket.socket) -> bytes:
    """Everything the router sends until it closes the connection."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def completion(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "Qwen", "prompt": "still here?", "max_tokens": 2},
                      timeout=30)


def test_a_slowloris_of_2000_connections_leaves_the_router_serving(guarded: RouterProc) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < SLOW + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, SLOW + 1024), hard))
    socks = []
    try:
        for _ in range(SLOW):
            s = connect(guarded.url)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # and never the rest
            socks.append(s)
        assert completion(guarded.url).status_code == 200
        assert guarded.stats()["requests_total"] >= 1
        # Every trickling connection is answered 408 and closed once its head is overdue.
        for s in socks[:: SLOW // 20]:
            head = answer(s)
            assert head.startswith(b"HTTP/1.1 408 ") and b"--header-timeout" in head
        idle = connect(guarded.url)  # a connection that never sends anything is closed too
        assert answer(idle).startswith(b"HTTP/1.1 408 ")
    finally:
        for s in socks:
            s.close()
    assert completion(guarded.url).status_code == 200


@pytest.mark.parametrize(("head", "words"), [
    (b"".join(b"x-h%d: v\r\n" % i for i in range(10000)), b"more than 256 request headers"),
    (b"x-big: " + b"a" * (1 << 20) + b"\r\n", b"request head over 65536 bytes"),
])
def test_too_many_or_too_large_headers_are_431(guarded: RouterProc, head: bytes, words: bytes) -> None:
    s = connect(guarded.url)
    request = b"GET /health HTTP/1.1\r\nhost: x\r\n" + head + b"\r\n"
    # The client is still sending, 4 KiB at a time, when the router answers. A router that closed outright
    # would meet the rest with a reset that takes the 431 with it (199 of 200 tries); the lingering close reads
    # and drops the rest instead.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for at in range(0, len(request), 4096):
            s.sendall(request[at:at + 4096])
    reply = answer(s)
    assert reply.startswith(b"HTTP/1.1 431 ") and words in reply and b'"code":431' in reply
    s.close()


def test_past_the_connection_cap_new_clients_get_503_with_retry_after(pd: SimPair, tmp_path: Path) -> None:
    with router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--max-client-connections", "20") as router:
        held = [connect(router.url) for _ in range(20)]
        try:
            extra = connect(router.url)
            reply = answer(extra)
            assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply.lower()
            assert b"--max-client-connections" in reply
        finally:
            for s in held:
                s.close()
        assert eventually(lambda: completion(router.url).status_code == 200)  # once the router saw them close


def test_a_body_that_never_finishes_is_408(pd: SimPair, tmp_path: Path) -> None:
    with router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--body-timeout", "1") as router:
        s = connect(router.url)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"model\": ")  # and the other 90 bytes never come
        reply = answer(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 408 ") and b"--body-timeout" in reply and b'"code":408' in reply
