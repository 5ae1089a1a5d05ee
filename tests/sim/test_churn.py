"""The simulator under churn: nothing it keeps per request grows with what it has retained, has in flight or has
served (retained set, expiry heap, side-channel connections, transfer stats); retained blocks count against KV
and a full KV makes a request wait, then proceed once retention expires or is released; batched notifies free
every id they carry."""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sim import kv as simkv
from pdctl.sim.blocks import BlockPool
from pdctl.sim.kv import KVStore
from pdctl.sim.metrics import TransferStats
from tests.sim.helpers import MISS, as_hit, two_hop, wait_until
from tests.support.sim_procs import SERVED, SimProc, sim_pair, sim_process

RETAINED = "pdctl_sim_kv_retained_requests"
RETAINED_BLOCKS = "pdctl_sim_kv_retained_blocks"
HEAP = "pdctl_sim_kv_expiry_heap_entries"
USAGE = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
KV_WAITS = "pdctl_sim_kv_waits_total"
PEAK_IN_FLIGHT = "pdctl_sim_side_channel_in_flight_peak"
NOTIFIED_IDS = "pdctl_sim_side_channel_notified_ids_total"
NOTIFY_REQUESTS = "pdctl_sim_side_channel_notify_requests_total"


def freed(sim: SimProc, how: str) -> float:
    text = httpx.get(f"{sim.url}/metrics", timeout=10).text
    found = re.findall(rf'^pdctl_sim_kv_retained_freed_total\{{[^}}]*how="{how}"[^}}]*\}} (\S+)$', text, re.M)
    assert found, f"no pdctl_sim_kv_retained_freed_total{{how={how!r}}} in /metrics"
    return float(found[0])


def client_connections_to(port: int) -> int:
    """Established TCP connections on this host whose remote end is 127.0.0.1:`port` (the client sides)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def release_body(handle: dict[str, Any]) -> dict[str, Any]:
    """The router's release: one token id to the prefill with the decode's handle and remote_num_tokens 0, so the
    prefill reads nothing and notifies the decode (pdctl/router/kv/release.py)."""
    kv = {**as_hit(handle), "remote_num_tokens": 0}
    kv.pop("remote_blocks_expiry_time", None)
    return {"model": SERVED, "prompt": [7], "max_tokens": 1, "stream": False, "kv_transfer_params": kv}


# -- in-process: the expiry heap and the transfer stats ------------------------------------------------------------
def test_expiry_heap_stays_bounded_by_what_is_retained() -> None:
    pool = BlockPool(num_blocks=50_000, block_size=16)
    frees: dict[str, int] = {"expired": 0, "read": 0, "released": 0}
    store = KVStore(pool, "e", lambda how, n: frees.__setitem__(how, frees[how] + n))
    most_heap = 0
    for i in range(20_000):
        store.retain(f"r{i}", pool.allocate(2), 3600, "ttl")
        if i >= 10:  # ten stay retained; every other one is released before it expires
            store.release(f"r{i - 10}", "released")
        most_heap = max(most_heap, len(store.heap))
    assert len(store.retained) == 10 and store.retained_blocks == 20
    assert most_heap <= 2 * 10 + simkv.HEAP_SLACK + 1  # not 20,000: released entries are dropped on rebuild
    assert frees["released"] == 19_990
    for entry in store.retained.values():
        entry.deadline = 0.0  # due now; the heap's own deadlines are what sweep reads
    store.heap = [(0.0, e.seq, e.request_id) for e in store.retained.values()]
    assert store.sweep() == 10 and frees["expired"] == 10
    assert not store.retained and not store.heap and store.retained_blocks == 0
    assert pool.num_free == pool.num_blocks


def test_retaining_an_id_again_frees_the_older_blocks() -> None:
    pool = BlockPool(num_blocks=10, block_size=16)
    store = KVStore(pool, "e")
    store.retain("r", pool.allocate(3), 60, "ttl")
    store.retain("r", pool.allocate(2), 60, "ttl")
    assert store.retained_blocks == 2 and pool.num_free == 8
    assert store.release("r") and pool.num_free == 10 and store.sweep() == 0


def test_transfer_stats_keep_sums_and_a_bounded_sample() -> None:
    stats = TransferStats()
    for i in range(10_000):
        stats.add(0.001 * (i % 10 + 1), 0.0005, 2**20, 4)
    assert len(stats.xfer_s) == len(stats.post_s) == TransferStats.SAMPLE_WINDOW
    line = stats.line()
    assert "Num successful transfers=10000," in line and "Avg xfer time (ms)=5.5," in line
    assert "P90 xfer time (ms)=10.0," in line and "Avg number of descriptors=4.0," in line


# -- real processes --------------------------------------------------------------------------------------------------
async def _conversation(client: httpx.AsyncClient, pair: Any, i: int, release: bool) -> dict[str, Any]:
    """A new one-turn conversation through both hops; with `release`, the router's release of its decode handle."""
    prompt = [100_000 + i, *range(1000, 1040)]
    p = await client.post(f"{pair.prefill_url}/v1/completions", json={
        "model": SERVED, "prompt": prompt, "max_tokens": 1, "stream": False, "kv_transfer_params": MISS})
    assert p.status_code == 200, p.text
    d = await client.post(f"{pair.decode_url}/v1/completions", json={
        "model": SERVED, "prompt": prompt, "max_tokens": 4, "stream": False, "ignore_eos": True,
        "kv_transfer_params": p.json()["kv_transfer_params"]})
    assert d.status_code == 200, d.text
    handle: dict[str, Any] = d.json()["kv_transfer_params"]
    if release:
        r = await client.post(f"{pair.prefill_url}/v1/completions", json=release_body(handle))
        assert r.status_code == 200, r.text
    return handle


