"""The router's aggregated mode on two real simulated engines (no KV connector): whole requests, conversation
affinity, new conversations by load, an engine killed. Which engine served a request is read at the engines'
own /metrics (the tokens each generated)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.router.conftest import RouterProc, assert_clean, router_process
from tests.router.faults import kill
from tests.support.sim_procs import SERVED, SimProc, sim_process

SPEED = 10  # slow enough that a long answer keeps its engine busy while the test sends another request


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimProc, SimProc]]:
    logs = tmp_path_factory.mktemp("agg")
    with (sim_process(logs, "decode", name="agg-0", speed=SPEED, connector=False) as a,
          sim_process(logs, "decode", name="agg-1", speed=SPEED, connector=False) as b):
        yield a, b


@pytest.fixture(scope="module")
def agg_router(engines: tuple[SimProc, SimProc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("agg-router"), [], [e.url for e in engines],
                        "--mode", "aggregated", name="agg-router") as r:
        yield r


def assert_passed_through(raw: bytes, headers: httpx.Headers) -> None:
    """The engine's answer as it sent it, which holds no handle (vLLM's `"kv_transfer_params":null` without a
    connector), and nothing of the engine plane."""
    assert_clean(re.sub(rb'"(kv_transfer_params|prompt_token_ids|token_ids)":null', b"", raw), headers)


def generated(engines: tuple[SimProc, ...], metric: str = "vllm:generation_tokens_total") -> list[float]:
    return [e.metric(metric) for e in engines]


def served_by(engines: tuple[SimProc, ...], before: list[float], metric: str = "vllm:generation_tokens_total") -> int:
    """The one engine whose `metric` grew since `before` (by default: that generated tokens)."""
    grew = [i for i, (b, a) in enumerate(zip(before, generated(engines, metric), strict=True)) if a > b]
    assert len(grew) == 1, grew
    return grew[0]


def chat_client(router: RouterProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def test_a_conversations_turns_stay_on_its_engine_and_new_ones_alternate(
        agg_router: RouterProc, engines: tuple[SimProc, SimProc]) -> None:
    c = chat_client(agg_router)
    where: dict[str, list[int]] = {}
    hits = [e.metric("vllm:prefix_cache_hits_total") for e in engines]
    for n in range(4):
        cid = f"conv-{n}-{uuid.uuid4().hex[:6]}"
        messages: list[Any] = [{"role": "user", "content": f"conversation {n}: " + "w1 w2 w3 " * 40}]
        for turn in range(3):
            before = generated(engines)
            stream = c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3, stream=True,
                                               extra_headers={"X-Session-ID": cid})
            reply = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
            where.setdefault(cid, []).append(served_by(engines, before))
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"turn {turn} w4"}]
    assert all(len(set(turns)) == 1 for turns in where.values()), where
    assert sorted(turns[0] for turns in where.values()) == [0, 0, 1, 1]  # idle engines share new conversations
    # turns 2 and 3 found their history in that engine's prefix cache
    assert all(e.metric("vllm:prefix_cache_hits_total") > h for e, h in zip(engines, hits, strict=True))


def test_a_derived_conversation_follows_its_engine_without_an_id(
        agg_router: RouterProc, engines: tuple[SimProc, SimProc]) -> None:
    """No id at all: the router knows turn 2 by its history (the messages and the reply it passed back)."""
    with httpx.Client(timeout=30) as http:
        for stream in (False, True):
            messages: list[Any] = [{"role": "user", "content": f"derived {uuid.uuid4().hex} " + "w5 w6 " * 30}]
            served = []
            for _ in range(3):
                before = generated(engines)
                body = {"model": SERVED, "messages": messages, "max_tokens": 4, "stream": stream}
                r = http.post(agg_router.url + "/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                assert_passed_through(r.content, r.headers)
                served.append(served_by(engines, before))
                text = "".join(_deltas(r.text)) if stream else r.json()["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more w7"}]
            assert len(set(served)) == 1, (stream, served)


def _deltas(sse: str) -> list[str]:
    out = []
    for line in sse.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or "")
    return out


def test_a_new_conversation_goes_to_the_engine_with_less_in_flight(
        agg_router: RouterProc, engines: tuple[SimProc, SimProc]) -> None:
    with httpx.Client(timeout=60) as http:
        long = {"model": SERVED, "prompt": "a long answer w8", "max_tokens": 4000, "stream": True,
                "ignore_eos": True}
        queried = generated(engines, "vllm:prefix_cache_queries_total")
        with http.stream("POST", agg_router.url + "/v1/completions", json=long) as held:
            assert held.status_code == 200
            chunks = held.iter_raw()  # kept: a dropped iterator closes the response
            next(chunks)  # the answer is under way: its engine has one request in flight
            busy = served_by(engines, queried, "vllm:prefix_cache_queries_total")  # counted as it starts
            for _ in range(3):
                mark = generated(engines)
                r = http.post(agg_router.url + "/v1/completions",
                              json={"model": SERVED, "prompt": f"new {uuid.uuid4().hex}", "max_tokens": 2})
                assert r.status_code == 200, r.text
                after = generated(engines)
                assert after[1 - busy] > mark[1 - busy], (busy, mark, after)


def test_messages_and_responses_are_served_whole(agg_router: RouterProc, engines: tuple[SimProc, SimProc]) -> None:
    a = anthropic.Anthropic(base_url=agg_router.url, api_key="unused", max_retries=0)
    msg = a.messages.create(model=SERVED, max_tokens=4, messages=[{"role": "user", "content": "hello w9"}])
    assert msg.type == "message" and msg.stop_reason in ("max_tokens", "end_turn") and msg.content
    resp = chat_client(agg_router).responses.create(model=SERVED, input="hello w10", max_output_tokens=4)
    assert resp.status in ("completed", "incomplete") and resp.output
    # the agent APIs' follow-ups keep their engine too
    cid = uuid.uuid4().hex
    served = []
    prev = None
    for _ in range(3):
        before = generated(engines)
        resp = chat_client(agg_router).responses.create(model=SERVED, input="go on w11 " * 20, max_output_tokens=4,
                                                        previous_response_id=prev,
                                                        extra_headers={"X-Session-ID": cid})
        prev = resp.id
        served.append(served_by(engines, before))
    assert len(set(served)) == 1, served


def test_health_and_bad_requests_in_the_router_shapes(agg_router: RouterProc) -> None:
    health = httpx.get(agg_router.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["decode"] == {"healthy": 2, "total": 2} and "prefill" not in health
    r = httpx.post(agg_router.url + "/v1/completions", json={"model": SERVED, "prompt": "w1", "max_tokens": 10**6},
                   timeout=10)
    assert r.status_code == 400, r.text  # the engine's refusal, in the router's one error shape
    assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "code"}, r.text
    assert r.json()["error"]["code"] == 400 and "127.0.0.1" not in r.text, r.text


def test_an_engine_killed_sends_its_conversations_to_the_other(tmp_path: Path) -> None:
    with (sim_process(tmp_path, "decode", name="kill-0", speed=SPEED, connector=False) as a,
          sim_process(tmp_path, "decode", name="kill-1", speed=SPEED, connector=False) as b,
          router_process(tmp_path, [], [a.url, b.url], "--mode", "aggregated") as router):
        pair = (a, b)
        c = chat_client(router)
        cid = uuid.uuid4().hex
        messages: list[Any] = [{"role": "user", "content": "before the kill w12"}]
        before = generated(pair)
        first = c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3,
                                          extra_headers={"X-Session-ID": cid})
        home = served_by(pair, before)
        long = {"model": SERVED, "messages": messages, "max_tokens": 4000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=long, timeout=60,
                          headers={"X-Session-ID": cid, "Authorization": "Bearer unused"}) as held:  # the SDK's owner
            chunks = held.iter_raw()
            got = next(chunks)  # the conversation's engine is streaming: it dies mid-stream
            kill(pair[home])
            got += b"".join(chunks)
        assert got.endswith(b'data: {"error":{"message":"the engine failed mid-stream","type":"upstream_error",'
                            b'"code":502}}\n\ndata: [DONE]\n\n'), got[-300:]
        other = pair[1 - home]
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "after the kill"}]
        for stream in (False, True, False):
            mark = other.metric("vllm:generation_tokens_total")
            if stream:
                chunks = list(c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3, stream=True,
                                                        extra_headers={"X-Session-ID": cid}))
                assert chunks
            else:
                assert c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3,
                                                 extra_headers={"X-Session-ID": cid}).choices
            assert other.metric("vllm:generation_tokens_total") > mark
        other.stop()
        with pytest.raises(openai.APIStatusError) as err:  # still in the pool: both refuse the connection
            c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3)
        assert err.value.status_code == 502
        assert err.value.response.json() == {"error": {"message": "no engine could be reached",
                                                       "type": "upstream_error", "code": 502}}
        deadline = time.monotonic() + 30
        while httpx.get(router.url + "/health", timeout=5).status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(openai.APIStatusError) as err:  # ejected by the health checks
            c.chat.completions.create(model=SERVED, messages=messages, max_tokens=3)
        assert err.value.status_code == 503
        assert err.value.response.json() == {"error": {"message": "no healthy engine (0 of 2 healthy)",
                                                       "type": "service_unavailable", "code": 503}}
        assert httpx.get(router.url + "/health", timeout=5).json()["reason"] == "no healthy engine"


def test_a_prompt_list_and_n_samples_are_served_as_in_p_d_mode(agg_router: RouterProc,
                                                                engines: tuple[SimProc, SimProc]) -> None:
    """A list of prompts is one turn per prompt (each its own conversation), n > 1 one request to one engine."""
    before = generated(engines)
    r = httpx.post(agg_router.url + "/v1/completions", timeout=30,
                   json={"model": SERVED, "prompt": ["first w13", "second w14"], "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert sum(generated(engines)) - sum(before) == 4
    before = generated(engines)
    r = httpx.post(agg_router.url + "/v1/completions", timeout=30,
                   json={"model": SERVED, "prompt": "sampled w15", "max_tokens": 2, "n": 2})
    assert r.status_code == 200, r.text
    assert sorted(c["index"] for c in r.json()["choices"]) == [0, 1]
    served_by(engines, before)
    assert_passed_through(r.content, r.headers)
