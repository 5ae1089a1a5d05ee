"""Overload is shed at the door: fast 429 when the queue is full, 503 past the queue deadline, both with
Retry-After, and no instance ejected for it (item 5)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.router.conftest import router_process
from tests.support.sim_procs import sim_pair


def test_overload_gets_429_or_503_with_retry_after_and_ejects_nothing(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=1) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url], "--max-inflight-per-instance", "2",
                       "--max-queue", "2", "--queue-timeout", "1") as router,
    ):
        body = {"model": "Qwen", "prompt": "a long answer please", "max_tokens": 150}  # ~6 s at real speed

        def one(_: int) -> httpx.Response:
            return httpx.post(router.url + "/v1/completions", json=body, timeout=60)

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(one, range(8)))
        by_status = sorted(r.status_code for r in replies)
        assert by_status == [200, 200, 429, 429, 429, 429, 503, 503]
        for r in replies:
            if r.status_code != 200:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == r.status_code
        words = {r.status_code: r.json()["error"]["message"] for r in replies if r.status_code != 200}
        assert "the router is at capacity for its decode instances" in words[429]
        assert "--queue-timeout" in words[503]
        stats = router.stats()
        assert all(u["healthy"] and u["failures"] == 0 for u in (*stats["prefill"], *stats["decode"]))
