"""The overflow rule's signal: an engine's KV use from its /metrics, and what the router sent since the poll.
Polls a real simulated engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from pdctl.router.kv.usage import KvUse, kv_usage
from pdctl.router.upstream.pools import Pool
from tests.support.sim_procs import sim_process


def test_kv_usage_reads_vllm_s_gauge_and_nothing_else() -> None:
    text = ('# HELP vllm:kv_cache_usage_perc KV-cache usage.\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
            'vllm:kv_cache_usage_perc_other 0.9\n')
    assert kv_usage(text) == 0.5  # the fullest engine of the process
    assert kv_usage("vllm:num_requests_running 3\n") is None
    assert kv_usage("vllm:kv_cache_usage_perc nan-ish\n") is None


def test_a_poll_reads_the_engine_and_counts_what_was_sent_after_it(tmp_path: Path) -> None:
    with sim_process(tmp_path, "decode", block_size=16, num_blocks=100) as sim:  # 1600 tokens
        pool = Pool("decode", [sim.url])
        u = pool.members[0]
        kv = KvUse()
        assert kv.use(u) is None  # never polled: unknown

        async def poll() -> None:
            async with httpx.AsyncClient() as client:
                await kv.poll(u, client, 5)

        kv.sent(u, 800)  # sent before the poll: the engine's own figure includes it
        asyncio.run(poll())
        assert kv.use(u) == pytest.approx(0.0)
        kv.sent(u, 400)
        assert kv.use(u) == pytest.approx(0.25)
        assert kv.use(u, 400) == pytest.approx(0.5)
        assert kv.snapshot([pool]) == {sim.url: 0.25}
        sim.stop()
        asyncio.run(poll())  # unreachable: the last figure stands
        assert kv.use(u) == pytest.approx(0.25)