def test_long_churn_keeps_retention_heap_and_side_channel_bounded(tmp_path: Path) -> None:
    # The TTL is long enough that each release (sent right after its turn) arrives before its handle expires, even
    # on a loaded machine, and short enough that the unreleased half expires within the test.
    conversations, streams = 1500, 32
    ttl = 10
    with sim_pair(tmp_path, speed=float("inf"), ttl=ttl, num_blocks=200_000, max_num_seqs=256) as pair:
        samples: list[dict[str, float]] = []

        async def drive() -> None:
            limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                queue = iter(range(conversations))

                async def stream() -> None:
                    for i in queue:
                        await _conversation(client, pair, i, release=i % 2 == 0)
                        if i % 250 == 0:
                            text = (await client.get(f"{pair.decode_url}/metrics")).text
                            samples.append({name: _sample(text, name) for name in (RETAINED, HEAP)})

                await asyncio.gather(*(stream() for _ in range(streams)))

        asyncio.run(drive())
        releases = (conversations + 1) // 2
        # every release's id reached the decode, batched or not: none lost
        assert wait_until(lambda: freed(pair.decode, "released") == releases)
        assert pair.prefill.metric(NOTIFIED_IDS) == releases
        assert 1 <= pair.prefill.metric(NOTIFY_REQUESTS) <= releases
        # every decode read spent its prefill lease; the decode's unreleased handles expire after the TTL
        assert freed(pair.prefill, "read") == conversations
        assert wait_until(lambda: pair.decode.metric(RETAINED) == 0, timeout=ttl + 20)
        assert freed(pair.decode, "expired") == conversations - releases
        assert pair.decode.metric(RETAINED_BLOCKS) == 0 and pair.decode.metric(USAGE) == 0
        assert pair.decode.metric(HEAP) == 0  # every entry popped: released ones dropped, the rest expired
        # the prefill still holds the releases' own one-block leases (30 s; stock vLLM keeps them too)
        assert pair.prefill.metric(HEAP) <= 2 * pair.prefill.metric(RETAINED) + simkv.HEAP_SLACK
        # while it ran: the heap never held more than twice the retained set plus the slack
        assert samples and all(s[HEAP] <= 2 * s[RETAINED] + simkv.HEAP_SLACK + 1 for s in samples)
        # side channels: at most SIDE_CHANNEL_IN_FLIGHT requests, so connections, to a peer at any time
        assert 1 <= pair.decode.metric(PEAK_IN_FLIGHT) <= simkv.SIDE_CHANNEL_IN_FLIGHT
        assert 1 <= pair.prefill.metric(PEAK_IN_FLIGHT) <= simkv.SIDE_CHANNEL_IN_FLIGHT
        assert client_connections_to(pair.prefill.side_port) <= simkv.SIDE_CHANNEL_IN_FLIGHT
        assert client_connections_to(pair.decode.side_port) <= simkv.SIDE_CHANNEL_IN_FLIGHT
        assert pair.decode.metric("pdctl_sim_side_channel_peers") == 1


def _sample(text: str, name: str) -> float:
    found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert found, f"no {name} in /metrics"
    return float(found[0])


