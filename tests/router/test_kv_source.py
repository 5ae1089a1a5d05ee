"""The cheapest source of a warm turn's history KV (issue 29): the prefill's own prefix cache, else a D->P read of
only what the prefill lacks, else recompute. Real simulator processes, a real router with its defaults
(`--min-read-tokens` 256), the source reported per turn in X-PD-KV-Reuse and /stats; the simulator's integrity
oracle stays 0 in every case."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from pdctl.router.wire import Reuse
from tests.router.conftest import SPEED, corrupt, router_process
from tests.router.talk import Conversation
from tests.router.test_restarts import restart_in_place
from tests.support.sim_procs import sim_pair

READS = "vllm:nixl_xfer_time_seconds_count"  # on the prefill: its D->P reads
HISTORY = " ".join(f"h{i}" for i in range(700))  # ~700 tokens: well over one 256-token read


def _reuse(reply_headers: httpx.Headers) -> Reuse:
    return Reuse.parse(reply_headers.get("x-pd-kv-reuse"))


def test_each_case_takes_the_cheapest_source(tmp_path: Path) -> None:
    """Prefill cache holds all (a short reply since): nothing read. Holds part (a long reply since): only what it
    lacks is read. Holds none (prefill caching off): all of it read. Decode restarted: recompute."""
    for sub in ("cached", "none"):
        (tmp_path / sub).mkdir()
    with (
        sim_pair(tmp_path / "cached", speed=SPEED, prefill_kwargs={"prefix_caching": True}) as pd,
        router_process(tmp_path / "cached", [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "0",
                       "--min-read-tokens", "256") as router,
    ):
        # All: the prefill computed turn 1's prompt; the decode holds it and 8 reply tokens more.
        conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex, max_tokens=8)
        assert conv.turn(f"{uuid.uuid4().hex} {HISTORY}").status == 200
        reads = pd.prefill.metric(READS)
        reply = conv.turn("and one more question?")
        r = _reuse(reply.headers)
        assert reply.status == 200 and (r.outcome, r.reason, r.read) == ("hit", "prefill_cached", 0), r
        assert r.source == "prefill_cache" and r.tokens >= 700
        assert pd.prefill.metric(READS) == reads  # nothing crossed the link
        # Part: a 400-token reply the prefill never computed; the read is that reply, not the history.
        conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex, max_tokens=400)
        assert conv.turn(f"{uuid.uuid4().hex} {HISTORY}").status == 200
        reply = conv.turn("go on")
        r = _reuse(reply.headers)
        assert reply.status == 200 and (r.outcome, r.reason, r.source) == ("hit", "verified", "decode_read"), r
        assert r.read is not None and 256 <= r.read <= 420 < r.tokens, r  # the reply (and a block), no history
        assert pd.prefill.metric(READS) == reads + 1
        # Token ids (an agent's completions): the prefill checks them too, so its cache is the source here as well.
        with httpx.Client(timeout=30) as client:
            prompt, cid = [3000 + i for i in range(700)], uuid.uuid4().hex
            for turn in range(2):
                body = {"model": "Qwen", "prompt": prompt, "max_tokens": 8, "return_token_ids": True}
                resp = client.post(f"{router.url}/v1/completions", json=body, headers={"X-Conversation-ID": cid})
                assert resp.status_code == 200, resp.text
                prompt = [*prompt, *resp.json()["choices"][0]["token_ids"], 9000 + turn]
            r = _reuse(resp.headers)
            assert (r.outcome, r.reason, r.read) == ("hit", "prefill_cached", 0), r
        assert pd.prefill.metric(READS) == reads + 1
        stats = router.stats()
        assert stats["reuse_reasons"]["prefill_cached"] == 2 and stats["reuse_reasons"]["verified"] == 1
        # Decode restarted: the handle is dropped unread, the prefill computes what its own cache lacks.
        decode = restart_in_place(pd.decode, tmp_path / "cached")
        try:
            reply = conv.turn("after the restart")
            r = _reuse(reply.headers)
            assert reply.status == 200 and (r.outcome, r.reason, r.source) == (
                "miss", "decode_restarted", "recomputed"), r
            assert corrupt(pd.prefill, decode) == 0
        finally:
            decode.stop()
    with (
        sim_pair(tmp_path / "none", speed=SPEED) as pd,  # the prefill runs without prefix caching
        router_process(tmp_path / "none", [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "0",
                       "--min-read-tokens", "256") as router,
    ):
        conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex, max_tokens=8)
        assert conv.turn(f"{uuid.uuid4().hex} {HISTORY}").status == 200
        reply = conv.turn("and one more question?")
        r = _reuse(reply.headers)
        assert reply.status == 200 and (r.outcome, r.reason, r.source) == ("hit", "verified", "decode_read"), r
        assert r.read == r.tokens >= 700  # the prefill held nothing: all of it read
        # Too short a history to be worth a read, with nothing cached: recomputed.
        short = Conversation(router.url, False, False, "body", uuid.uuid4().hex, max_tokens=8)
        assert short.turn("a short first turn").status == 200
        reply = short.turn(" and a short second")
        r = _reuse(reply.headers)
        assert reply.status == 200 and (r.outcome, r.reason, r.source) == ("miss", "read_not_worth", "recomputed")
        assert corrupt(pd.prefill, pd.decode) == 0
