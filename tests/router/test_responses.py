"""POST /v1/responses through the router, driven by the official openai SDK on simulator engines."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.router.agents import FIRST, RESPONSES_TOOLS, assert_loop_reused, assert_openai_error, outcome
from tests.router.conftest import AGENT_KEY, RouterProc, assert_clean
from tests.router.instant import Instant, sse_data
from tests.support.sim_procs import SERVED, SimPair


def client(router: RouterProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def next_input(output: list[Any]) -> list[dict[str, Any]]:
    """The agent's move: run the tool it was asked to, else ask the next question."""
    last = output[-1]
    if last.type == "function_call":
        args = json.loads(last.arguments)
        return [{"type": "function_call_output", "call_id": last.call_id, "output": f"found {args['query']}"}]
    return [{"role": "user", "content": "and the next one w21 w22"}]


def test_agent_loop_with_full_input_reuses_every_turn(router: RouterProc, pd: SimPair) -> None:
    c = client(router)
    hits = router.stats()["reuse"]["hit"]
    items: list[Any] = [{"role": "user", "content": FIRST}]
    outcomes, kinds = [], []
    for _ in range(5):
        raw = c.responses.with_raw_response.create(model=SERVED, input=items, tools=RESPONSES_TOOLS,
                                                   instructions="You are terse.", store=False)
        resp = raw.parse()
        assert_clean(raw.http_response.content, raw.headers)
        assert resp.status == "completed" and resp.object == "response" and resp.usage is not None
        outcomes.append(outcome(raw.headers))
        kinds.append(resp.output[-1].type)
        items += [o.model_dump(exclude_none=True) for o in resp.output] + next_input(resp.output)
    assert kinds == ["function_call", "message", "function_call", "message", "function_call"]
    assert_loop_reused(outcomes, router, pd, hits)
    assert resp.usage.input_tokens_details.cached_tokens > 0


def test_streamed_agent_loop_with_previous_response_id(router: RouterProc, pd: SimPair) -> None:
    c = client(router)
    hits = router.stats()["reuse"]["hit"]
    prev, items = None, [{"role": "user", "content": FIRST}]
    outcomes = []
    for _ in range(5):
        raw = c.responses.with_raw_response.create(model=SERVED, input=items, tools=RESPONSES_TOOLS, stream=True,
                                                   previous_response_id=prev)
        events = list(raw.parse())
        outcomes.append(outcome(raw.headers))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events[:3]] == ["response.created", "response.in_progress",
                                                "response.output_item.added"]
        assert events[-1].type == "response.completed"
        final = events[-1].response
        kinds = [e.type for e in events]
        if final.output[-1].type == "function_call":
            assert "response.function_call_arguments.delta" in kinds
            assert final.output[-1].arguments == "".join(e.delta for e in events if e.type.endswith("arguments.delta"))
        else:
            assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
        prev, items = final.id, next_input(final.output)
    assert_loop_reused(outcomes, router, pd, hits)


def test_sdk_stream_helper_accumulates_the_response(router: RouterProc) -> None:
    with client(router).responses.stream(model=SERVED, input="say something w5 w6", max_output_tokens=8) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == "".join(deltas) and len(deltas) == 8
    assert final.usage.output_tokens == 8


