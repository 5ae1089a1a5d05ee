"""POST /v1/messages through the router, driven by the official anthropic SDK on simulator engines."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.router.agents import ANTHROPIC_TOOLS, FIRST, assert_anthropic_error, assert_loop_reused, outcome
from tests.router.conftest import AGENT_KEY, RouterProc, assert_clean
from tests.router.instant import Instant, sse_data
from tests.support.sim_procs import SERVED, SimPair


def client(router: RouterProc, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=router.url, api_key=key, max_retries=0)


def next_turn(message: Any) -> list[dict[str, Any]]:
    """The assistant turn as the agent sends it back, then the tool's result or the next question."""
    turn = [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}]
    if message.stop_reason == "tool_use":
        use = next(b for b in message.content if b.type == "tool_use")
        result = {"type": "tool_result", "tool_use_id": use.id, "content": f"found {use.input['query']}"}
        return [*turn, {"role": "user", "content": [result]}]
    return [*turn, {"role": "user", "content": "and the next one w21 w22"}]


def test_agent_loop_with_tool_use_reuses_every_turn(agent_router: RouterProc, pd: SimPair) -> None:
    c = client(agent_router, AGENT_KEY)  # the SDK sends the key as x-api-key, with anthropic-version
    auth = {"Authorization": f"Bearer {AGENT_KEY}"}
    hits = agent_router.stats(**auth)["reuse"]["hit"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST}]
    outcomes, stops = [], []
    for turn in range(5):
        if turn % 2:
            with c.messages.stream(model=SERVED, max_tokens=64, system="You are terse.", tools=ANTHROPIC_TOOLS,
                                   messages=messages) as s:  # type: ignore[arg-type]
                outcomes.append(outcome(s.response.headers))
                kinds = [e.type for e in s]
                message = s.get_final_message()
            assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        else:
            raw = c.messages.with_raw_response.create(model=SERVED, max_tokens=64, system="You are terse.",
                                                      tools=ANTHROPIC_TOOLS, messages=messages)  # type: ignore[arg-type]
            message = raw.parse()
            assert_clean(raw.http_response.content, raw.headers)
            outcomes.append(outcome(raw.headers))
        stops.append(message.stop_reason)
        messages += next_turn(message)
    assert stops == ["tool_use", "max_tokens", "tool_use", "max_tokens", "tool_use"]  # the sim fills max_tokens
    assert_loop_reused(outcomes, agent_router, pd, hits, auth)


def test_stream_helper_builds_the_message(router: RouterProc) -> None:
    with client(router).messages.stream(model=SERVED, max_tokens=64, tools=ANTHROPIC_TOOLS,
                                        messages=[{"role": "user", "content": FIRST}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert set(final.content[0].input) == {"query"}
    assert "input_json" in kinds and kinds[-1] == "message_stop"


def test_raw_stream_carries_nothing_internal(router: RouterProc) -> None:
    body = {"model": SERVED, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": FIRST}]}
    with httpx.stream("POST", router.url + "/v1/messages", json=body, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200
    assert_clean(raw, r.headers)
    assert raw.startswith(b"event: message_start\ndata: ")


def test_thinking_blocks_round_trip(router: RouterProc) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "think w1"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                          {"type": "text", "text": "w2"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    m = client(router).messages.create(model=SERVED, max_tokens=4, messages=msgs,  # type: ignore[arg-type]
                                       thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 4


BAD = [
    ({"messages": [{"role": "user", "content": "x"}]}, "`max_tokens` is required and must be an integer >= 1"),
    ({"max_tokens": 4, "messages": []}, "`messages` must be a non-empty list"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": 5}]},
     "messages[0].content must be a string or a list of content blocks"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0]: a user message cannot hold a block of type 'video' (text, image, tool_result)"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
     "messages[0].content[0]: tool_result for tool_use_id 't1', but no tool_use with that id precedes it"),
    ({"max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}]},
     "messages[0].content[0]: a tool_use block needs a string id and name and an object input"),
    ({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]},
     "messages[0].role must be user or assistant, got 'tool'"),
    ({"max_tokens": 4, "system": 5, "messages": [{"role": "user", "content": "x"}]},
     "`system` must be a string or a list of text blocks"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_requests_are_400_in_anthropic_shape(router: RouterProc, body: dict[str, Any], message: str) -> None:
    r = httpx.post(router.url + "/v1/messages", json={"model": SERVED, **body}, timeout=10)
    assert_anthropic_error(r, 400, "invalid_request_error", message)
    assert httpx.get(router.url + "/health", timeout=5).status_code == 200


def test_router_and_engine_errors_are_in_anthropic_shape(router: RouterProc, agent_router: RouterProc) -> None:
    r = httpx.post(router.url + "/v1/messages", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["message"].startswith("request body is not valid JSON")
    r = httpx.post(router.url + "/v1/messages", json={"model": "no-such-model", "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert_anthropic_error(r, 404, "not_found_error", "The model `no-such-model` does not exist.")
    r = httpx.post(agent_router.url + "/v1/messages", json={"model": SERVED}, timeout=10)
    assert_anthropic_error(r, 401, "authentication_error", "missing or invalid API key: send `Authorization: "
                           "Bearer <key>` (or `x-api-key: <key>`)")
    r = httpx.post(agent_router.url + "/v1/messages", headers={"x-api-key": AGENT_KEY}, timeout=10,
                   json={"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": "w " * 10000}]})
    assert_anthropic_error(r, 413, "request_too_large",
                           "request body over the router's limit of 20000 bytes (--max-body-bytes)")
    with pytest.raises(anthropic.AuthenticationError):
        client(agent_router, "wrong").messages.create(model=SERVED, max_tokens=4,
                                                      messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_sent_the_instant_the_last_message_ended_reuses_its_kv(late: RouterProc, stream: bool) -> None:
    client = Instant(late.url)
    messages: list[dict[str, Any]] = []
    reuse = []
    try:
        for turn in range(6):
            body = {"model": SERVED, "max_tokens": 6, "stream": stream,
                    "messages": [*messages, {"role": "user", "content": f"{FIRST} w{turn}"}]}
            headers, raw = client.post("/v1/messages", body, b"event: message_stop")
            reuse.append(outcome(headers))
            if stream:
                text = "".join(e["delta"].get("text", "") for e in sse_data(raw) if e["type"] == "content_block_delta")
            else:
                text = "".join(b["text"] for b in json.loads(raw)["content"] if b["type"] == "text")
            messages = [*body["messages"], {"role": "assistant", "content": text}]
    finally:
        client.close()
    assert reuse == ["miss"] + ["hit"] * 5
