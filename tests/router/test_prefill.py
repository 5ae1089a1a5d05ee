"""The warm turn's tokenizer work. Verified at the prefill (the default): no /tokenize at all, the prefill checks the
router's digests against its own tokenization, and one that does not is a miss. Verified at the router: one
/tokenize without token strings for chat, and the prefill computes the verified ids instead of rendering the
history again. Token ids need no tokenizer either way. Every reuse stays verified."""

from __future__ import annotations

import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.router.turn.prefill import prefill_request
from tests.router.conftest import BLOCK, RouterProc, assert_clean, corrupt, router_process
from tests.router.talk import Conversation
from tests.support.relay import recorder
from tests.support.sim_procs import SERVED, SimPair, SimProc, sim_pair

TOKENIZE = "pdctl_sim_tokenize_requests_total"
TOKENIZE_BYTES = "pdctl_sim_tokenize_response_bytes_total"
ENCODED = "pdctl_sim_encoded_prompt_tokens_total"


def _counts(sim: SimProc) -> tuple[float, float, float]:
    return sim.metric(TOKENIZE), sim.metric(TOKENIZE_BYTES), sim.metric(ENCODED)


@pytest.fixture(scope="module")
def at_router(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("at-router"), [pd.prefill_url], [pd.decode_url],
                        "--verify-at", "router", name="at-router") as r:
        yield r


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_warm_turn_verified_at_the_prefill_makes_no_tokenize_call(router: RouterProc, pd: SimPair,
                                                                    chat: bool) -> None:
    conv = Conversation(router.url, chat, True, "header", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} tell me about the sea " + "and the sky " * 20)
    for n in range(2, 5):
        calls, _, encoded = _counts(pd.prefill)
        reply = conv.turn(f"and what happened on day {n}?")
        assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
        assert int(reply.reuse.split("tokens=")[1].split(";")[0]) > 0
        assert_clean(reply.raw, reply.headers)
        assert pd.prefill.metric(TOKENIZE) == calls  # nothing asked the prefill for ids ...
        assert pd.prefill.metric(ENCODED) > encoded  # ... it tokenized the request itself, and checked the digests
    assert corrupt(pd.prefill, pd.decode) == 0


def test_the_decode_never_gets_the_digests_or_the_report(pd: SimPair, tmp_path: Path) -> None:
    with (recorder(tmp_path, pd.decode_url) as (decode, sent),
          recorder(tmp_path, pd.prefill_url) as (prefill, asked),
          router_process(tmp_path, [prefill], [decode]) as r):
        conv = Conversation(r.url, True, True, "body", uuid.uuid4().hex)
        conv.turn(f"{uuid.uuid4().hex} tell me about the sea " + "and the sky " * 20)
        for n in (2, 3):
            reply = conv.turn(f"and day {n}?")
            assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
        assert asked.read_bytes().count(b'"pdctl_prefix":{') == 2  # the prefill got the digests, twice ...
        assert b"pdctl_" not in sent.read_bytes() and b"kv_transfer_params" in sent.read_bytes()  # ... the decode not
        assert corrupt(pd.prefill, pd.decode) == 0