@pytest.mark.parametrize("freed_by", ["expired", "released"])
def test_full_kv_waits_for_retention_to_go_then_proceeds(tmp_path: Path, freed_by: str) -> None:
    # The decode has 40 blocks of 16 tokens. Turn 1 (300 tokens + output) keeps 20 of them for a readback; turn 2
    # of another conversation needs 29, so it must wait until turn 1's retention expires or is released.
    ttl = 4 if freed_by == "expired" else 480
    with sim_pair(tmp_path, decode_kwargs={"num_blocks": 40, "ttl": ttl}) as pair:
        _, handle = two_hop(pair, {"prompt": list(range(1000, 1300))})
        assert pair.decode.metric(RETAINED) == 1
        held = pair.decode.metric(RETAINED_BLOCKS)
        assert held == 20 and pair.decode.metric(USAGE) == pytest.approx(held / 40)
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(two_hop, pair, {"prompt": list(range(5000, 5450))})
            assert wait_until(lambda: pair.decode.metric(WAITING) == 1)
            assert pair.decode.metric(KV_WAITS) == 1 and not second.done()
            if freed_by == "released":
                r = httpx.post(f"{pair.prefill_url}/v1/completions", json=release_body(handle), timeout=30)
                assert r.status_code == 200, r.text
            chunks, _ = second.result(timeout=60)
        assert chunks  # it streamed its tokens once the blocks were back
        assert freed(pair.decode, freed_by) == 1
        assert pair.decode.metric(WAITING) == 0
        assert pair.decode.metric("pdctl_sim_corrupt_reuse_total") == 0


def test_notify_batches_free_every_id(tmp_path: Path) -> None:
    # 200 decode handles released at once through the prefill: the prefill queues their notifies and sends them
    # in batches; the decode frees every one.
    n = 200
    with sim_pair(tmp_path, speed=float("inf"), num_blocks=20_000, max_num_seqs=256) as pair:
        async def run() -> None:
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
                handles = await asyncio.gather(*(_conversation(client, pair, i, release=False) for i in range(n)))
                assert pair.decode.metric(RETAINED) == n
                started = time.perf_counter()
                answers = await asyncio.gather(*(client.post(f"{pair.prefill_url}/v1/completions",
                                                              json=release_body(h)) for h in handles))
                assert all(a.status_code == 200 for a in answers), time.perf_counter() - started

        asyncio.run(run())
        assert wait_until(lambda: pair.decode.metric(RETAINED) == 0)
        assert freed(pair.decode, "released") == n and freed(pair.decode, "expired") == 0
        assert pair.prefill.metric(NOTIFIED_IDS) == n
        assert pair.prefill.metric(NOTIFY_REQUESTS) <= n
        assert pair.decode.metric(USAGE) == 0


def test_notify_accepts_one_id_or_a_batch_and_refuses_a_bad_body(tmp_path: Path) -> None:
    with sim_pair(tmp_path) as pair:
        _, h1 = two_hop(pair, {"prompt": list(range(1000, 1100))})
        _, h2 = two_hop(pair, {"prompt": list(range(2000, 2100))})
        _, h3 = two_hop(pair, {"prompt": list(range(3000, 3100))})
        side = f"http://127.0.0.1:{pair.decode.side_port}/notify"
        one = httpx.post(side, json={"request_id": h1["remote_request_id"]}, timeout=10)
        assert one.json() == {"freed": 1, "ids": 1}
        batch = httpx.post(side, json={"request_ids": [h2["remote_request_id"], h3["remote_request_id"], "x"]},
                           timeout=10)
        assert batch.json() == {"freed": 2, "ids": 3}
        bad = httpx.post(side, json={"request_ids": "x"}, timeout=10)
        assert bad.status_code == 400 and "request_ids must be a list" in bad.json()["error"]
        assert pair.decode.metric(RETAINED) == 0 and freed(pair.decode, "released") == 3


def test_the_kv_blocks_are_frozen_out_of_the_garbage_collectors_scans(tmp_path: Path) -> None:
    # vLLM freezes its startup heap once the engine is built; the simulator's startup heap is one Block per KV block,
    # which an oldest-generation collection would otherwise walk with the event loop stopped.
    blocks = 300_000
    with sim_process(tmp_path, "decode", num_blocks=blocks) as sim:
        assert sim.metric("pdctl_sim_gc_frozen_objects") >= blocks
        text = httpx.get(f"{sim.url}/metrics", timeout=10).text
        assert re.search(r'^python_gc_collections_total\{generation="2"\} \d', text, re.M)
