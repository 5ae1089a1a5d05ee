"""Expiry, the recompute threshold, both load-failure policies and the fault flags, on real processes."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.sim.helpers import as_hit, output_ids, prefill, two_hop, wait_until
from tests.support.sim_procs import sim_pair, sim_process

FAILED = "vllm:nixl_num_failed_transfers_total"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
READS = "vllm:nixl_xfer_time_seconds_count"
USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"


def _turn2(chunks: list[dict], turn1: list[int]) -> dict:
    return {"prompt": turn1 + output_ids(chunks) + list(range(9000, 9100))}


def test_expired_handle_is_declined_then_recomputed_or_failed(tmp_path: Path) -> None:
    # A TTL under P's 5 s margin makes every decode handle count as expired at once.
    with sim_pair(tmp_path, decode_kwargs={"ttl": 2}, prefill_kwargs={"policy": "recompute"}) as pair:
        turn1 = list(range(1000, 1200))
        chunks, handle = two_hop(pair, {"prompt": turn1})
        r = prefill(pair.prefill_url, _turn2(chunks, turn1), as_hit(handle))
        assert r.status_code == 200
        assert r.json()["kv_transfer_params"]["do_remote_prefill"] is True
        assert pair.prefill.metric(EXPIRED) == 1 and pair.prefill.metric(READS) == 0
        rid, eid = handle["remote_request_id"], handle["remote_engine_id"]
        line = f"Declining expired remote read for {rid} from engine {eid}."
        assert line in pair.prefill.log_text()
        with sim_process(tmp_path, "prefill", name="prefill-fail", policy="fail") as strict:
            r = prefill(strict.url, _turn2(chunks, turn1), as_hit(handle))
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "InternalServerError"
            assert strict.metric(EXPIRED) == 1


def test_ttl_frees_decode_blocks(tmp_path: Path) -> None:
    with sim_pair(tmp_path, decode_kwargs={"ttl": 1}) as pair:
        two_hop(pair, {"prompt": list(range(1000, 1100))})
        assert pair.decode.metric(USAGE) > 0
        assert wait_until(lambda: pair.decode.metric(USAGE) == 0)


def test_below_threshold_recomputes_and_frees_the_peer(tmp_path: Path) -> None:
    with sim_pair(tmp_path, threshold=64) as pair:
        short = list(range(1000, 1030))
        chunks, handle = two_hop(pair, {"prompt": short})
        assert pair.decode.metric(READS) == 0  # 30 tokens < 64: D recomputed instead of pulling
        assert handle["remote_num_tokens"] == 37
        r = prefill(pair.prefill_url, {"prompt": short + output_ids(chunks) + [5, 6]}, as_hit(handle))
        assert r.status_code == 200 and pair.prefill.metric(READS) == 0
        assert wait_until(lambda: pair.decode.metric(USAGE) == 0)  # the notify freed D's blocks

        long = list(range(2000, 2100))
        chunks, handle = two_hop(pair, {"prompt": long})
        assert pair.decode.metric(READS) == 1
        assert prefill(pair.prefill_url, _turn2(chunks, long), as_hit(handle)).status_code == 200
        assert pair.prefill.metric(READS) == 1


def test_failed_read_follows_the_policy(tmp_path: Path) -> None:
    with sim_pair(tmp_path, prefill_kwargs={"policy": "recompute"}, prefill_args=["--fail-kv-reads", "1"]) as pair:
        turn1 = list(range(1000, 1100))
        chunks, handle = two_hop(pair, {"prompt": turn1})
        assert prefill(pair.prefill_url, _turn2(chunks, turn1), as_hit(handle)).status_code == 200
        assert pair.prefill.metric(FAILED) == 1 and pair.prefill.metric(READS) == 0

        with sim_process(tmp_path, "prefill", name="prefill-fail", policy="fail", args=["--fail-kv-reads", "1"]) as p:
            chunks, handle = two_hop(pair, {"prompt": list(range(3000, 3100))})
            r = prefill(p.url, _turn2(chunks, list(range(3000, 3100))), as_hit(handle))
            assert r.status_code == 500 and "KV transfer failed" in r.json()["error"]["message"]
            assert p.metric(FAILED) == 1
            # the fault is spent: the same handle, unread, now loads
            assert prefill(p.url, _turn2(chunks, list(range(3000, 3100))), as_hit(handle)).status_code == 200
            assert p.metric(READS) == 1


def test_unreachable_peer_is_a_failed_transfer(tmp_path: Path) -> None:
    with sim_pair(tmp_path) as pair:
        turn1 = list(range(1000, 1100))
        chunks, handle = two_hop(pair, {"prompt": turn1})
        gone = {**as_hit(handle), "remote_host": "127.0.0.1", "remote_port": 1}  # nothing listens on port 1
        r = prefill(pair.prefill_url, _turn2(chunks, turn1), gone)
        assert r.status_code == 500
        assert pair.prefill.metric(FAILED) == 1


def test_die_after(tmp_path: Path) -> None:
    with sim_process(tmp_path, "prefill", args=["--die-after", "1"]) as p:
        assert prefill(p.url, {"prompt": [1, 2, 3]}).status_code == 200
        p.proc.wait(timeout=20)
        assert p.proc.returncode == 1
        assert "--die-after 1 reached" in p.log_text()


def test_client_disconnect_frees_the_request(tmp_path: Path) -> None:
    with sim_process(tmp_path, "decode", speed=1) as d:
        body = {"model": "Qwen", "prompt": list(range(1000, 1100)), "max_tokens": 500, "stream": True}
        with httpx.stream("POST", f"{d.url}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()  # kept open: dropping the iterator would close the response
            assert next(lines).startswith("data: ")
            assert d.metric(RUNNING) == 1 and d.metric(USAGE) > 0
        assert wait_until(lambda: d.metric(RUNNING) == 0 and d.metric(USAGE) == 0)


def test_non_streaming_decode_returns_its_handle_in_the_body(tmp_path: Path) -> None:
    with sim_pair(tmp_path, speed=float("inf")) as pair:
        prompt = list(range(1000, 1100))
        p = prefill(pair.prefill_url, {"prompt": prompt}).json()["kv_transfer_params"]
        body = {"model": "Qwen", "prompt": prompt, "max_tokens": 5, "return_token_ids": True, "kv_transfer_params": p}
        d = httpx.post(f"{pair.decode_url}/v1/completions", json=body, timeout=30).json()
        assert d["choices"][0]["prompt_token_ids"] == prompt and len(d["choices"][0]["token_ids"]) == 5
        handle = d["kv_transfer_params"]
        assert handle["do_remote_decode"] is True and handle["remote_num_tokens"] == 104
        assert handle["remote_port"] == pair.decode.side_port