def test_verify_at_router_tokenizes_once_and_the_prefill_computes_the_verified_ids(
        at_router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(at_router.url, True, True, "header", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} tell me about the sea " + "and the sky " * 20)
    for n in range(2, 5):
        body = conv.body(f"and what happened on day {n}?")
        calls, nbytes, encoded = _counts(pd.prefill)
        decode_encoded = pd.decode.metric(ENCODED)
        reply = conv.turn(f"and what happened on day {n}?")
        assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
        stages = [float(reply.headers[h]) for h in ("x-pd-router-in-ms", "x-pd-prefill-ms", "x-pd-decode-ms")]
        assert all(ms >= 0 for ms in stages)  # the bench's stage split reads these
        # The prefill answered exactly one /tokenize, without token strings (as vLLM does unless asked) ...
        plain = httpx.post(f"{pd.prefill.url}/tokenize", json={"model": SERVED, "messages": body["messages"]})
        assert plain.json()["token_strs"] is None
        assert pd.prefill.metric(TOKENIZE) == calls + 2  # the router's and this test's
        assert pd.prefill.metric(TOKENIZE_BYTES) == nbytes + 2 * len(plain.content)
        # ... and its prefill request carried those ids: it encoded nothing; the decode rendered the chat itself.
        assert pd.prefill.metric(ENCODED) == encoded
        assert pd.decode.metric(ENCODED) > decode_encoded
    conv.messages[-2]["content"] = "an edited question"  # the router verifies whole blocks of 16, not chunks
    reply = conv.turn("and now?")
    assert reply.outcome == "partial" and reply.reason == "prefix_diverged", reply.reuse
    assert int(reply.reuse.split("tokens=")[1].split(";")[0]) % BLOCK == 0
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_prefill_without_the_check_reads_nothing_and_the_log_says_so_once(tmp_path: Path) -> None:
    with (sim_pair(tmp_path, speed=1000, block_size=BLOCK, prefill_args=["--no-prefix-check"]) as pd,
          router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as r):
        conv = Conversation(r.url, True, False, "body", uuid.uuid4().hex)
        conv.turn(f"{uuid.uuid4().hex} tell me about the sea " + "and the sky " * 20)
        for n in (2, 3):
            reply = conv.turn(f"and day {n}?")
            assert reply.status == 200 and reply.text
            assert reply.reuse == "miss;tokens=0;reason=prefill_unchecked"
        assert r.stats()["reuse_reasons"]["prefill_unchecked"] == 2
        warnings = [line.split("pdctl.router: ", 1)[-1] for line in r.log_text().splitlines() if "prefix check" in line]
        assert warnings == [
            f"prefill {pd.prefill_url} does not run pdctl's prefix check (its answer has no readable pdctl_reuse "
            "report): it reads nothing from the decodes, every warm turn through it is a miss (prefill_unchecked); "
            "re-provision it with pdctl (`pdctl up` patches vLLM) or set `router.verify_at: router`"]
        assert pd.prefill.metric("vllm:nixl_xfer_time_seconds_count") == 0  # nothing read from the decode
        assert corrupt(pd.prefill, pd.decode) == 0


def _ids_turn(client: httpx.Client, url: str, cid: str, prompt: list[int]) -> tuple[str, list[int]]:
    body: dict[str, Any] = {"model": SERVED, "prompt": prompt, "max_tokens": 8, "return_token_ids": True}
    r = client.post(f"{url}/v1/completions", json=body, headers={"X-Conversation-ID": cid})
    assert r.status_code == 200, r.text
    return r.headers["x-pd-kv-reuse"], r.json()["choices"][0]["token_ids"]


def test_token_id_turns_never_call_tokenize_and_still_verify(router: RouterProc, pd: SimPair) -> None:
    cid = uuid.uuid4().hex
    prompt = [1000 + i for i in range(80)]
    calls = pd.prefill.metric(TOKENIZE)
    with httpx.Client(timeout=30) as client:
        reuse, out = _ids_turn(client, router.url, cid, prompt)
        assert reuse.startswith("miss;")
        for n in range(3):
            prompt = [*prompt, *out, 2000 + n, 2001 + n]
            reuse, out = _ids_turn(client, router.url, cid, prompt)
            assert reuse.startswith("hit;") and reuse.endswith("reason=verified"), reuse
    assert pd.prefill.metric(TOKENIZE) == calls
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_repeated_conversation_id_never_reuses_another_conversations_kv(router: RouterProc, pd: SimPair) -> None:
    cid = uuid.uuid4().hex  # two clients that both call their conversation the same
    a = Conversation(router.url, True, False, "header", cid)
    b = Conversation(router.url, True, False, "header", cid)
    a.turn("conversation a " + "about apples " * 20)
    first_b = b.turn("conversation b " + "about boats " * 40)
    # A first turn (no assistant message) starts the id's conversation anew: a's handle is released, not read.
    assert (first_b.outcome, first_b.reason) == ("miss", "new_conversation"), first_b.reuse
    second_a = a.turn("more about apples " * 40)
    assert (second_a.outcome, second_a.reason) == ("miss", "prefix_diverged"), second_a.reuse
    with httpx.Client(timeout=30) as client:  # the same with token ids, where no /tokenize runs at all
        ids_cid = uuid.uuid4().hex
        _, out = _ids_turn(client, router.url, ids_cid, [3000 + i for i in range(64)])
        reuse, _ = _ids_turn(client, router.url, ids_cid, [4000 + i for i in range(64 + len(out) + 2)])
        assert reuse.startswith("miss;") and reuse.endswith("reason=prefix_diverged"), reuse
    assert corrupt(pd.prefill, pd.decode) == 0


def test_only_text_chats_go_to_the_prefill_as_ids() -> None:
    ids = array("i", [5, 6, 7])
    text = {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "cache_salt": "s", "tools": [], "stream": True}
    path, payload = prefill_request("/v1/chat/completions", text, {"do_remote_decode": True}, ids)
    assert path == "/v1/completions"
    assert payload == (b'{"model":"Qwen","cache_salt":"s","prompt":[5,6,7],"stream":false,"max_tokens":1,'
                       b'"kv_transfer_params":{"do_remote_decode":true}}')
    image = {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert prefill_request("/v1/chat/completions", image, {}, ids)[0] == "/v1/chat/completions"
    assert prefill_request("/v1/completions", {"prompt": [5, 6, 7]}, {}, ids)[0] == "/v1/completions"
