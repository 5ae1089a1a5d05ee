"""Conditional disaggregation (`--local-prefill-tokens`): a turn whose decode already caches nearly all of the
prompt runs on that decode alone; a turn with more new tokens goes through the prefill and reads the handle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from pdctl.lifecycle.status import router_stats
from pdctl.remote.local import LocalTransport
from tests.router.conftest import RouterProc, assert_clean, corrupt, router_process
from tests.router.instant import Instant, reuse_header, sse_data
from tests.router.talk import Conversation, Reply
from tests.support.late_end import late_end
from tests.support.sim_procs import SERVED, SimPair, sim_process

LIMIT = 64
LONG = " ".join(f"w{i}" for i in range(120))  # over LIMIT new tokens: disaggregated


@pytest.fixture(scope="module")
def local_router(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("local"), [pd.prefill_url], [pd.decode_url],
                        "--local-prefill-tokens", str(LIMIT), name="local-router") as r:
        yield r


def _tokens(reply: Reply) -> int:
    return int(reply.reuse.split("tokens=")[1].split(";")[0])


@pytest.mark.parametrize("mode", ["body", "derived"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_short_turns_skip_the_prefill_and_long_ones_read_the_pinned_handle(
    local_router: RouterProc, pd: SimPair, mode: str, chat: bool
) -> None:
    conv = Conversation(local_router.url, chat, True, mode, uuid.uuid4().hex)
    first = conv.turn(f"{uuid.uuid4().hex} {LONG}")
    assert first.status == 200 and (first.outcome, first.reason) == ("miss", "new_conversation")
    handle_tokens = 0
    for n in (2, 3):  # a few new tokens each: the decode holds the rest
        before = (pd.prefill.metric("vllm:prompt_tokens_total"), pd.decode.metric("vllm:prefix_cache_hits_total"))
        reply = conv.turn(f"and day {n}?")
        assert reply.status == 200 and reply.text
        assert (reply.outcome, reply.reason) == ("hit", "decode_local"), reply.reuse
        assert float(reply.headers["x-pd-prefill-ms"]) == 0
        assert_clean(reply.raw, reply.headers)
        assert pd.prefill.metric("vllm:prompt_tokens_total") == before[0]  # the prefill never saw it
        assert pd.decode.metric("vllm:prefix_cache_hits_total") - before[1] >= _tokens(reply) > handle_tokens
        handle_tokens = _tokens(reply)
    before_p = pd.prefill.metric("vllm:prompt_tokens_total")
    reply = conv.turn(LONG)  # too many new tokens: the prefill computes them after reading turn 1's handle
    assert reply.status == 200 and reply.text
    assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
    assert 0 < _tokens(reply) < handle_tokens  # the pinned handle is turn 1's, shorter than what the decode caches
    assert pd.prefill.metric("vllm:prompt_tokens_total") > before_p
    reply = conv.turn("short again")  # the new handle from that turn makes the next short turn local again
    assert (reply.outcome, reply.reason) == ("hit", "decode_local"), reply.reuse
    assert corrupt(pd.prefill, pd.decode) == 0
    stats = local_router.stats()
    assert stats["local_turns"] >= 3 and stats["reuse"]["hit"] >= 4
    assert router_stats(LocalTransport(), local_router.url).local_turns >= stats["local_turns"]  # as `pdctl status`


def test_without_the_option_every_turn_is_disaggregated(router: RouterProc) -> None:
    conv = Conversation(router.url, False, True, "body", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} {LONG}")
    reply = conv.turn("and day 2?")
    assert (reply.outcome, reply.reason) == ("hit", "verified")
    assert router.stats()["local_turns"] == 0


def test_a_gone_holder_means_a_disaggregated_turn_elsewhere(pd: SimPair, tmp_path_factory: pytest.TempPathFactory
                                                            ) -> None:
    logs = tmp_path_factory.mktemp("gone")
    with (
        sim_process(logs, "decode", name="decode-a", block_size=16) as a,
        sim_process(logs, "decode", name="decode-b", block_size=16) as b,
        router_process(logs, [pd.prefill_url], [a.url, b.url], "--local-prefill-tokens", str(LIMIT)) as r,
    ):
        conv = Conversation(r.url, False, True, "body", uuid.uuid4().hex)
        assert conv.turn(f"{uuid.uuid4().hex} {LONG}").status == 200
        holder, other = (a, b) if a.metric("vllm:prompt_tokens_total") > 0 else (b, a)
        assert (conv.turn("day 2").reason) == "decode_local"
        holder.stop()
        reply = conv.turn("day 3")  # the holder is gone: no local turn, and its handle cannot be read either
        assert reply.status == 200 and reply.text
        assert reply.reason != "decode_local" and reply.outcome == "miss", reply.reuse
        assert other.metric("vllm:prompt_tokens_total") > 0
        assert corrupt(pd.prefill, other) == 0


def test_a_handle_past_half_its_life_is_refreshed_by_a_disaggregated_turn(
    pd: SimPair, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import time

    with router_process(tmp_path_factory.mktemp("refresh"), [pd.prefill_url], [pd.decode_url],
                        "--local-prefill-tokens", str(LIMIT), "--handle-ttl", "4") as r:
        conv = Conversation(r.url, False, True, "body", uuid.uuid4().hex)
        conv.turn(f"{uuid.uuid4().hex} {LONG}")
        assert conv.turn("day 2").reason == "decode_local"
        time.sleep(2.2)  # past half of the 4 s the router trusts the handle: local turns would run into its expiry
        refresh = conv.turn("day 3")
        assert (refresh.outcome, refresh.reason) == ("hit", "verified"), refresh.reuse
        assert conv.turn("day 4").reason == "decode_local"  # on the fresh handle
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_whole_response_turn_runs_locally_too(local_router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(local_router.url, True, False, "header", uuid.uuid4().hex)
    assert conv.turn(f"{uuid.uuid4().hex} {LONG}").status == 200
    reply = conv.turn("and briefly?")
    assert reply.status == 200 and reply.text
    assert (reply.outcome, reply.reason) == ("hit", "decode_local"), reply.reuse
    assert_clean(reply.raw, reply.headers)
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_local_turn_sent_the_instant_the_last_one_ended_finds_the_pinned_handle(
    pd: SimPair, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The decode's streams close 150 ms after their [DONE]; the pinned handle must be back before the client sees it.
    logs = tmp_path_factory.mktemp("local-late")
    with (late_end(logs, pd.decode_url, 150) as decode,
          router_process(logs, [pd.prefill_url], [decode], "--local-prefill-tokens", str(LIMIT),
                         "--local-policy", "always") as router):  # the late streams stay in flight: not `load`
        client = Instant(router.url)
        prompt, reuse = f"{uuid.uuid4().hex} {LONG}", []
        try:
            for user in ("", " and day 2?", " and day 3?", " " + LONG, " short again"):
                body = {"model": SERVED, "prompt": prompt + user, "max_tokens": 6, "stream": True}
                headers, raw = client.post("/v1/completions", body, b"data: [DONE]")
                reuse.append(reuse_header(headers).rsplit("reason=", 1)[-1])
                prompt = body["prompt"] + "".join(e["choices"][0]["text"] for e in sse_data(raw) if e["choices"])
        finally:
            client.close()
    assert reuse == ["new_conversation", "decode_local", "decode_local", "verified", "decode_local"]
    assert corrupt(pd.prefill, pd.decode) == 0
