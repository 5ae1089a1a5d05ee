"""The warm turn's tokenizer work: one /tokenize without token strings for chat, none for token ids, and the
prefill computes the verified ids instead of rendering the history again. Every reuse stays verified."""

from __future__ import annotations

import uuid
from array import array
from typing import Any

import httpx

from pdctl.router.prefill import prefill_request
from tests.router.conftest import RouterProc, corrupt
from tests.router.talk import Conversation
from tests.support.sim_procs import SERVED, SimPair, SimProc

TOKENIZE = "pdctl_sim_tokenize_requests_total"
TOKENIZE_BYTES = "pdctl_sim_tokenize_response_bytes_total"
ENCODED = "pdctl_sim_encoded_prompt_tokens_total"


def _counts(sim: SimProc) -> tuple[float, float, float]:
    return sim.metric(TOKENIZE), sim.metric(TOKENIZE_BYTES), sim.metric(ENCODED)


def test_a_warm_chat_turn_tokenizes_once_and_the_prefill_computes_the_verified_ids(
        router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, True, True, "header", uuid.uuid4().hex)
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
    assert (first_b.outcome, first_b.reason) == ("miss", "prefix_diverged"), first_b.reuse
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
