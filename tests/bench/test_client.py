"""The bench client on every API the router serves: TTFT, tokens and reuse measured the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.bench.traffic.client import ClientOptions, play
from pdctl.bench.traffic.workload import Api, Conversation, WorkloadSpec, build
from tests.router.conftest import RouterProc, corrupt, router_process
from tests.support.sim_procs import SERVED, SimPair, sim_pair


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimPair, RouterProc]]:
    logs = tmp_path_factory.mktemp("bench-client")
    with sim_pair(logs, speed=1000, block_size=16) as pd, router_process(logs, [pd.prefill_url],
                                                                         [pd.decode_url]) as router:
        yield pd, router


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "completions"])
def test_every_api_is_timed_and_reuses_kv(deployment: tuple[SimPair, RouterProc], api: Api,
                                          tmp_path: Path) -> None:
    pd, router = deployment
    spec = WorkloadSpec(lengths=(300,), conversations=1, turns=3, user_tokens=20, output_tokens=8, api=api)
    convs = [Conversation(p, api, f"{api}-{p.key}") for p in build(spec)]
    opts = ClientOptions(url=router.url, model=SERVED, api=api, output_tokens=8)
    records = asyncio.run(play(convs, opts, leg="on"))
    assert [r.ok for r in records] == [True] * 3, [r.error for r in records]
    assert all(r.ttft_ms is not None and r.ttft_ms > 0 for r in records)
    assert [r.output_num_tokens for r in records] == [8, 8, 8]
    assert all(r.input_num_tokens and r.input_num_tokens > 0 for r in records)
    assert [r.reuse for r in records] == ["miss", "hit", "hit"]
    # the router's choice for each warm turn (X-PD-KV-Choice), none for the cold one
    assert records[0].kv_choice is None and records[0].kv_choice_basis is None
    for r in records[1:]:
        assert r.kv_choice in ("decode_cache", "decode_read", "recomputed"), r
        assert r.kv_choice_basis in ("model", "default")
        assert (r.kv_choice_predicted_ms is not None) == (r.kv_choice_basis == "model")
    assert corrupt(pd.prefill, pd.decode) == 0
