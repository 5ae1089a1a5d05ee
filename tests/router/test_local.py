"""Conditional disaggregation (`--local-prefill-tokens`): a turn whose decode already caches nearly all of the
prompt runs on that decode alone; a turn with more new tokens goes through the prefill and reads the handle. The
router decides without tokenizing: from what the request adds to the turn the decode last ran
(pdctl.router.turn.local, turn/history.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pdctl.lifecycle.watch.status import router_stats
from pdctl.remote.local import LocalTransport
from pdctl.router.server.routes import ROUTES
from pdctl.router.turn import history as hist
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import RequestContext
from pdctl.sim.tokenizer import encode, render_chat
from tests.router.conftest import RouterProc, assert_clean, corrupt, router_process
from tests.router.instant import Instant, reuse_header, sse_data
from tests.router.talk import Conversation, Reply
from tests.support.relay import late_end
from tests.support.sim_procs import SERVED, SimPair, sim_process

LIMIT = 64
LONG = " ".join(f"w{i}" for i in range(120))  # over LIMIT new tokens: disaggregated
TOKENIZE = "pdctl_sim_tokenize_requests_total"


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


def _ctx(chat: bool, body: dict[str, Any]) -> RequestContext:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return RequestContext("rid", 0.0, "POST", path, [], b"", ROUTES.match(path), body)


def _replied(chat: bool, text: str) -> Capture:
    capture = Capture(chat, False)
    choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
    capture.take({"choices": [choice]}, whole=True)
    return capture


def _missing(held: list[int], prompt: list[int]) -> int:
    same = next((i for i, (a, b) in enumerate(zip(held, prompt, strict=False)) if a != b), min(len(held), len(prompt)))
    return len(prompt) - same


def test_the_estimate_bounds_the_new_tokens_of_an_extended_chat_and_refuses_anything_else() -> None:
    old = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me about " + LONG}]
    reply = "w5 w6 sure, here it is: " + LONG[:200]
    h = hist.history(_ctx(True, {"model": SERVED, "messages": old}), _replied(True, reply))
    assert h is not None and h.size == 3
    held = render_chat(old) + encode(reply)  # what the decode computed: the prompt and the output
    history = [*old, {"role": "assistant", "content": reply}]
    for new in ([{"role": "user", "content": "and day 2?"}],
                [{"role": "user", "content": "ünïcødé wörds, " * 20}],
                [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": "w1 w2"}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "w1 w2 w3 " * 30},
                 {"role": "user", "content": [{"type": "text", "text": "and so?"}]}]):
        bound = hist.added_tokens(_ctx(True, {"model": SERVED, "messages": [*history, *new]}), h)
        assert bound is not None and _missing(held, render_chat([*history, *new])) <= bound < 2000, new
    edited = [{**history[0], "content": "be long"}, *history[1:], {"role": "user", "content": "more"}]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}
    for body in ({"model": SERVED, "messages": edited},  # the history was rewritten
                 {"model": SERVED, "messages": history[:2]},  # fewer messages
                 {"model": SERVED, "messages": [*history, image]},  # an image's tokens are not its URL's bytes
                 {"model": SERVED, "messages": [*history, {"role": "user", "content": "x"}], "tools": [{}]}):
        assert hist.added_tokens(_ctx(True, body), h) is None, body


def test_the_estimate_bounds_the_new_tokens_of_an_extended_text_prompt() -> None:
    prompt, reply = "once upon a time " + LONG, " w7 w8 w9"
    h = hist.history(_ctx(False, {"model": SERVED, "prompt": prompt}), _replied(False, reply))
    held = encode(prompt) + encode(reply)
    for new in (" and then", " ünïcødé " * 10, "w10 w11 " * 40):
        body = {"model": SERVED, "prompt": prompt + reply + new}
        bound = hist.added_tokens(_ctx(False, body), h)
        assert bound is not None and _missing(held, encode(body["prompt"])) <= bound
    assert hist.added_tokens(_ctx(False, {"model": SERVED, "prompt": "twice " + prompt + reply + " x"}), h) is None
    assert hist.added_tokens(_ctx(False, {"model": SERVED, "prompt": prompt}), h) is None  # not longer


@pytest.fixture(scope="module")
def local_at_router(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("local-at-router"), [pd.prefill_url], [pd.decode_url],
                        "--local-prefill-tokens", str(LIMIT), "--verify-at", "router", name="local-at-router") as r:
        yield r


@pytest.mark.parametrize("verify_at", ["prefill", "router"])
def test_a_local_chat_turn_is_decided_without_tokenizing(local_router: RouterProc, local_at_router: RouterProc,
                                                         pd: SimPair, verify_at: str) -> None:
    r = local_router if verify_at == "prefill" else local_at_router
    conv = Conversation(r.url, True, True, "header", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} {LONG}")
    for n in (2, 3):
        calls = pd.prefill.metric(TOKENIZE), pd.decode.metric(TOKENIZE)
        reply = conv.turn(f"and day {n}?")
        assert (reply.outcome, reply.reason) == ("hit", "decode_local"), reply.reuse
        assert _tokens(reply) % 16 == 0 and _tokens(reply) > 0  # whole blocks the decode holds, no more
        assert (pd.prefill.metric(TOKENIZE), pd.decode.metric(TOKENIZE)) == calls
    calls = pd.prefill.metric(TOKENIZE), pd.decode.metric(TOKENIZE)
    reply = conv.turn(LONG)  # disaggregated: verified at the prefill, or after one /tokenize at the router
    assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
    assert pd.prefill.metric(TOKENIZE) == calls[0] + (verify_at == "router")
    assert pd.decode.metric(TOKENIZE) == calls[1]
    assert corrupt(pd.prefill, pd.decode) == 0


def test_an_edited_or_shortened_history_goes_through_the_prefill(local_router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(local_router.url, True, False, "body", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} {LONG}")
    assert conv.turn("and day 2?").reason == "decode_local"
    conv.messages[0]["content"] = f"{uuid.uuid4().hex} {LONG}"  # the client rewrote its first question
    reply = conv.turn("and day 3?")  # a few new tokens, but not after what the decode holds: the prefill verifies
    assert reply.status == 200 and reply.text
    assert reply.reuse == "miss;tokens=0;block=0;reason=prefix_diverged"
    conv.messages = conv.messages[-2:]  # fewer messages than the decode ran
    reply = conv.turn("and day 4?")
    assert reply.status == 200 and reply.text
    assert reply.outcome == "miss" and reply.reason != "decode_local", reply.reuse
    assert corrupt(pd.prefill, pd.decode) == 0