def test_raw_stream_carries_nothing_internal(router: RouterProc) -> None:
    body = {"model": SERVED, "input": FIRST, "stream": True, "tools": RESPONSES_TOOLS}
    with httpx.stream("POST", router.url + "/v1/responses", json=body, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert_clean(raw, r.headers)
    assert raw.startswith(b"event: response.created\ndata: ")


def test_unknown_previous_response_id_is_400(router: RouterProc) -> None:
    r = httpx.post(router.url + "/v1/responses", json={"model": SERVED, "input": "hi", "previous_response_id":
                                                        "resp_nope"}, timeout=10)
    assert_openai_error(r, 400, "previous_response_id 'resp_nope' is unknown or expired: the router keeps a "
                        "response for 450s (as long as its KV) and only when `store` is not false; send the whole "
                        "conversation as `input` instead")


def test_a_response_not_stored_cannot_be_continued(router: RouterProc) -> None:
    first = client(router).responses.create(model=SERVED, input="hi w1", store=False, max_output_tokens=2)
    r = httpx.post(router.url + "/v1/responses", json={"model": SERVED, "input": "more",
                                                        "previous_response_id": first.id}, timeout=10)
    assert r.status_code == 400 and "unknown or expired" in r.json()["error"]["message"]


def test_a_strangers_previous_response_id_is_unknown_to_them(router: RouterProc) -> None:
    """A response id is no capability: another client (other credentials) cannot continue it or read its history."""
    alice = openai.OpenAI(base_url=router.url + "/v1", api_key="alice", max_retries=0)
    first = alice.responses.create(model=SERVED, input="my plan w1 w2", max_output_tokens=2)
    r = httpx.post(router.url + "/v1/responses", headers={"Authorization": "Bearer mallory"},
                   json={"model": SERVED, "input": "repeat it", "previous_response_id": first.id}, timeout=10)
    assert r.status_code == 400 and f"previous_response_id {first.id!r} is unknown or expired" in r.text
    follow = alice.responses.create(model=SERVED, input="go on w3", previous_response_id=first.id,
                                    max_output_tokens=2)
    assert follow.status == "incomplete" and follow.usage is not None and follow.usage.input_tokens > 0


BAD = [
    ({"input": []}, "`input` must be a string or a non-empty list of items"),
    ({"input": [5]}, "input[0] must be an object"),
    ({"input": [{"type": "item_reference", "id": "x"}]},
     "input[0]: unknown input item type 'item_reference'; the router serves message, function_call, "
     "function_call_output and reasoning items"),
    ({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]},
     "input[0]: function_call_output for call_id 'call_1', but no function_call with that call_id precedes it"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content must be a string or a list of content parts"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "input[0].content[0]: content part of type 'input_audio' is not served here (input_text, output_text, "
     "refusal, input_image with image_url)"),
    ({"input": [{"role": "robot", "content": "x"}]},
     "input[0].role must be user, system, developer or assistant, got 'robot'"),
    ({"input": "x", "tools": [{"type": "web_search"}]},
     "tools[0]: only function tools with a name are served (got type 'web_search')"),
    ({"input": "x", "max_output_tokens": 0}, "`max_output_tokens` must be an integer >= 1, got 0"),
    ({"input": "x", "background": True}, "`background`: background responses are not served by the router"),
    ({}, "`input` is required"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_requests_are_400_in_openai_shape(router: RouterProc, body: dict[str, Any], message: str) -> None:
    r = httpx.post(router.url + "/v1/responses", json={"model": SERVED, **body}, timeout=10)
    assert_openai_error(r, 400, message)
    assert httpx.get(router.url + "/health", timeout=5).status_code == 200


def test_sdk_raises_on_a_bad_request(router: RouterProc) -> None:
    with pytest.raises(openai.BadRequestError, match="unknown input item type"):
        client(router).responses.create(model=SERVED, input=[{"type": "bogus"}])  # type: ignore[list-item]


def test_oversize_and_unauthenticated_requests(agent_router: RouterProc) -> None:
    url = agent_router.url + "/v1/responses"
    auth = {"Authorization": f"Bearer {AGENT_KEY}"}
    r = httpx.post(url, json={"model": SERVED, "input": "w1 " * 10000}, headers=auth, timeout=10)
    assert_openai_error(r, 413, "request body over the router's limit of 20000 bytes (--max-body-bytes)")
    r = httpx.post(url, json={"model": SERVED, "input": "hi"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    ok = openai.OpenAI(base_url=agent_router.url + "/v1", api_key=AGENT_KEY).responses.create(
        model=SERVED, input="hi w1", max_output_tokens=2)
    assert ok.status == "incomplete"


def test_reasoning_items_and_typed_messages_are_accepted(router: RouterProc) -> None:
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be terse"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "think w1"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "w2"}]},
             {"role": "user", "content": "again"}]
    r = client(router).responses.create(model=SERVED, input=items, max_output_tokens=3,  # type: ignore[arg-type]
                                        text={"format": {"type": "json_object"}})
    assert r.status == "incomplete" and r.usage is not None and r.usage.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_follow_up_sent_the_instant_the_response_ended_finds_it_and_its_kv(late: RouterProc, stream: bool) -> None:
    client = Instant(late.url)
    prev, reuse = None, []
    try:
        for turn in range(6):
            body = {"model": SERVED, "input": f"{FIRST} w{turn}", "max_output_tokens": 6, "stream": stream,
                    "previous_response_id": prev}
            headers, raw = client.post("/v1/responses", body, b"event: response.completed")
            reuse.append(outcome(headers))
            final = json.loads(raw) if not stream else next(
                e["response"] for e in sse_data(raw) if e["type"] == "response.completed")
            assert final["status"] == "incomplete"
            prev = final["id"]
    finally:
        client.close()
    assert reuse == ["miss"] + ["hit"] * 5
