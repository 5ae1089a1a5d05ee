"""Clients that leave: their upstream work stops on both hops, streaming or not, running or queued (item 4)."""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.router.conftest import RouterProc, router_process
from tests.router.faults import eventually
from tests.router.talk import Conversation
from tests.support.sim_procs import SimProc, sim_pair

RUNNING = "vllm:num_requests_running"


def abandon(url: str, body: dict[str, object], after: float) -> None:
    """Send a request and hang up after `after` seconds without reading the answer."""
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json=body, timeout=after)


def idle(*sims: SimProc) -> bool:
    return all(s.metric(RUNNING) == 0 for s in sims)


def test_abandoned_non_streaming_requests_free_their_engine_slots(tmp_path: Path) -> None:
    # At real speed 2000 tokens take over a minute; the clients leave after a second.
    with (
        sim_pair(tmp_path, speed=1) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        body = {"model": "Qwen", "messages": [{"role": "user", "content": "write a long story"}], "max_tokens": 2000}
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: abandon(router.url, body, 1.0), range(4)))
        assert eventually(lambda: idle(pair.prefill, pair.decode), within=5)
        assert pair.decode.metric("pdctl_sim_aborted_requests_total") == 4
        r = httpx.post(router.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200  # and the next client is served at once


def test_an_abandoned_request_for_several_samples_frees_its_decode_slot(tmp_path: Path) -> None:
    """n > 1 runs on a decode alone (batches.sampled); it is cancelled like every other turn."""
    with (
        sim_pair(tmp_path, speed=1) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        body = {"model": "Qwen", "messages": [{"role": "user", "content": "two long stories"}], "max_tokens": 2000,
                "n": 2}
        abandon(router.url, body, 1.0)
        assert eventually(lambda: idle(pair.decode), within=5)
        assert pair.decode.metric("pdctl_sim_aborted_requests_total") == 2  # each sample is a child request


def test_a_queued_request_whose_client_left_never_reaches_an_engine(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=1) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url], "--max-inflight-per-instance", "1") as router,
    ):
        long = {"model": "Qwen", "messages": [{"role": "user", "content": "hold the slot"}], "max_tokens": 2000}
        with ThreadPoolExecutor(2) as pool:
            holder = pool.submit(abandon, router.url, long, 4.0)
            assert eventually(lambda: pair.decode.metric(RUNNING) == 1)
            prompts = pair.prefill.metric("vllm:prompt_tokens_total")
            abandon(router.url, {**long, "messages": [{"role": "user", "content": "queued " * 50}]}, 1.0)
            holder.result()
        assert eventually(lambda: idle(pair.prefill, pair.decode), within=5)
        assert pair.prefill.metric("vllm:prompt_tokens_total") == prompts  # the queued one was never prefilled


def test_a_client_that_hangs_up_right_after_the_last_byte_still_gets_its_next_turn_reused(
    router: RouterProc,
) -> None:
    # uvicorn reports a finished response as disconnected: the router must still store the turn's new handle.
    host, port = router.url.removeprefix("http://").split(":")
    convs = [Conversation(router.url, False, True, "body", uuid.uuid4().hex) for _ in range(20)]
    for conv in convs:
        body = conv.body("a first turn of some length " * 6)
        payload = json.dumps(body).encode()
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
            raw = b""
            while b"data: [DONE]" not in raw:
                raw += s.recv(65536)
        text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in raw.decode().split("\n")
                       if line.startswith("data: {"))
        conv.accept(body, text)
    assert [conv.turn(" second").reason for conv in convs] == ["verified"] * 20
